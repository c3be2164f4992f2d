"""The workload's acceptance at the cell's output length, fitted from the bundle's traces.

The engines draw a request's accepted counts from one profile for its whole output
(stationary acceptance). The tiny pair's is not: the chain traces accept less right after the
prompt (at K = 7, 4.34-4.52 tokens a verify step for the first three steps, 4.73-5.08 after),
so a profile fitted on 64-token traces over-predicts tau for 48-token requests (by 1.9% at
K = 7 in the bundle's own traces). A cell is therefore predicted from the steps of the bundle's
traces that a request of its length reaches (:func:`wansim.calibrate.workload_sample.steps_reached`),
fitted exactly as the bundle's per-K profiles are. Nothing of the cell enters: the traces are
the bundle's own prompts, decoded in process when it was profiled.

Chain-shaped traces only (the draft model's chains and the MTP head's): a tree profile needs
the sibling columns the bundle's trace file does not keep, so a tree cell keeps the bundle's
per-K tree profile (profiled at the held-out matrix's 48 tokens). Where every traced step is
reached (traces no longer than the cell's requests) the bundle's per-K profile is that fit and
serves unchanged.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from wansim.calibrate.bundle import FILES, Bundle
from wansim.calibrate.workload_sample import CHAIN_SHAPED, drafter_kind, steps_reached


def length_profile(bundle: Bundle, cell, out_dir: Path) -> Path | None:
    """Write the cell's acceptance profile (its drafter's traces at its K, the steps its
    requests reach) into ``out_dir`` and return its path; None where the bundle's per-K
    profile serves (no traces, a tree, K not traced, or every step reached)."""
    kind = drafter_kind(cell)
    if cell.k == 0 or kind not in CHAIN_SHAPED or bundle.acceptance_traces is None:
        return None
    text = _fit(bundle, kind, cell.k, cell.tokens)
    if text is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"acceptance_{kind}_k{cell.k}_{cell.tokens}_tokens.yaml"
    path.write_text(text)
    return path


def _fit(bundle: Bundle, kind: str, k: int, tokens: int) -> str | None:
    from wansim.calibrate.profile_acceptance import per_k_profile_text

    traces = bundle.acceptance_traces
    frame = traces[(traces["drafter"] == kind) & (traces["k"] >= k)]
    per_k = bundle.profile_at(kind, k)
    if frame.empty or per_k is None or not (frame["k"] == k).any():
        return None
    reached = steps_reached(frame, tokens - 1)  # per K: the larger K measure the guess
    if len(reached) == len(frame):
        return None
    workload = next(iter(yaml.safe_load(per_k.read_text())["workloads"]))
    return per_k_profile_text(
        reached.drop(columns="drafter").assign(workload=workload),
        kind,
        k,
        str(bundle.model["drafter"]),
        str(bundle.model["target"]),
        f"wansim calibrate predict: the bundle's {kind} traces, the steps a request "
        f"of {tokens} output tokens reaches,",
        quality=str((bundle.path / FILES["activation_quality"]).resolve()),
    )
