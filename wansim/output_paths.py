"""Output paths checked before a run starts: an unwritable ``--out`` or ``--perfetto`` is bad
input (exit 2, one line naming the flag, the path and why), found before minutes of work, not
a traceback after them."""

from __future__ import annotations

import os
from pathlib import Path

from wansim.errors import WansimInputError


def writable_dir(path: str | os.PathLike, flag: str) -> Path:
    """Create ``path`` (and parents) if needed; raise unless it is a writable folder."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise WansimInputError(flag, "is a file, not a folder", str(path)) from None
    except OSError as exc:
        raise WansimInputError(flag, f"cannot create the folder ({_why(exc)})", str(path)) from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise WansimInputError(flag, "cannot write in the folder (permission denied)", str(path))
    return p


def writable_file(path: str | os.PathLike, flag: str) -> Path:
    """Make sure ``path`` can be written (its folder created if needed) without leaving a new
    file behind; raise otherwise."""
    p = Path(path)
    if p.is_dir():
        raise WansimInputError(flag, "is a folder, not a file", str(path))
    writable_dir(p.parent if str(p.parent) else Path("."), flag)
    existed = p.exists()
    try:
        with open(p, "a"):
            pass
    except OSError as exc:
        raise WansimInputError(flag, f"cannot write the file ({_why(exc)})", str(path)) from None
    if not existed:
        p.unlink(missing_ok=True)
    return p


def _why(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()
