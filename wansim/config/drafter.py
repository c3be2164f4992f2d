"""Scenario section ``drafter``: which drafter, where it runs, what it costs, and where its
acceptance comes from.

Field documentation: README.md's scenario section."""

from __future__ import annotations

import dataclasses

from wansim.config.validation import spec
from wansim.errors import ScenarioError

DRAFTER_KINDS = ("mtp", "dspark", "dflash", "eagle", "draft_model", "ngram")
PLACEMENTS = ("first_stage", "last_stage")
# drafters that read the target's last-stage hidden state (review Part V: MTP/DSpark blocks,
# EAGLE heads, DFlash conditioned on target hidden states); a draft model or n-gram lookup
# needs only token ids
HIDDEN_STATE_DRAFTERS = ("mtp", "dspark", "dflash", "eagle")


@dataclasses.dataclass(frozen=True)
class AcceptanceSpec:
    """Where acceptance comes from: exactly one of ``profile`` (+ ``workload``), ``alpha``
    (constant conditional rate; ``alpha: 0.8`` when none is given) or ``per_position`` (p_1..p_K). ``domain_shift`` in (0, 1]
    multiplies every conditional rate (Part IX: out of domain, fine-tuned targets).
    ``dispersion`` is the between-prompt share of the per-step accepted-length variance
    (default: the profile's; 0 for alpha/per_position). ``extrapolate`` allows K beyond the
    measured positions by holding the last measured rate (an assumption, off by default).
    ``sibling_logit_offsets`` (trees): rank-r candidates are accepted at
    sigmoid(logit p_d - offset_r) for r = 2, 3, ... (overrides the profile's; see
    :mod:`wansim.acceptance.trees`). alpha/per_position rates are the rates of the scenario's
    ``speculation.verifier`` rule; a profile converts them (its ``verifier_logit_shift``).
    ``activation_quality``: a table file of what each activation bit width costs (acceptance
    factor, exactness; :mod:`wansim.acceptance.activation_quality`), replacing the profile's."""

    profile: str | None = spec(None)
    workload: str | None = spec(None)
    alpha: float | None = spec(None, gt=0, lt=1)
    per_position: tuple[float, ...] | None = spec(None, ge=0, le=1, max_items=4096)
    domain_shift: float = spec(1.0, gt=0, le=1)
    dispersion: float | None = spec(None, ge=0, lt=1)
    extrapolate: bool = spec(False)
    sibling_logit_offsets: tuple[float, ...] | None = spec(None, max_items=4096)
    activation_quality: str | None = spec(None)

    def check(self, path: str) -> None:
        if self.sibling_logit_offsets is not None and not self.sibling_logit_offsets:
            raise ScenarioError(
                f"{path}.sibling_logit_offsets", "needs at least one rank (rank 2 first)", []
            )
        given = [n for n in ("profile", "alpha", "per_position") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ScenarioError(path, "give only one of profile, alpha, per_position", given)
        if self.per_position is not None and len(self.per_position) == 0:
            raise ScenarioError(f"{path}.per_position", "needs at least one rate", [])
        if self.workload is not None and self.profile is None:
            raise ScenarioError(f"{path}.workload", "needs a profile", self.workload)

    DEFAULT_ALPHA = 0.8

    @property
    def source(self) -> str:
        if self.profile is not None:
            return "profile"
        if self.per_position is not None:
            return "per_position"
        return "alpha"


@dataclasses.dataclass(frozen=True)
class Drafter:
    """One drafter pass costs ``draft_ms``; ``parallel`` (block) drafters draft K tokens in one
    pass, autoregressive ones pay K passes. A tree's candidates beyond one per depth cost
    ``width_ms`` each (``compute.drafter_tree_ms``); a pass drafting for several sequences (a
    batch) costs ``sequence_ms`` more per sequence beyond the first (on the stage it drafts
    on; an overlapped drafter's own device drafts at ``draft_ms`` a pass). ``preset`` names a catalog entry
    (``wansim drafters``) whose values fill the fields this mapping omits (at load time).

    ``overlap: true`` puts the drafter on its own device (another GPU or node beside its
    stage): drafting no longer occupies the stage, and the drafter drafts the next block from
    its own drafts while the current block is verified, betting that the block is accepted
    whole. A won bet makes a step cost max(draft, lap) instead of draft + lap; a lost one
    finishes the draft in progress and redrafts from the correction (max(lap, draft) + draft). Chains only; nothing to overlap with policy
    none."""

    kind: str = spec("dspark", choices=DRAFTER_KINDS)
    placement: str = spec("last_stage", choices=PLACEMENTS)
    parallel: bool = spec(True)
    draft_ms: float = spec(4.0, ge=0)
    width_ms: float = spec(0.05, ge=0, doc="per extra tree candidate beyond one per depth")
    sequence_ms: float = spec(
        0.0, ge=0, doc="per drafter pass, each sequence beyond the first of a batched pass"
    )
    acceptance: AcceptanceSpec = spec(factory=AcceptanceSpec)
    preset: str | None = spec(None)
    overlap: bool = spec(
        False,
        doc="the drafter has its own device beside its stage and drafts the next block while"
        " the current one is verified (the max(.) law; :mod:`wansim.sim.async_speculation`)",
    )
