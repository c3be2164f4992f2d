"""The profile bundle's acceptance: greedy in-process speculative decoding of the profiling
prompts at every K (chains, static trees, the MTP head), the profiles fitted from those traces
(every K pooled, or one K with its guess from the larger ones), and the activation-quality
table from the wire-quality runs (the runs: :mod:`wansim.calibrate.profiling`)."""

from __future__ import annotations

import pandas as pd

from wansim.calibrate.bundle import FILES
from wansim.calibrate.workload_sample import CHAIN_SHAPED


def fitted_profile_text(
    frame: pd.DataFrame,
    drafter: str,
    target: str,
    what: str,
    quality: str = FILES["activation_quality"],
    at_k: int | None = None,
) -> str:
    """The acceptance profile (YAML) fitted from a trace frame with every K pooled
    (:func:`wansim.acceptance.trace.fit_profile`), naming the bundle's activation-quality
    table ``quality`` (default: the file beside it). ``at_k`` (chain-shaped traces): the
    profile of that K alone, its guess's rate (position K + 1) from the frame's larger K
    (:func:`wansim.acceptance.trace.fit_profile_at_k`)."""
    import yaml

    from wansim.acceptance.profile import profile_to_mapping
    from wansim.acceptance.trace import fit_profile, fit_profile_at_k

    header = {"drafter": drafter, "target": target, "temperature": 0.0, "verifier": "greedy"}
    if at_k is None:
        ks = ",".join(str(int(k)) for k in sorted(frame["k"].unique()))
        prof = fit_profile(frame, **header, provenance=f"{what} at K {ks} pooled")
    else:
        deeper = ",".join(str(int(k)) for k in sorted(frame["k"].unique()) if k > at_k)
        guess = f"; position {at_k + 1} (the async bet's guess) from K {deeper}"
        prov = f"{what} at K {at_k}" + (guess if deeper else "")
        prof = fit_profile_at_k(frame, at_k, **header, provenance=prov)
    mapping = profile_to_mapping(prof)
    mapping["activation_quality"] = quality
    return yaml.safe_dump(mapping, sort_keys=False)


def per_k_profile_text(
    frame: pd.DataFrame, kind: str, k: int, drafter: str, target: str, what: str, **kw
) -> str:
    """The profile of block size ``k`` from a trace frame of one drafter ``kind``
    (:func:`fitted_profile_text`): chain-shaped traces fit that K with its guess from the
    frame's larger K (``at_k``), the static tree's the steps at that K alone."""
    if kind in CHAIN_SHAPED:
        return fitted_profile_text(frame, drafter, target, what, at_k=k, **kw)
    return fitted_profile_text(frame[frame["k"] == k], drafter, target, what, **kw)


def acceptance_trace(target_dir: str, drafter_dir: str, prompts, ks, tokens: int) -> pd.DataFrame:
    """Greedy in-process speculative decoding of ``prompts`` at every K: the trace frame."""
    import torch

    from wansim.real.model import load_lm
    from wansim.real.speculative import Drafter, speculative_decode

    torch.set_num_threads(1)
    target = load_lm(target_dir)
    drafter = Drafter(load_lm(drafter_dir, field="drafter_dir"))
    return _chain_trace(
        prompts,
        ks,
        lambda ids, k, j: speculative_decode(target, drafter, ids, tokens, k, prompt_index=j)[1],
    )


def _chain_trace(prompts, ks, accepted_of) -> pd.DataFrame:
    """The trace frame of a chain drafter: one row per verify step of every prompt at every K;
    ``accepted_of(token_ids, k, prompt_index)`` decodes one prompt and returns the accepted
    count per step."""
    rows = []
    for k in ks:
        for j, p in enumerate(prompts):
            rows += [
                {"workload": p.workload, "prompt_id": p.prompt_id, "step": s, "k": k, "accepted": a}
                for s, a in enumerate(accepted_of(list(p.tokens), k, j))
            ]
    return pd.DataFrame(rows)


def mtp_acceptance_trace(target_dir: str, mtp_dir: str, prompts, ks, tokens: int) -> pd.DataFrame:
    """Greedy in-process decoding with the MTP head (:func:`wansim.real.mtp.
    mtp_speculative_decode`, the pipeline's algorithm with the head at the last stage) of
    ``prompts`` at every K: the trace frame."""
    import torch

    from wansim.real.model import load_lm
    from wansim.real.mtp import load_mtp, mtp_speculative_decode

    torch.set_num_threads(1)
    target = load_lm(target_dir)
    head = load_mtp(mtp_dir, target)
    return _chain_trace(
        prompts,
        ks,
        lambda ids, k, j: mtp_speculative_decode(target, head, ids, tokens, k, prompt_index=j)[1],
    )


def tree_acceptance_trace(
    target_dir: str, drafter_dir: str, prompts, ks, tokens: int
) -> pd.DataFrame:
    """Greedy in-process tree decoding (:func:`wansim.real.tree_speculative.
    tree_speculative_decode`, the pipeline's tree algorithm) of ``prompts`` with the static
    tree of :func:`tree_branching` at every K: a trace frame with the tree columns
    (``accepted_ranks``, ``walk_children``) that :func:`wansim.acceptance.trace.fit_profile`
    turns into rank-1 rates per depth and the sibling rates at depth 1."""
    import torch

    from wansim.real.config import TreeSpec
    from wansim.real.model import load_lm
    from wansim.real.speculative import Drafter
    from wansim.real.tree_speculative import tree_speculative_decode

    torch.set_num_threads(1)
    target = load_lm(target_dir)
    drafter = Drafter(load_lm(drafter_dir, field="drafter_dir"))
    rows = []
    for k in ks:
        spec = TreeSpec("static", branching=tree_branching(k))
        for j, p in enumerate(prompts):
            _, walks = tree_speculative_decode(
                target, drafter, list(p.tokens), tokens, spec, prompt_index=j
            )
            rows += [
                {
                    "workload": p.workload,
                    "prompt_id": p.prompt_id,
                    "step": s,
                    "k": k,
                    "accepted": w.accepted,
                    "accepted_ranks": ";".join(map(str, w.ranks)),
                    "walk_children": ";".join(map(str, w.children)),
                }
                for s, w in enumerate(walks)
            ]
    return pd.DataFrame(rows)


def quality_table(rows: list[dict], target: str, provenance: str) -> dict:
    """The activation-quality table (``wansim-activation-quality/1``,
    :mod:`wansim.acceptance.activation_quality`) from :func:`wansim.real.wire_quality.
    activation_quality` rows: per width below 32 bits ``acceptance_factor`` = min(1, T=1
    acceptance against the compressed target / against fp32), ``acceptance_factor_greedy`` the
    same for greedy (a ratio above 1 is within the sample's noise and not credited),
    ``target_exact`` = every greedy token equal to fp32 and the width >= 16 bits."""
    from wansim.acceptance.activation_quality import EXACT_MIN_BITS, FORMAT

    bits = {}
    for r in rows:
        b = int(r["activation_bits"])
        if b == 32:
            continue
        bits[b] = {
            "acceptance_factor": round(min(1.0, float(r["acceptance_lossless_ratio"])), 4),
            "acceptance_factor_greedy": round(min(1.0, float(r["acceptance_ratio"])), 4),
            "target_exact": bool(r["target_exact"]) and b >= EXACT_MIN_BITS,
            "kl_mean": float(f"{r['kl_mean']:.4g}"),
            "token_agreement": round(float(r["token_agreement"]), 4),
        }
    return {
        "format": FORMAT,
        "source": "measured",
        "target": target,
        "provenance": provenance,
        "bits": dict(sorted(bits.items(), reverse=True)),
    }


def tree_branching(k: int) -> tuple[int, ...]:
    """The profiled draft tree of depth K (:attr:`wansim.calibrate.matrix.Cell.tree_branching`:
    two candidates at depth 1, then chains; 2K nodes)."""
    from wansim.calibrate.matrix import Cell

    return Cell(2, 0.0, k, policy="tree").tree_branching
