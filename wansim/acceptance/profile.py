"""Acceptance profiles: a drafter on a target, per workload (the file format below).

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
        siblings: [P_2, P_3, ...]       # optional, measured: rank-r sibling acceptance (trees)
        sibling_logit_offsets: [D_2, ...]  # optional, model: rank-r rate = sigmoid(logit p_d - D_r)
        hybrid_confident_fraction: 0.8  # optional, measured: share of rounds whose drafter is
                                        # confident (e.g. an n-gram match), in [0, 1]; a scenario's
                                        # schedule.hybrid_confident_fraction: profile reads it
        notes: ...
    verifier_logit_shift: {greedy: 0.5, typical: 0.7}   # optional: other verifier rules
    activation_quality: wire-quality-tiny.yaml  # optional: cost per activation bit width (a
                              # table file relative to this one, or the table inline; see
                              # wansim.acceptance.activation_quality)

Trees (see :mod:`wansim.acceptance.trees`): ``siblings`` are the pooled conditional acceptance
rates of the rank-2, rank-3, ... candidate at depth 1 (given the better-ranked ones were rejected);
``sibling_logit_offsets`` state the sibling model's parameters directly (rank r at depth d has
rate sigmoid(logit p_d - D_r)). A workload gives at most one of the two; measured siblings are
converted to offsets at depth 1 (D_r = logit p_1 - logit P_r).

Verifier rules: the rates are measured under the header's ``verifier``; another rule's rates are
sigmoid(logit p + shift) with the shift from ``verifier_logit_shift`` (the measured rule's shift
is 0). A rule with no shift in the profile is an error, never a silent constant.

The header comments of a file say where its numbers come from; :func:`write_profile` keeps a
header. This module is a leaf: it parses files and nothing else.
"""

from __future__ import annotations

import dataclasses
import os
from functools import lru_cache
from pathlib import Path

import yaml

from wansim.acceptance.activation_quality import QualityTable, table_ref
from wansim.config.speculation import VERIFIERS
from wansim.config.validation import parse, spec
from wansim.data import is_file, on_disk_or_shipped
from wansim.errors import ProfileError, ScenarioError, WansimInputError

FORMAT = "wansim-profile/1"
SOURCES = ("measured", "reconstructed", "fitted")


@dataclasses.dataclass(frozen=True)
class WorkloadProfile:
    per_position: tuple[float, ...] = spec((), ge=0, le=1)
    histogram: tuple[int, ...] | None = spec(None, ge=0)
    dispersion: float = spec(0.0, ge=0, lt=1)
    siblings: tuple[float, ...] | None = spec(None, ge=0, le=1)
    sibling_logit_offsets: tuple[float, ...] | None = spec(None)
    steps: int | None = spec(None, ge=0)
    hybrid_confident_fraction: float | None = spec(None, ge=0, le=1)
    # P(A >= K + 1 | A >= K), K = len(per_position), pooled over steps of larger block sizes:
    # the async bet's guess (wansim.acceptance.bet); None: the last rate is held for it
    guess_rate: float | None = spec(None, ge=0, le=1)
    notes: str = spec("")

    def check(self, path: str) -> None:
        if not self.per_position:
            raise ProfileError(f"{path}.per_position", "needs at least one rate", [])
        k = len(self.per_position)
        if self.histogram is not None and len(self.histogram) != k + 1:
            raise ProfileError(
                f"{path}.histogram", f"needs K+1 = {k + 1} counts (A = 0..{k})", self.histogram
            )
        if self.siblings is not None and self.sibling_logit_offsets is not None:
            raise ProfileError(
                path, "give siblings (measured) or sibling_logit_offsets (model), not both", None
            )
        for name in ("siblings", "sibling_logit_offsets"):
            if getattr(self, name) is not None and len(getattr(self, name)) == 0:
                raise ProfileError(f"{path}.{name}", "needs at least one rank (rank 2 first)", [])

    @property
    def tau(self) -> float:
        import numpy as np  # only here: reading and validating a profile needs no numpy

        return float(1.0 + np.cumprod(self.per_position).sum())


@dataclasses.dataclass(frozen=True)
class VerifierShift:
    """Logit shift from the measured verifier rule's rates to each other rule's (None: unknown)."""

    lossless: float | None = spec(None)
    greedy: float | None = spec(None)
    typical: float | None = spec(None)


@dataclasses.dataclass(frozen=True)
class ProfileHeader:
    drafter: str = spec("unknown")
    target: str = spec("unknown")
    k: int = spec(1, ge=1)
    temperature: float = spec(1.0, ge=0)
    verifier: str = spec("lossless", choices=VERIFIERS)
    source: str = spec("measured", choices=SOURCES)
    provenance: str = spec("")
    verifier_logit_shift: VerifierShift = spec(factory=VerifierShift)

    def check(self, path: str) -> None:
        own = getattr(self.verifier_logit_shift, self.verifier)
        if own not in (None, 0.0):
            raise ProfileError(
                f"{path} verifier_logit_shift.{self.verifier}",
                "must be 0 (the rates were measured under this rule)",
                own,
            )

    def verifier_shift(self, rule: str) -> float | None:
        """Logit shift to ``rule``'s rates (0 for the measured rule, None when unknown)."""
        if rule == self.verifier:
            return 0.0
        return getattr(self.verifier_logit_shift, rule)


@dataclasses.dataclass(frozen=True)
class Profile:
    """A validated profile: header fields plus workloads by name (in file order), and the
    cost of compressed activations when the profile states it (``activation_quality``)."""

    header: ProfileHeader
    workloads: dict[str, WorkloadProfile] = dataclasses.field(hash=False)
    activation_quality: QualityTable | None = dataclasses.field(default=None, hash=False)
    activation_quality_ref: object = dataclasses.field(default=None, hash=False, compare=False)

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
    quality_raw = raw.pop("activation_quality", None)
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
    quality = None
    if quality_raw is not None:
        base = Path(where).parent if where else Path.cwd()
        quality = table_ref(quality_raw, base, f"{where}: activation_quality")
    return Profile(
        header=header,
        workloads=workloads,
        activation_quality=quality,
        activation_quality_ref=quality_raw,
    )


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate a profile file (cached by path and modification time); a missing
    relative path naming a shipped profile (``traces/reference/...``) reads that one."""
    p = on_disk_or_shipped(path)
    if not is_file(p):
        raise ProfileError("profile", "file not found", str(path))
    return _load_cached(str(p.resolve()), p.stat().st_mtime_ns)


@lru_cache(maxsize=64)
def _load_cached(path: str, mtime_ns: int) -> Profile:
    from wansim.config.user_yaml import read_yaml_file

    try:
        raw = read_yaml_file(path, "profile")
    except WansimInputError as err:
        raise ProfileError(err.path, err.problem, err.value) from None
    return profile_from_mapping(raw, path)


def profile_to_mapping(profile: Profile) -> dict:
    h = profile.header
    out: dict = {"format": FORMAT}
    out.update(
        {
            f.name: getattr(h, f.name)
            for f in dataclasses.fields(h)
            if f.name != "verifier_logit_shift"
        }
    )
    shifts = {
        f.name: getattr(h.verifier_logit_shift, f.name)
        for f in dataclasses.fields(h.verifier_logit_shift)
        if getattr(h.verifier_logit_shift, f.name) is not None
    }
    if shifts:
        out["verifier_logit_shift"] = shifts
    if profile.activation_quality_ref is not None:
        out["activation_quality"] = profile.activation_quality_ref
    out["workloads"] = {}
    for name, wp in profile.workloads.items():
        body: dict = {"per_position": [round(float(x), 6) for x in wp.per_position]}
        if wp.histogram is not None:
            body["histogram"] = [int(x) for x in wp.histogram]
        body["dispersion"] = round(float(wp.dispersion), 6)
        if wp.siblings is not None:
            body["siblings"] = [round(float(x), 6) for x in wp.siblings]
        if wp.sibling_logit_offsets is not None:
            body["sibling_logit_offsets"] = [round(float(x), 6) for x in wp.sibling_logit_offsets]
        if wp.steps is not None:
            body["steps"] = int(wp.steps)
        if wp.hybrid_confident_fraction is not None:
            body["hybrid_confident_fraction"] = float(wp.hybrid_confident_fraction)
        if wp.guess_rate is not None:
            body["guess_rate"] = round(float(wp.guess_rate), 6)
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
