"""A scenario's raw YAML mapping, before validation: reading a mapping file, merging one over
another (``extends:``, with its rule for acceptance sources; the chain of files itself is
:func:`wansim.config.scenario.read_scenario_raw`), relative file fields anchored to the file
that names them, dotted field paths, resolving file names, and dataclasses back to the plain
YAML shape."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wansim.config.user_yaml import read_yaml_file
from wansim.data import exists, is_file, on_disk_or_shipped, shipped
from wansim.errors import ScenarioError, WansimInputError

ACCEPTANCE_SOURCES = ("profile", "alpha", "per_position")


def merge_scenarios(base: Mapping, top: Mapping) -> dict:
    """``top`` deep-merged over ``base``, with the acceptance rule of :func:`merge_acceptance`."""
    merged = deep_merge(base, top)
    top_acc = nested(top, "drafter", "acceptance")
    base_acc = nested(base, "drafter", "acceptance")
    if isinstance(top_acc, Mapping) and isinstance(base_acc, Mapping):
        merged["drafter"]["acceptance"] = merge_acceptance(base_acc, top_acc)
    return merged


def merge_acceptance(base: Mapping, top: Mapping) -> dict:
    """An acceptance mapping over an inherited one. When ``top`` names a source (``profile``,
    ``alpha`` or ``per_position``), it replaces the inherited source: the other sources are
    dropped, and so is the profile's ``workload`` unless the new source is a profile. Other
    keys (domain_shift, dispersion, extrapolate, ...) merge as usual."""
    new = [k for k in ACCEPTANCE_SOURCES if top.get(k) is not None]
    if new:
        drop = set(ACCEPTANCE_SOURCES) - set(new)
        if "profile" not in new:
            drop.add("workload")
        base = {k: v for k, v in base.items() if k not in drop}
    return deep_merge(base, top)


def nested(raw: Any, *keys: str) -> Any:
    """``raw[k1][k2]...``, or None where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(raw, Mapping):
            return None
        raw = raw.get(key)
    return raw


# file-valued fields: (path to the mapping, key)
_FILE_FIELDS = (
    (("drafter", "acceptance"), "profile"),
    (("workload",), "trace"),
    (("drafter", "acceptance"), "activation_quality"),
    (("network", "jitter"), "samples_file"),
    (("network",), "trace_file"),
)


def anchor_files(raw: dict, folder: Path) -> dict:
    """Relative file fields that exist next to the file that names them -> absolute paths (so
    a scenario extending this one from elsewhere still finds them)."""

    def anchor(mapping: Any, key: str) -> None:
        value = mapping.get(key) if isinstance(mapping, dict) else None
        if isinstance(value, str) and value and not Path(value).is_absolute():
            candidate = folder / value
            if is_file(candidate):
                mapping[key] = str(candidate.resolve())

    for where, key in _FILE_FIELDS:
        anchor(nested(raw, *where), key)
    hops = nested(raw, "network", "hops")
    if isinstance(hops, list):
        for hop in hops:
            anchor(nested(hop, "jitter"), "samples_file")
    return raw


def deep_merge(base: Mapping, top: Mapping) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml_mapping(path: str | os.PathLike, what: str) -> dict | None:
    """The file's YAML mapping, read within the limits of :mod:`wansim.config.user_yaml` (UTF-8,
    depth, alias expansion); None for an empty file (each caller decides what that means).
    A missing relative path that names a shipped file (``scenarios/...``) reads that file."""
    p = on_disk_or_shipped(path)
    if not is_file(p):
        raise WansimInputError(what, "file not found", str(path))
    raw = read_yaml_file(p, what)
    if raw is not None and not isinstance(raw, dict):
        raise WansimInputError(what, "must be a YAML mapping", str(path))
    return raw


MAX_NESTING = 32  # levels of mappings/lists in a scenario (the schema needs 5)
_LEAVES = frozenset({str, int, float, bool, type(None)})  # neither containers nor dataclasses


def to_plain(obj: Any) -> Any:
    """Dataclasses/tuples -> plain dicts/lists (the YAML shape). Raises a one-line error for
    data nested more than :data:`MAX_NESTING` deep (or containing itself)."""
    trail: list[str | int] = []  # the path to the current value (joined only for the error)

    def plain(obj: Any) -> Any:
        if type(obj) in _LEAVES:  # the common case, without the checks below
            return obj
        if len(trail) > MAX_NESTING:
            raise ScenarioError(
                join_path(trail[:4]) + "...",
                f"nested more than {MAX_NESTING} deep (or contains itself)",
            )
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        if isinstance(obj, Mapping):
            out = {}
            for k, v in obj.items():
                trail.append(str(k))
                out[k] = plain(v)
                trail.pop()
            return out
        if isinstance(obj, (list, tuple)):
            out_list = []
            for i, v in enumerate(obj):
                trail.append(i)
                out_list.append(plain(v))
                trail.pop()
            return out_list
        return obj

    return plain(obj)


_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def split_path(dotted: str) -> list[str | int]:
    """'network.hops[3].latency_ms' -> ['network', 'hops', 3, 'latency_ms'] (also hops.3)."""
    parts: list[str | int] = []
    for seg in dotted.split("."):
        if seg.isdigit():
            parts.append(int(seg))
            continue
        m = _SEGMENT.match(seg)
        if not m:
            raise ScenarioError("--set", "bad field path", dotted)
        parts.append(m.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    return parts


def join_path(parts: list[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def get_dotted(obj: Any, dotted: str) -> Any:
    """Read a dotted field from a scenario (dataclasses) or a raw mapping."""
    node = obj
    for part in split_path(dotted):
        if isinstance(part, int) or isinstance(node, Mapping):
            node = node[part]
        else:
            node = getattr(node, part)
    return node


def resolve_file(value: str, base_dir: Path, *, search_cwd: bool = True) -> Path | None:
    p = Path(value)
    if p.is_absolute():
        return p if exists(p) else None
    candidates = [base_dir / p] + ([Path.cwd() / p] if search_cwd else [])
    candidates += [d / p for d in base_dir.parents]
    for c in candidates:
        if exists(c):
            return c.resolve()
    return shipped(p)  # a shipped name (traces/reference/..., scenarios/...) from anywhere
