"""Data shipped inside the package (found through ``importlib.resources``, so a wheel installed
anywhere has it): the reference scenarios (``scenarios/*.yaml``) and the reconstructed reference
acceptance profile (``traces/reference/dspark-v4pro.yaml``). In a source checkout the top-level
``scenarios/`` and ``traces/reference/`` entries are links to these files.

Relative paths in scenarios that name these files (``traces/reference/dspark-v4pro.yaml``,
``scenarios/v4pro-dspark-10stage-wan.yaml``) fall back to the shipped copy when nothing on disk
matches, so they work from any directory. The tiny torch models (``models/``, ~6 MB, and torch
itself) are not shipped: :func:`models_dir` finds a checkout's ``models/`` from the working
directory upwards, or ``WANSIM_MODELS``.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

REFERENCE_PROFILE_NAME = "traces/reference/dspark-v4pro.yaml"
REFERENCE_SCENARIO_NAME = "scenarios/v4pro-dspark-10stage-wan.yaml"


def shipped(relative: str | os.PathLike) -> Path | None:
    """The shipped file at ``relative`` (e.g. ``scenarios/x.yaml``, also ``./scenarios/x.yaml``),
    or None when the package has no such file."""
    parts = [p for p in Path(relative).parts if p not in (".", "")]
    if not parts or ".." in parts or Path(relative).is_absolute():
        return None
    node = Path(str(resources.files(__name__).joinpath(*parts)))
    try:
        return node if node.is_file() else None
    except OSError:  # e.g. a name too long for the file system: no such file
        return None


def exists(path: str | os.PathLike) -> bool:
    """Whether ``path`` exists; False where the file system cannot even look it up (a name
    too long, on Python 3.11, raises from ``Path.exists``): an input file is then reported
    missing with its field, as any other."""
    try:
        return Path(path).exists()
    except OSError:
        return False


def is_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file (False where it cannot be looked up, as :func:`exists`)."""
    try:
        return Path(path).is_file()
    except OSError:
        return False


def is_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder (False where it cannot be looked up, as :func:`exists`)."""
    try:
        return Path(path).is_dir()
    except OSError:
        return False


def on_disk_or_shipped(path: str | os.PathLike) -> Path:
    """``path`` if it exists, else the shipped file of that relative name, else ``path`` (the
    caller reports it missing)."""
    p = Path(path)
    if exists(p):
        return p
    return shipped(p) or p


def reference_profile() -> Path:
    """The reconstructed DSpark / DeepSeek-V4-Pro acceptance profile."""
    path = shipped(REFERENCE_PROFILE_NAME)
    assert path is not None, "wansim was installed without its data (wansim/data)"
    return path


def reference_scenario() -> Path:
    """The reference scenario (10 stages over WAN, DSpark K = 7)."""
    path = shipped(REFERENCE_SCENARIO_NAME)
    assert path is not None, "wansim was installed without its data (wansim/data)"
    return path


def models_dir(name: str | None = None) -> Path | None:
    """``$WANSIM_MODELS`` or the first ``models/`` folder from the working directory upwards
    (a source checkout's tiny torch models), joined with ``name``; None when there is none."""
    env = os.environ.get("WANSIM_MODELS")
    candidates = [Path(env)] if env else []
    here = Path.cwd()
    candidates += [d / "models" for d in (here, *here.parents)]
    for folder in candidates:
        if folder.is_dir():
            return folder / name if name else folder
    return None
