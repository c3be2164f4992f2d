"""Drafter catalog: presets for the drafter families that "Literature review, Pluralis,
compiled August–October 2026" catalogs (Part V), usable as
``drafter: {preset: NAME}`` in a scenario and overridable field by field.

Each preset gives the ``Drafter`` fields (kind, placement, parallel or autoregressive, draft_ms,
width_ms, acceptance) and a ``sources`` line per figure saying where it comes from: the
literature review's summary (``review Part N``: "Literature review, Pluralis, compiled
August–October 2026", Part N), a cited paper, or an assumption (``assumed``). Costs are per drafter pass
on the stage that hosts the drafter (one H200-class GPU); see ``compute.drafter_tree_ms``.

Resolution (``scenario.load_scenario``): the preset's mapping first, the scenario's explicit
keys over it (nested ``acceptance`` keys merged; an explicit acceptance source -- ``profile``,
``alpha`` or ``per_position`` -- replaces the preset's source). Unknown names are a one-line
error listing the presets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wansim.data import reference_profile
from wansim.errors import ScenarioError

REFERENCE_PROFILE = str(reference_profile())
SOURCE_KEYS = ("profile", "alpha", "per_position")
# the reference profile's assumed sibling model (traces/reference/reconstruct_dspark_v4pro.py),
# reused for presets whose acceptance is a constant rate: D_r = 2 + ln(r - 1), r = 2..8
ASSUMED_SIBLING_OFFSETS = tuple(round(2.0 + math.log(r - 1), 6) for r in range(2, 9))


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    family: str
    fields: dict[str, Any]
    sources: dict[str, str]

    @property
    def acceptance_label(self) -> str:
        acc = self.fields.get("acceptance", {})
        if "profile" in acc:
            return f"profile {Path(acc['profile']).name}:{acc.get('workload', '-')}"
        if "per_position" in acc:
            return "per_position " + ",".join(f"{p:g}" for p in acc["per_position"])
        return f"alpha {acc.get('alpha')}"


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "dspark-v4pro",
            "DSpark block drafter shipped with DeepSeek-V4-Pro",
            {
                "kind": "dspark",
                "placement": "last_stage",
                "parallel": True,
                "draft_ms": 4.0,
                "width_ms": 0.05,
                "acceptance": {"profile": REFERENCE_PROFILE, "workload": "math"},
            },
            {
                "kind/placement/parallel": "review Part V/VIII: three MoE MTP blocks reading the"
                " target's last hidden state, one block pass drafts K = 7",
                "draft_ms": "assumed (the reference scenario's value); Part VIII: ~2.5B"
                " activated parameters per step, a memory-bound floor of ~0.5 ms per pass at"
                " FP8 on 4.8 TB/s, plus three sequential blocks and kernel overheads",
                "width_ms": "assumed",
                "acceptance": "reconstructed from review Part VII (tau 4.9-5.3 math/code, 2.8-3.5"
                " chat at K = 7); sibling ranks and verifier shifts assumed (profile header)",
            },
        ),
        Preset(
            "mtp-v4pro",
            "native MTP module in the DeepSeek-V4-Pro checkpoint, chained autoregressively",
            {
                "kind": "mtp",
                "placement": "last_stage",
                "parallel": False,
                "draft_ms": 1.5,
                "width_ms": 0.05,
                "acceptance": {
                    "per_position": [0.87, 0.78, 0.70],
                    "sibling_logit_offsets": list(ASSUMED_SIBLING_OFFSETS),
                },
            },
            {
                "kind/placement/parallel": "review Part V: MTP head shipped in the checkpoint,"
                " reads the last hidden state; one module, reused once per drafted position",
                "draft_ms": "assumed (one MTP block: ~1/3 of the DSpark pass)",
                "width_ms": "assumed",
                "acceptance": "position 1: DeepSeek-V3 technical report (second-token acceptance"
                " 85-90%); positions 2-3 assumed (decline when the module is chained)",
            },
        ),
        Preset(
            "dflash-glm52",
            "DFlash block-diffusion drafter (third-party, GLM-5.2)",
            {
                "kind": "dflash",
                "placement": "last_stage",
                "parallel": True,
                "draft_ms": 3.0,
                "width_ms": 0.05,
                "acceptance": {
                    "alpha": 0.85,
                    "sibling_logit_offsets": list(ASSUMED_SIBLING_OFFSETS),
                },
            },
            {
                "kind/placement/parallel": "review Part V: DFlash exists for GLM-5.2; a block"
                " drafter conditioned on target hidden states, one pass per block",
                "draft_ms": "assumed",
                "width_ms": "assumed",
                "acceptance": "assumed (alpha 0.85, close to DSpark's on math); the review's"
                " summary gives no figure",
            },
        ),
        Preset(
            "eagle3",
            "EAGLE-style feature-level head (EAGLE-3 class), autoregressive",
            {
                "kind": "eagle",
                "placement": "last_stage",
                "parallel": False,
                "draft_ms": 0.8,
                "width_ms": 0.02,
                "acceptance": {
                    "alpha": 0.8,
                    "extrapolate": True,
                    "sibling_logit_offsets": list(ASSUMED_SIBLING_OFFSETS),
                },
            },
            {
                "kind/placement/parallel": "review Parts I/V/X: a one-layer head on the target's"
                " features, one pass per drafted level (EAGLE-2 expands trees level by level)",
                "draft_ms": "assumed (one decoder layer, memory bound)",
                "width_ms": "assumed",
                "acceptance": "assumed (alpha 0.8)",
            },
        ),
        Preset(
            "draft-model",
            "separate small draft model (same tokenizer) on the first stage",
            {
                "kind": "draft_model",
                "placement": "first_stage",
                "parallel": False,
                "draft_ms": 2.5,
                "width_ms": 0.05,
                "acceptance": {
                    "alpha": 0.7,
                    "extrapolate": True,
                    "sibling_logit_offsets": list(ASSUMED_SIBLING_OFFSETS),
                },
            },
            {
                "kind/placement/parallel": "review Parts I/II: independent model, needs no target"
                " hidden state, so it can sit on S0; autoregressive",
                "draft_ms": "assumed (a ~1B dense model per token)",
                "width_ms": "assumed",
                "acceptance": "assumed (alpha 0.7)",
            },
        ),
        Preset(
            "ngram",
            "n-gram / prompt-lookup drafting (training-free)",
            {
                "kind": "ngram",
                "placement": "first_stage",
                "parallel": True,
                "draft_ms": 0.05,
                "width_ms": 0.0,
                "acceptance": {
                    "alpha": 0.45,
                    "extrapolate": True,
                    "sibling_logit_offsets": list(ASSUMED_SIBLING_OFFSETS),
                },
            },
            {
                "kind/placement/parallel": "review Parts I/V: a lookup in the prompt and the output"
                " so far; no model, the whole block at once, on S0",
                "draft_ms": "assumed (a hash lookup)",
                "width_ms": "assumed (more matches cost nothing)",
                "acceptance": "assumed (alpha 0.45; strongly workload dependent: high on code"
                " edits/RAG, low on open chat)",
            },
        ),
    ]
}


def preset_mapping(name: Any, explicit: Mapping[str, Any]) -> dict[str, Any]:
    """The drafter mapping: preset ``name``'s values under the ``explicit`` keys."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ScenarioError(
            "drafter.preset", f"unknown preset (presets: {', '.join(PRESETS)})", name
        )
    base = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in PRESETS[name].fields.items()}
    out = dict(base)
    for key, value in explicit.items():
        if key == "acceptance" and isinstance(value, Mapping):
            acc = dict(base.get("acceptance", {}))
            if any(value.get(s) is not None for s in SOURCE_KEYS):
                for s in (*SOURCE_KEYS, "workload"):
                    acc.pop(s, None)
            acc.update({k: v for k, v in value.items() if v is not None})
            out["acceptance"] = acc
        else:
            out[key] = value
    out["preset"] = name
    return out


def catalog_rows() -> list[dict[str, str]]:
    """One row per preset for ``wansim drafters``."""
    rows = []
    for p in PRESETS.values():
        f = p.fields
        rows.append(
            {
                "preset": p.name,
                "kind": f["kind"],
                "placement": f["placement"],
                "drafting": "parallel" if f["parallel"] else "autoregressive",
                "draft_ms": f"{f['draft_ms']:g}",
                "width_ms": f"{f['width_ms']:g}",
                "acceptance": p.acceptance_label,
                "family": p.family,
                "sources": p.sources,
            }
        )
    return rows
