"""Acceptance profiles: a drafter on a target, per workload (DESIGN.md section 4).

File format (YAML, ``format: wansim-profile/1``)::

    format: wansim-profile/1
    drafter: dspark
    target: deepseek-v4-pro
    k: 7                      # block size it was measured at
    temperature: 1.0
    verifier: lossless
    source: reconstructed     # measured | reconstructed | fitted
    provenance: ...           # where the numbers come from, in words
    workloads:
      math:
        per_position: [p_1, ..., p_K]   # conditional acceptance, pooled over steps
        histogram: [n_0, ..., n_K]      # optional: steps with A = a accepted drafts
        dispersion: 0.3                 # optional: between-prompt share of Var(A)
        siblings: [r_1, r_2, ...]       # optional: top-r sibling acceptance (trees)
        notes: ...

The header comments of a file say where its numbers come from; :func:`write_profile` keeps a
header. This module is a leaf: it parses files and nothing else.
"""

from __future__ import annotations

import dataclasses
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from wansim.errors import ProfileError, ScenarioError
from wansim.validation import parse, spec

FORMAT = "wansim-profile/1"
SOURCES = ("measured", "reconstructed", "fitted")


@dataclasses.dataclass(frozen=True)
class WorkloadProfile:
    per_position: tuple[float, ...] = spec((), ge=0, le=1)
    histogram: tuple[int, ...] | None = spec(None, ge=0)
    dispersion: float = spec(0.0, ge=0, lt=1)
    siblings: tuple[float, ...] | None = spec(None, ge=0, le=1)
    steps: int | None = spec(None, ge=0)
    notes: str = spec("")

    def check(self, path: str) -> None:
        if not self.per_position:
            raise ProfileError(f"{path}.per_position", "needs at least one rate", [])
        k = len(self.per_position)
        if self.histogram is not None and len(self.histogram) != k + 1:
            raise ProfileError(
                f"{path}.histogram", f"needs K+1 = {k + 1} counts (A = 0..{k})", self.histogram
            )

    @property
    def tau(self) -> float:
        return float(1.0 + np.cumprod(self.per_position).sum())


@dataclasses.dataclass(frozen=True)
class ProfileHeader:
    drafter: str = spec("unknown")
    target: str = spec("unknown")
    k: int = spec(1, ge=1)
    temperature: float = spec(1.0, ge=0)
    verifier: str = spec("lossless", choices=("lossless", "greedy", "typical"))
    source: str = spec("measured", choices=SOURCES)
    provenance: str = spec("")


@dataclasses.dataclass(frozen=True)
class Profile:
    """A validated profile: header fields plus workloads by name (in file order)."""

    header: ProfileHeader
    workloads: dict[str, WorkloadProfile] = dataclasses.field(hash=False)

    @property
    def k(self) -> int:
        return self.header.k

    @property
    def default_workload(self) -> str:
        return next(iter(self.workloads))

    def workload(self, name: str | None) -> WorkloadProfile:
        name = name or self.default_workload
        if name not in self.workloads:
            raise ProfileError(
                "workload", f"not in profile (has {', '.join(self.workloads)})", name
            )
        return self.workloads[name]


def profile_from_mapping(raw: dict, where: str) -> Profile:
    """Validate a parsed profile mapping (``where`` names the file in errors)."""
    try:
        return _profile_from_mapping(raw, where)
    except ScenarioError as err:  # the shared parser's error, re-labelled for profiles
        raise ProfileError(err.path, err.problem, err.value) from None


def _profile_from_mapping(raw: dict, where: str) -> Profile:
    if not isinstance(raw, dict):
        raise ProfileError(where, "must be a YAML mapping", raw)
    raw = dict(raw)
    fmt = raw.pop("format", FORMAT)
    if fmt != FORMAT:
        raise ProfileError(f"{where}: format", f"must be {FORMAT}", fmt)
    workloads_raw = raw.pop("workloads", None)
    if not isinstance(workloads_raw, dict) or not workloads_raw:
        raise ProfileError(f"{where}: workloads", "needs at least one workload", workloads_raw)
    header = parse(ProfileHeader, raw, f"{where}:")
    workloads = {}
    for name, body in workloads_raw.items():
        wp = parse(WorkloadProfile, body, f"{where}: workloads.{name}")
        if len(wp.per_position) > header.k:
            raise ProfileError(
                f"{where}: workloads.{name}.per_position",
                f"has more positions than k = {header.k}",
                len(wp.per_position),
            )
        workloads[str(name)] = wp
    return Profile(header=header, workloads=workloads)


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate a profile file (cached by path and modification time)."""
    p = Path(path)
    if not p.is_file():
        raise ProfileError("profile", "file not found", str(path))
    return _load_cached(str(p.resolve()), p.stat().st_mtime_ns)


@lru_cache(maxsize=64)
def _load_cached(path: str, mtime_ns: int) -> Profile:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError:
        raise ProfileError(path, "not valid YAML", None) from None
    return profile_from_mapping(raw, path)


def profile_to_mapping(profile: Profile) -> dict:
    h = profile.header
    out: dict = {"format": FORMAT}
    out.update({f.name: getattr(h, f.name) for f in dataclasses.fields(h)})
    out["workloads"] = {}
    for name, wp in profile.workloads.items():
        body: dict = {"per_position": [round(float(x), 6) for x in wp.per_position]}
        if wp.histogram is not None:
            body["histogram"] = [int(x) for x in wp.histogram]
        body["dispersion"] = round(float(wp.dispersion), 6)
        if wp.siblings is not None:
            body["siblings"] = [round(float(x), 6) for x in wp.siblings]
        if wp.steps is not None:
            body["steps"] = int(wp.steps)
        if wp.notes:
            body["notes"] = wp.notes
        out["workloads"][name] = body
    return out


def write_profile(profile: Profile, path: str | os.PathLike, header_comment: str = "") -> None:
    """Write a profile as YAML; ``header_comment`` lines become ``#`` comments at the top."""
    lines = (
        [f"# {line}".rstrip() for line in header_comment.strip().splitlines()]
        if header_comment
        else []
    )
    text = yaml.safe_dump(
        profile_to_mapping(profile), sort_keys=False, width=100, default_flow_style=None
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(("\n".join(lines) + "\n" if lines else "") + text)
