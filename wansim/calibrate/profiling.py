"""``wansim calibrate profile``: dedicated short real runs, fitted once into a profile bundle.

What runs (2-stage pipelines of the target, the draft model at stage 0, every hop an emulated
link of ``LATENCY_MS`` at 1000 Mbit/s, greedy, one request at a time): one pipeline per layer
split x activation bits in :data:`FULL_PLANS` (1+5, 3+3, 5+1 layers at fp32 and 3+3 at 8
bits), all up at once, decoding the same prompts at every K of ``KS`` (2, 4, 7), one prompt at a
time at every K on every pipeline (orders rotating), so that load drift does not align with a
split or a K; at every K the first fp32 pipeline also decodes a static tree of 2K nodes, and
with ``mtp_dir`` a 3+3 pipeline drafts with the MTP head at the last stage; after every prompt
the 1+5 and 5+1 fp32 pipelines decode one batched job (2, then 4 requests a pass: the cost of
a batched pass per request beyond the first, :func:`fit_batch`). The prompts are
drawn with :data:`PROFILE_SEED`, not the held-out cells' seed, so no cell's acceptance sample
is in the bundle.

Fits (pure functions, tested on synthetic data; the bundle's model in
:mod:`wansim.calibrate.bundle`): a stage's measured service time per pass (frame in -> frame
out, :func:`wansim.calibrate.measure.decompose`), less the codec cost measured directly (the
stages' own ``codec_ms``), is fitted by non-negative least squares on its role (first | last),
layers and tokens per pass (chains K + 1, trees 2K + 1); a middle stage, which a 2-stage
pipeline does not have, is the last stage without its verification plus stage 0's encode (both
measured per pass: ``verify_ms``, ``codec_ms``). Drafting: linear in K and in the tree's extra
nodes (``width_ms``); the MTP head's drafting linear in K, and its pipeline's first/last fixed
costs. Per-message cost: each hop's achieved - scheduled delay per frame, by hop role. Wire
quality: :func:`wansim.real.wire_quality.activation_quality` at every profiled width. The
acceptance profiles (chain, static tree, MTP head): fitted from the traces of all profiled K
pooled (per-position rates are
the maximum-likelihood estimates across block sizes, :mod:`wansim.acceptance.trace`), decoded
in process (:func:`wansim.real.speculative.speculative_decode`, the staged pipeline's algorithm,
greedy output equal to it; CI checks that) on more prompts than the timed runs: acceptance is a
property of the pair and the workload, not of the timing, and a few prompts' tau varies by
10-40% between prompt sets.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from wansim.calibrate.bundle import FILES, ROLES, config_sha256, write_bundle
from wansim.calibrate.workload_sample import CHAIN_SHAPED
from wansim.stages.profiled_cost import stage_role

PROFILE_SEED = 1000
LATENCY_MS = 5.0
BANDWIDTH_MBPS = 1000.0
KS = (2, 4, 7)
PROMPT_TOKENS = 64
# (layer split of the 6-layer target, activation bits)
FULL_PLANS = (
    (((0, 1), (1, 6)), 32),
    (((0, 3), (3, 6)), 32),
    (((0, 5), (5, 6)), 32),
    (((0, 3), (3, 6)), 8),
)
QUICK_PLANS = (
    (((0, 1), (1, 6)), 32),
    (((0, 5), (5, 6)), 32),
    (((0, 3), (3, 6)), 8),
)
SIZES = {
    "full": {
        "prompts": 4,
        "tokens": 48,
        "acceptance_prompts": 128,
        "acceptance_tokens": 64,
        "tree_prompts": 64,
        "tree_tokens": 48,
        "quality_prompts": 8,
        "quality_tokens": 32,
    },
    "quick": {
        "prompts": 3,
        "tokens": 32,
        "acceptance_prompts": 16,
        "acceptance_tokens": 48,
        "tree_prompts": 8,
        "tree_tokens": 32,
        "quality_prompts": 4,
        "quality_tokens": 32,
    },
}
QUALITY_K = 4  # the drafts per pass at which the wire-quality acceptance ratios are measured
# batched jobs (several requests' blocks in one pass, DecodeSpec(batching="continuous")) on
# the 1+5 and 5+1 pipelines, a batch size per prompt in turn: the cost per sequence beyond the
# first (``batch`` in the bundle)
BATCH_BLOCKS = (2, 4)
BATCH_SPLITS = (((0, 1), (1, 6)), ((0, 5), (5, 6)))
REFERENCE_SPLIT = ((0, 3), (3, 6))  # the acceptance traces and the short re-profile


# ----------------------------------------------------------------------------- per-pass rows
def stage_pass_rows(
    passes: pd.DataFrame, raw: dict, splits, bits: int, job: int | None, tree_nodes: int = 0
) -> pd.DataFrame:
    """One row per stage per pass: role, layers, n_tokens, bits, kind, service_ms and the
    stage's own compute / codec / verify ms (``raw/stage{i}.csv``). ``tree_nodes`` > 0: the
    job drafted trees of that many nodes, so a verify pass carries ``tree_nodes + 1`` tokens
    (a chain's K + 1)."""
    stages = len(splits)
    rows = []
    for i, (lo, hi) in enumerate(splits):
        st = raw.get(f"stage{i}", pd.DataFrame())
        if job is not None and not st.empty and "job" in st.columns:
            st = st[st["job"] == job]
        own = st.set_index("pass") if not st.empty else None
        for r in passes.to_dict("records"):
            p = int(r["pass"])
            has = own is not None and p in own.index
            rows.append(
                {
                    "kind": r["kind"],
                    "stage": i,
                    "role": stage_role(i, stages),
                    "layers": hi - lo,
                    "n_tokens": tree_nodes + 1
                    if tree_nodes and r["kind"] == "verify"
                    else int(r["n_tokens"]),
                    "k": int(r["k"]),
                    "tree_nodes": int(tree_nodes),
                    "bits": int(bits),
                    "service_ms": float(r[f"service{i}_ms"]),
                    "compute_ms": float(own.at[p, "compute_ms"]) if has else np.nan,
                    "codec_ms": float(own.at[p, "codec_ms"]) if has else np.nan,
                    "verify_ms": float(own.at[p, "verify_ms"]) if has else np.nan,
                }
            )
    return pd.DataFrame(rows)


def hop_error_rows(passes: pd.DataFrame, stages: int) -> pd.DataFrame:
    """Per verify pass and hop: role (forward | return), bytes, error_ms (achieved -
    scheduled)."""
    v = passes[passes["kind"] == "verify"]
    rows = []
    for h in range(stages):
        role = "return" if h == stages - 1 else "forward"
        for b, e in zip(v[f"hop{h}_bytes"], v[f"hop{h}_error_ms"], strict=True):
            if np.isfinite(e):
                rows.append({"role": role, "bytes": float(b), "error_ms": float(e)})
    return pd.DataFrame(rows)


def batched_pass_rows(passes: pd.DataFrame, splits, bits: int) -> pd.DataFrame:
    """One row per stage per batched verify pass (the blocks of one pass share its ``pass``):
    role, layers, blocks (requests in the pass), n_tokens (their K + 1 summed), k, bits,
    service_ms and the pass's drafting ms."""
    v = passes[passes["kind"] == "verify"]
    stages = len(splits)
    rows = []
    for p, g in v.groupby("pass"):
        for i, (lo, hi) in enumerate(splits):
            rows.append(
                {
                    "pass": int(p),
                    "stage": i,
                    "role": stage_role(i, stages),
                    "layers": hi - lo,
                    "blocks": len(g),
                    "n_tokens": int(g["n_tokens"].sum()),
                    "k": int(g["k"].max()),
                    "bits": int(bits),
                    "service_ms": float(g[f"service{i}_ms"].median()),
                    "draft_ms": float(g["draft_ms"].median()),
                }
            )
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- fits
def nonnegative_least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (``scipy.optimize.nnls``): a fixed cost, a
    cost per layer, per token or per layer-token cannot be negative. Unconstrained fits of
    runs under load gave -0.85 ms per token and -15.7 ms of fixed cost (the noise of
    preempted passes), which made a 15-token tree pass cheaper than a 3-token chain pass."""
    from scipy.optimize import nnls

    coef, _ = nnls(x, y)
    return coef


def codec_cost_per_op(rows: pd.DataFrame) -> dict[int, float]:
    """ms per encode or decode at each width beyond fp32's, measured directly: the stages' own
    ``codec_ms`` per pass (stage 0 encodes, the last stage decodes: one op each), median at the
    width minus median at fp32, per role, averaged over the two roles. Medians: a pass's codec
    time is a fraction of a millisecond, and a preempted pass would dominate a mean. (A
    regression of the whole service time on a width indicator, which one plan's difference
    decides, came out at -0.9 and -1.6 ms per op under load: noise, not a saving.)"""
    v = rows[(rows["kind"] == "verify") & rows["role"].isin(("first", "last"))]
    out = {32: 0.0}
    for b in sorted(int(x) for x in v["bits"].unique() if int(x) != 32):
        diffs = []
        for role in ("first", "last"):
            at = v.loc[(v["role"] == role) & (v["bits"] == b), "codec_ms"].dropna()
            ref = v.loc[(v["role"] == role) & (v["bits"] == 32), "codec_ms"].dropna()
            if len(at) and len(ref):
                diffs.append(float(at.median()) - float(ref.median()))
        out[b] = float(np.mean(diffs)) if diffs else 0.0
    return out


def fit_stage_cost(rows: pd.DataFrame) -> dict:
    """Non-negative least squares of verify-pass service ms, less the measured codec cost
    (:func:`codec_cost_per_op`, one op per role), on [first, last, layers, n, layers*n];
    prefill on [first, last, layers]; the middle role derived (module docstring). Rows of the
    MTP head's pipeline (``drafter_kind`` mtp) are left out. Returns the bundle's ``stage_cost``
    mapping (+ ``fit_rmse_ms``)."""
    if "drafter_kind" in rows.columns:
        rows = rows[rows["drafter_kind"] != "mtp"]
    codec = codec_cost_per_op(rows)
    v = rows[(rows["kind"] == "verify") & rows["role"].isin(("first", "last"))]
    first = (v["role"] == "first").to_numpy(float)
    layers = v["layers"].to_numpy(float)
    n = v["n_tokens"].to_numpy(float)
    x = np.column_stack([first, 1 - first, layers, n, layers * n])
    y = v["service_ms"].to_numpy(float) - v["bits"].map(lambda b: codec[int(b)]).to_numpy(float)
    coef = nonnegative_least_squares(x, y)
    rmse = float(np.sqrt(np.mean((x @ coef - y) ** 2)))
    fixed = {"first": float(coef[0]), "last": float(coef[1])}
    fixed["middle"] = _middle(fixed["last"], rows, "verify")
    out = {
        "fixed_ms": {r: fixed[r] for r in ROLES},
        "per_layer_ms": float(coef[2]),
        "per_token_ms": float(coef[3]),
        "per_layer_token_ms": float(coef[4]),
        "codec_ms_per_op": codec,
        "fit_rmse_ms": rmse,
        "verify_passes": len(y),
    }
    pre = rows[(rows["kind"] == "prefill") & rows["role"].isin(("first", "last"))]
    pre = pre[pre["bits"] == 32] if (pre["bits"] == 32).any() else pre
    pf = (pre["role"] == "first").to_numpy(float)
    xp = np.column_stack([pf, 1 - pf, pre["layers"].to_numpy(float)])
    cp = nonnegative_least_squares(xp, pre["service_ms"].to_numpy(float))
    pfixed = {"first": float(cp[0]), "last": float(cp[1])}
    pfixed["middle"] = _middle(pfixed["last"], rows, "prefill")
    out["prefill"] = {
        "fixed_ms": {r: pfixed[r] for r in ROLES},
        "per_layer_ms": float(cp[2]),
        "passes": len(pre),
    }
    return out


def _middle(fixed_last: float, rows: pd.DataFrame, kind: str) -> float:
    """A middle stage = the last stage without verifying + stage 0's fp32 encode."""
    sub = rows[(rows["kind"] == kind) & (rows["bits"] == 32)]
    verify = sub.loc[sub["role"] == "last", "verify_ms"].mean()
    encode = sub.loc[sub["role"] == "first", "codec_ms"].mean()
    verify = 0.0 if not np.isfinite(verify) else float(verify)
    encode = 0.0 if not np.isfinite(encode) else float(encode)
    return max(0.0, fixed_last - verify + encode)


def fit_mtp_fixed(rows: pd.DataFrame, cost: dict) -> dict:
    """The MTP pipeline's fixed cost per pass of its first and last stage: the mean of each
    verify pass's service time minus the bundle's layer, token and codec parts (``cost``, fitted
    on the draft model's pipelines). Stage 0 does no drafting bookkeeping there and the last
    stage sends the drafts ahead of its verdict, so both differ from the draft model's."""
    from wansim.stages.profiled_cost import verify_ms

    v = rows[(rows["kind"] == "verify") & rows["role"].isin(("first", "last"))]
    out = {}
    for role in ("first", "last"):
        sub = v[v["role"] == role]
        rest = [
            verify_ms(cost, role, int(lay), int(n), int(b)) - cost["fixed_ms"][role]
            for lay, n, b in zip(sub["layers"], sub["n_tokens"], sub["bits"], strict=True)
        ]
        out[role] = float(np.mean(sub["service_ms"].to_numpy(float) - np.array(rest)))
    return out


def fit_drafter(draft: pd.DataFrame) -> dict:
    """Drafting ms per verify pass = intercept + per_draft * K + width_ms * (nodes - K)
    (least squares over verify passes): a chain drafts K nodes in K passes; a tree of depth K
    drafts ``nodes`` in K passes, each candidate beyond one per depth costing ``width_ms``
    (the engines' ``drafter.width_ms``). Without tree rows (no ``nodes`` column, or nodes = K
    everywhere) ``width_ms`` is absent."""
    k = draft["k"].to_numpy(float)
    nodes = draft["nodes"].to_numpy(float) if "nodes" in draft.columns else k
    extra = nodes - k
    has_tree = bool(np.any(extra > 0))
    cols = [np.ones_like(k), k] + ([extra] if has_tree else [])
    coef, *_ = np.linalg.lstsq(np.column_stack(cols), draft["draft_ms"].to_numpy(float), rcond=None)
    chain = draft[extra == 0] if has_tree else draft
    means = chain.groupby("k")["draft_ms"].mean()
    out = {
        "intercept_ms": float(coef[0]),
        "per_draft_ms": float(coef[1]),
        "mean_ms_by_k": {int(kk): float(v) for kk, v in means.items()},
    }
    if has_tree:
        out["width_ms"] = float(coef[2])
        tree = draft[extra > 0]
        out["tree_mean_ms_by_k"] = {
            int(kk): float(v) for kk, v in tree.groupby("k")["draft_ms"].mean().items()
        }
    return out


def fit_batch(rows: pd.DataFrame, cost: dict, drafter: dict) -> dict:
    """A batched pass's cost per sequence beyond the first (the engines' ``model.sequence_ms``
    and ``drafter.sequence_ms``), from the batched jobs' passes (:func:`batched_pass_rows`) of
    two or more blocks: a stage's service less the bundle's formula at the pass's total tokens
    (``cost``: ``stage_cost``, fitted on one-request passes), by non-negative least squares on
    (b - 1) per role (first, last) and (b - 1) x layers; the middle role takes the first's
    fixed part (neither verifies). The drafting less the one-request fit (``drafter``) on
    K (b - 1): the autoregressive drafter's K passes each over b sequences."""
    from wansim.stages.profiled_cost import verify_ms

    r = rows[(rows["blocks"] > 1) & rows["role"].isin(("first", "last"))]
    extra = (r["blocks"] - 1).to_numpy(float)
    first = (r["role"] == "first").to_numpy(float)
    base = np.array(
        [
            verify_ms(cost, role, int(lay), int(n), int(b))
            for role, lay, n, b in zip(
                r["role"], r["layers"], r["n_tokens"], r["bits"], strict=True
            )
        ]
    )
    y = r["service_ms"].to_numpy(float) - base
    x = np.column_stack([extra * first, extra * (1 - first), extra * r["layers"].to_numpy(float)])
    coef = nonnegative_least_squares(x, y)
    d = r[r["stage"] == 0]
    dk = d["k"].to_numpy(float)
    dy = d["draft_ms"].to_numpy(float) - (drafter["intercept_ms"] + drafter["per_draft_ms"] * dk)
    dx = (dk * (d["blocks"] - 1).to_numpy(float))[:, None]
    dcoef = nonnegative_least_squares(dx, dy)
    fixed = {"first": float(coef[0]), "middle": float(coef[0]), "last": float(coef[1])}
    return {
        "sequence_ms": fixed,
        "sequence_per_layer_ms": float(coef[2]),
        "drafter_sequence_ms": float(dcoef[0]),
        "fit_rmse_ms": float(np.sqrt(np.mean((x @ coef - y) ** 2))) if len(y) else 0.0,
        "passes": len(d),
        "blocks": sorted(int(b) for b in rows["blocks"].unique()),
    }


def fit_messages(errors: pd.DataFrame) -> dict:
    """Mean per-message cost per hop role, and its linear dependence on bytes (all roles)."""
    per = {
        role: float(errors.loc[errors["role"] == role, "error_ms"].mean())
        for role in ("forward", "return")
    }
    b = errors["bytes"].to_numpy(float)
    x = np.column_stack([np.ones_like(b), b])
    coef, *_ = np.linalg.lstsq(x, errors["error_ms"].to_numpy(float), rcond=None)
    q = errors.groupby("role")["error_ms"].quantile([0.5, 0.99]).unstack()
    return {
        "per_message_ms": per,
        "intercept_ms": float(coef[0]),
        "per_kib_ms": float(coef[1] * 1024),
        "quantiles_ms": {
            str(r): {"p50": float(q.at[r, 0.5]), "p99": float(q.at[r, 0.99])} for r in q.index
        },
        "frames": len(errors),
    }


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


# ----------------------------------------------------------------------------- the real runs
def open_pipeline(
    target_dir: str,
    drafter_dir: str,
    splits,
    bits: int,
    run_dir: Path,
    latency_ms: float = LATENCY_MS,
    mtp_dir: str | None = None,
):
    """A started 2-stage profiling pipeline (close it when done); with ``mtp_dir`` the MTP
    head drafts at the last stage instead of the draft model at stage 0."""
    from wansim.real.config import PipelineSpec
    from wansim.real.link import LinkSpec
    from wansim.real.runner import Pipeline

    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=None if mtp_dir else drafter_dir,
        drafter_kind="mtp" if mtp_dir else "draft_model",
        mtp_dir=mtp_dir,
        stages=len(splits),
        layer_splits=tuple(splits),
        links=(LinkSpec(latency_ms=latency_ms, bandwidth_mbps=BANDWIDTH_MBPS),),
        activation_bits=bits,
    )
    return Pipeline(spec, run_dir).start()


def tree_branching(k: int) -> tuple[int, ...]:
    """The profiled draft tree of depth K (:attr:`wansim.calibrate.matrix.Cell.tree_branching`:
    two candidates at depth 1, then chains; 2K nodes)."""
    from wansim.calibrate.matrix import Cell

    return Cell(2, 0.0, k, policy="tree").tree_branching


def measure_job(
    pipe, splits, bits: int, k: int, prompts, tokens: int, tree: bool = False, name: str = ""
) -> dict:
    """One job on a profiling pipeline: per-stage rows, hop errors, drafting times (a chain of
    K, or with ``tree`` the static tree of :func:`tree_branching`)."""
    from wansim.calibrate.measure import decompose
    from wansim.real.config import DecodeSpec, TreeSpec
    from wansim.real.recording import read_raw

    branching = tree_branching(k) if tree else ()
    spec = TreeSpec("static", branching=branching) if tree else None
    res = pipe.generate(
        prompts,
        DecodeSpec(k=k, max_new_tokens=tokens, tree=spec),
        name=f"{'tree' if tree else 'k'}{k}{name}",
    )
    raw = read_raw(pipe.run_dir / "raw", len(splits))
    passes = decompose(res.steps, raw, len(splits))
    job = int(res.steps["job"].iloc[0]) if "job" in res.steps.columns else None
    v = passes[passes["kind"] == "verify"]
    nodes = 2 * k if tree else k
    return {
        "stage": stage_pass_rows(passes, raw, splits, bits, job, nodes if tree else 0),
        "hops": hop_error_rows(passes, len(splits)).assign(bits=bits),
        "draft": pd.DataFrame({"k": v["k"], "nodes": nodes, "draft_ms": v["draft_ms"]}),
    }


def measure_batched_job(
    pipe, splits, bits: int, k: int, prompts, tokens: int, name: str = ""
) -> pd.DataFrame:
    """One batched job: every prompt of ``prompts`` in one batch (continuous batching), its
    passes as :func:`batched_pass_rows`."""
    from wansim.calibrate.measure import decompose
    from wansim.real.config import DecodeSpec
    from wansim.real.recording import read_raw

    spec = DecodeSpec(k=k, max_new_tokens=tokens, concurrency=len(prompts), batching="continuous")
    res = pipe.generate(prompts, spec, name=f"batch{len(prompts)}-k{k}{name}")
    raw = read_raw(pipe.run_dir / "raw", len(splits))
    return batched_pass_rows(decompose(res.steps, raw, len(splits)), splits, bits)


def run_idle_sweep(
    target_dir: str, drafter_dir: str, run_dir: Path, prompts, tokens: int, latencies_ms
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The reference pipeline at every latency of ``latencies_ms`` (all up at once, after an
    unmeasured warm-up job each), prompt by prompt with the latency order rotating: the
    per-pass rows of :func:`wansim.calibrate.idle_profile.idle_pass_rows` and the per-message
    rows of :func:`wansim.calibrate.idle_profile.idle_message_rows`."""
    from wansim.calibrate.idle_profile import K, idle_message_rows, idle_pass_rows
    from wansim.calibrate.measure import decompose
    from wansim.real.config import DecodeSpec
    from wansim.real.recording import read_raw

    pipes = []
    frames, messages = [], []
    try:
        for lat in latencies_ms:
            pipes.append(
                open_pipeline(
                    target_dir,
                    drafter_dir,
                    REFERENCE_SPLIT,
                    32,
                    run_dir / f"idle{lat:g}ms",
                    latency_ms=lat,
                )
            )
        for pipe in pipes:
            pipe.generate(prompts[:1], DecodeSpec(k=K, max_new_tokens=8), name="warmup")
        for c in range(len(prompts)):
            for x in range(len(pipes)):
                j = (c + x) % len(pipes)
                res = pipes[j].generate(
                    prompts[c : c + 1], DecodeSpec(k=K, max_new_tokens=tokens), name=f"idle-p{c}"
                )
                raw = read_raw(pipes[j].run_dir / "raw", 2)
                job = int(res.steps["job"].iloc[0])
                st1 = raw["stage1"]
                frames.append(
                    idle_pass_rows(res.steps, st1[st1["job"] == job], latencies_ms[j]).assign(
                        prompt_index=c
                    )
                )
                passes = decompose(res.steps, raw, 2)
                messages.append(idle_message_rows(passes, latencies_ms[j]).assign(prompt_index=c))
    finally:
        for pipe in pipes:
            pipe.close()
    return pd.concat(frames, ignore_index=True), pd.concat(messages, ignore_index=True)


def _concat(jobs: list[dict], load) -> dict:
    out = {key: pd.concat([j[key] for j in jobs], ignore_index=True) for key in jobs[0]}
    out["load"] = load
    return out


def run_plan(
    target_dir: str, drafter_dir: str, splits, bits: int, ks, prompts, tokens: int, run_dir: Path
) -> dict:
    """One 2-stage pipeline decoding ``prompts`` at every K (the short re-profile), after one
    unmeasured warm-up job (a fresh pipeline's first passes are slower)."""
    load0 = os.getloadavg()[0]
    pipe = open_pipeline(target_dir, drafter_dir, splits, bits, run_dir)
    try:
        measure_job(pipe, splits, bits, ks[0], prompts[:1], 8)
        jobs = [measure_job(pipe, splits, bits, k, prompts, tokens) for k in ks]
    finally:
        pipe.close()
    return _concat(jobs, (round(load0, 2), round(os.getloadavg()[0], 2)))


def run_profile(
    out: str | Path,
    *,
    quick: bool,
    target_dir: str,
    drafter_dir: str,
    mtp_dir: str | None = None,
    progress: Callable[[str], None] | None = None,
    plans=None,
    ks: tuple[int, ...] = KS,
    size: dict | None = None,
    idle_latencies_ms: tuple[float, ...] | None = None,
) -> dict:
    """Run the profile and write the bundle to ``out``; returns the manifest written.
    ``mtp_dir``: also profile that MTP head (a 2-stage pipeline, :data:`REFERENCE_SPLIT`,
    drafting at the last stage: its drafting time per K and its acceptance).
    ``plans``, ``ks``, ``size``, ``idle_latencies_ms``: smaller profiles for tests (default:
    :data:`FULL_PLANS` or :data:`QUICK_PLANS`, :data:`KS`, :data:`SIZES`, the latencies of
    :mod:`wansim.calibrate.idle_profile`; ``()``: no idle cost)."""
    from wansim.calibrate.idle_profile import (
        LATENCIES_MS,
        QUICK_LATENCIES_MS,
        fit_idle_cost,
        fit_message_idle_cost,
    )
    from wansim.real.prompts import builtin_prompts

    say = progress or (lambda _m: None)
    size = size or SIZES["quick" if quick else "full"]
    plans = plans or (QUICK_PLANS if quick else FULL_PLANS)
    ks = tuple(ks)
    out = Path(out)
    prompts = builtin_prompts("code", size["prompts"], PROMPT_TOKENS, seed=PROFILE_SEED)
    t0 = time.perf_counter()
    # every plan's pipeline stays up and the jobs alternate between them (prompt by prompt,
    # K and plan orders rotating): load drift hits every layer split, bit width and K alike,
    # so it does not masquerade as a cost per layer or per token
    say(
        f"profile: {len(plans)} 2-stage pipelines (layers "
        + ", ".join(f"{s_[0][1]}+{s_[1][1] - s_[1][0]} {b}-bit" for s_, b in plans)
        + f"), K {','.join(map(str, ks))}, {size['prompts']} prompts x {size['tokens']} tokens "
        "(the first start imports torch)"
    )
    load0 = os.getloadavg()[0]
    pipes = []
    jobs: list[list[dict]] = [[] for _ in plans]
    tree_plan = next(j for j, (_, b) in enumerate(plans) if b == 32)
    batch_plans = [j for j, (s_, b) in enumerate(plans) if b == 32 and tuple(s_) in BATCH_SPLITS]
    batch_jobs: list[pd.DataFrame] = []
    mtp_draft: list[pd.DataFrame] = []
    mtp_stage: list[pd.DataFrame] = []
    try:
        for j, (splits, bits) in enumerate(plans):
            pipes.append(
                open_pipeline(target_dir, drafter_dir, splits, bits, out / "runs" / f"plan{j}")
            )
        if mtp_dir:
            mtp_pipe = open_pipeline(
                target_dir, drafter_dir, REFERENCE_SPLIT, 32, out / "runs" / "mtp", mtp_dir=mtp_dir
            )
            pipes.append(mtp_pipe)
            measure_job(mtp_pipe, REFERENCE_SPLIT, 32, ks[0], prompts[:1], 8)
        for j, (splits, bits) in enumerate(plans):  # unmeasured warm-up jobs
            measure_job(pipes[j], splits, bits, ks[0], prompts[:1], 8)
        # one prompt at a time, every K and every pipeline on it before the next prompt (the
        # K order and the pipeline order rotating): a load burst lasting a few seconds hits
        # every K, split, bit width, the tree and the head alike instead of lining up with one
        # K (a run that did all of K=7 last fitted 100+ ms passes for K=7 under a burst)
        for c in range(len(prompts)):
            chunk = prompts[c : c + 1]
            for i in range(len(ks)):
                k = ks[(c + i) % len(ks)]
                for j in [(c + i + x) % len(plans) for x in range(len(plans))]:
                    splits, bits = plans[j]
                    jobs[j].append(
                        measure_job(pipes[j], splits, bits, k, chunk, size["tokens"], name=f"-p{c}")
                    )
                # the tree width: the same K as a static tree of 2K nodes (first fp32 plan)
                splits, bits = plans[tree_plan]
                jobs[tree_plan].append(
                    measure_job(
                        pipes[tree_plan],
                        splits,
                        bits,
                        k,
                        chunk,
                        size["tokens"],
                        tree=True,
                        name=f"-p{c}",
                    )
                )
                if mtp_dir:  # the MTP head's drafting at this K (the last stage's draft_ms)
                    job = measure_job(
                        mtp_pipe, REFERENCE_SPLIT, 32, k, chunk, size["tokens"], name=f"-p{c}"
                    )
                    mtp_draft.append(job["draft"][["k", "draft_ms"]])
                    mtp_stage.append(job["stage"].assign(drafter_kind="mtp"))
            # a batched job on the 1+5 and 5+1 pipelines: 2 or 4 requests (in turn), a K in turn
            blocks = BATCH_BLOCKS[c % len(BATCH_BLOCKS)]
            batch = [prompts[(c + x) % len(prompts)] for x in range(blocks)]
            for j in batch_plans:
                splits, bits = plans[j]
                rows = measure_batched_job(
                    pipes[j], splits, bits, ks[c % len(ks)], batch, size["tokens"], f"-p{c}"
                )
                batch_jobs.append(rows.assign(job=len(batch_jobs)))
            say(
                f"  prompt {c + 1}/{len(prompts)} done at every K on every pipeline, + trees"
                f"{' + the MTP head' if mtp_dir else ''}"
                f"{f' + a batch of {blocks}' if batch_plans else ''}"
                f" ({time.perf_counter() - t0:.0f} s)"
            )
    finally:
        for pipe in pipes:
            pipe.close()
    if idle_latencies_ms is None:
        idle_latencies_ms = QUICK_LATENCIES_MS if quick else LATENCIES_MS
    idle_rows, idle_messages, idle_fit = None, None, None
    if idle_latencies_ms:
        say(
            "idle cost: the 3+3 pipeline at "
            + ", ".join(f"{x:g}" for x in idle_latencies_ms)
            + f" ms links, K=4, {len(prompts)} prompts x {size['tokens']} tokens"
        )
        idle_rows, idle_messages = run_idle_sweep(
            target_dir, drafter_dir, out / "runs", prompts, size["tokens"], idle_latencies_ms
        )
        idle_fit = fit_idle_cost(idle_rows, LATENCY_MS)
        idle_fit["message"] = fit_message_idle_cost(idle_messages, LATENCY_MS)
    load = (round(load0, 2), round(os.getloadavg()[0], 2))
    results = []
    for (splits, bits), js in zip(plans, jobs, strict=True):
        r = _concat(js, load)
        r["splits"], r["bits"] = splits, bits
        results.append(r)
    stage = pd.concat([r["stage"] for r in results], ignore_index=True)
    stage = stage.assign(drafter_kind="draft_model")
    hops = pd.concat([r["hops"] for r in results], ignore_index=True)
    draft = pd.concat([r["draft"] for r in results], ignore_index=True)
    say(
        f"acceptance: {size['acceptance_prompts']} prompts x {size['acceptance_tokens']} tokens "
        f"at K {','.join(map(str, ks))}, in process"
    )
    acc_prompts = builtin_prompts(
        "code", size["acceptance_prompts"], PROMPT_TOKENS, seed=PROFILE_SEED
    )
    trace = acceptance_trace(target_dir, drafter_dir, acc_prompts, ks, size["acceptance_tokens"])
    say(
        f"tree acceptance: {size['tree_prompts']} prompts x {size['tree_tokens']} tokens, "
        f"static trees of 2K nodes at K {','.join(map(str, ks))}, in process"
    )
    tree_trace = tree_acceptance_trace(
        target_dir, drafter_dir, acc_prompts[: size["tree_prompts"]], ks, size["tree_tokens"]
    )
    # the profiled widths, and 8 bits always (a table needs a width; in process, cheap)
    quant = sorted({8} | {int(b) for _, b in plans if int(b) != 32}, reverse=True)
    say(
        f"wire quality: {size['quality_prompts']} prompts x {size['quality_tokens']} tokens at "
        f"{', '.join(map(str, [32, *quant]))} bits, K={QUALITY_K}, in process"
    )
    from wansim.real.wire_quality import activation_quality

    quality_rows = activation_quality(
        target_dir,
        drafter_dir,
        acc_prompts[: size["quality_prompts"]],
        bits=(32, *quant),
        stages=2,
        k=QUALITY_K,
        max_new_tokens=size["quality_tokens"],
    )
    quality = quality_table(
        quality_rows,
        target=f"{Path(target_dir).name} with {Path(drafter_dir).name}, 2 stages",
        provenance=(
            f"wansim calibrate profile: wansim.real.wire_quality.activation_quality on "
            f"{size['quality_prompts']} prompts x {size['quality_tokens']} tokens, K = "
            f"{QUALITY_K}, against the fp32 target"
        ),
    )
    import yaml

    def profile_yaml(frame: pd.DataFrame, what: str) -> str:
        return fitted_profile_text(
            frame,
            Path(drafter_dir).name,
            Path(target_dir).name,
            f"wansim calibrate profile: {what}",
        )

    profile_text = profile_yaml(trace, "chain traces")
    mtp_files, mtp_trace = None, None
    if mtp_dir:
        say(
            f"MTP head acceptance: {size['tree_prompts']} prompts x {size['tree_tokens']} tokens "
            f"at K {','.join(map(str, ks))}, in process"
        )
        mtp_trace = mtp_acceptance_trace(
            target_dir, mtp_dir, acc_prompts[: size["tree_prompts"]], ks, size["tree_tokens"]
        )
        mtp_rows = pd.concat(mtp_draft, ignore_index=True)
        mtp_stage_rows = pd.concat(mtp_stage, ignore_index=True)
        mtp_files = (mtp_rows, profile_yaml(mtp_trace, "MTP-head traces"))
    tree_text = profile_yaml(tree_trace, "static-tree traces (2 candidates at depth 1)")
    import json

    tcfg = json.loads((Path(target_dir) / "config.json").read_text())
    loads = [x for r in results for x in r["load"]]
    manifest = {
        "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": {
            "target": Path(target_dir).name,
            "target_config_sha256": config_sha256(target_dir),
            "layers": int(tcfg["num_hidden_layers"]),
            "hidden_size": int(tcfg["hidden_size"]),
            "vocab_size": int(tcfg["vocab_size"]),
            "drafter": Path(drafter_dir).name,
            "drafter_kind": "draft_model",
            "drafter_config_sha256": config_sha256(drafter_dir),
        },
        "profiled": {
            "stages": 2,
            "plans": [
                {
                    "layer_split": [list(s) for s in r["splits"]],
                    "bits": r["bits"],
                    "load_avg_1min": list(r["load"]),
                }
                for r in results
            ],
            "ks": list(ks),
            "latency_ms": LATENCY_MS,
            "bandwidth_mbps": BANDWIDTH_MBPS,
            "prompts": size["prompts"],
            "tokens": size["tokens"],
            "prompt_tokens": PROMPT_TOKENS,
            "prompt_seed": PROFILE_SEED,
            "verifier": "greedy",
            "quick": bool(quick),
            "load_avg_1min": {"min": min(loads), "max": max(loads)},
            "seconds": round(time.perf_counter() - t0, 1),
            # the cores every stage process shares (the predictions' model.host_cores)
            "host_cores": len(os.sched_getaffinity(0)),
        },
        "stage_cost": fit_stage_cost(stage),  # the draft model's pipelines only
        "drafter": fit_drafter(draft),
        "message": fit_messages(hops),
        "acceptance": {
            "ks": list(ks),
            "max_k": max(ks),
            "steps": len(trace),
            "prompts": size["acceptance_prompts"],
            "tokens": size["acceptance_tokens"],
            "tau_by_k": {int(k): float((g["accepted"] + 1).mean()) for k, g in trace.groupby("k")},
        },
        "tree": {
            "shape": "static: 2 candidates at depth 1, then one child per node to depth K",
            "nodes_by_k": {int(k): 2 * int(k) for k in ks},
            "plan": [list(s_) for s_ in plans[tree_plan][0]],
            "steps": len(tree_trace),
            "prompts": size["tree_prompts"],
            "tokens": size["tree_tokens"],
            "tau_by_k": {
                int(k): float((g["accepted"] + 1).mean()) for k, g in tree_trace.groupby("k")
            },
        },
        "activation_quality": {
            "k": QUALITY_K,
            "prompts": size["quality_prompts"],
            "tokens": size["quality_tokens"],
            "bits": quality["bits"],
        },
        "dimensions": {
            "tokens_per_pass": sorted(int(n) for n in stage["n_tokens"].unique()),
            "drafter": "chain K drafts and static trees of 2K nodes (width_ms per extra node)",
            "concurrency": "not profiled: the engines queue the profiled per-pass and "
            "per-message costs of several requests (the real path keeps one KV cache per "
            "request and serves passes one at a time)",
            "batch": f"profiled: batched passes of {', '.join(map(str, BATCH_BLOCKS))} "
            "requests on the 1+5 and 5+1 pipelines (batch)"
            if batch_jobs
            else "not profiled (no 1+5 or 5+1 fp32 plan)",
            "mtp": "profiled: the MTP head's drafting per K and acceptance (mtp)"
            if mtp_dir
            else "not profiled (profile with --mtp)",
        },
    }
    if idle_fit is not None:
        manifest["idle_cost"] = idle_fit
    batch_rows = pd.concat(batch_jobs, ignore_index=True) if batch_jobs else None
    if batch_rows is not None:
        manifest["batch"] = fit_batch(batch_rows, manifest["stage_cost"], manifest["drafter"])
    if mtp_dir:
        import hashlib

        manifest["mtp"] = {
            "name": Path(mtp_dir).name,
            "mtp_config_sha256": hashlib.sha256(
                (Path(mtp_dir) / "mtp_config.json").read_bytes()
            ).hexdigest(),
            "plan": [list(s_) for s_ in REFERENCE_SPLIT],
            "drafter": fit_drafter(mtp_files[0]),
            "fixed_ms": fit_mtp_fixed(mtp_stage_rows, manifest["stage_cost"]),
            "steps": len(mtp_trace),
            "tau_by_k": {
                int(k): float((g["accepted"] + 1).mean()) for k, g in mtp_trace.groupby("k")
            },
        }
    per_k = {}  # each profiled K's own fit (Bundle.profile_at)
    for kind, frame in (("chain", trace), ("tree", tree_trace), ("mtp", mtp_trace)):
        if frame is None:
            continue
        for k in ks:
            name = f"acceptance_profile_{kind}_k{k}.yaml"
            per_k[name] = per_k_profile_text(
                frame,
                kind,
                k,
                Path(drafter_dir).name,
                Path(target_dir).name,
                f"wansim calibrate profile: {kind} traces",
            )
            manifest["acceptance"].setdefault("per_k", {}).setdefault(kind, {})[int(k)] = name
    write_bundle(
        out,
        manifest,
        {
            "stage_passes": pd.concat([stage, *mtp_stage], ignore_index=True),
            "drafter": draft,
            "emulator_error": hops,
        },
        profile_text,
        tree_text=tree_text,
        quality_text=yaml.safe_dump(quality, sort_keys=False),
        mtp=mtp_files,
        traces=pd.concat(
            [
                t.assign(drafter=kind)
                for kind, t in (("chain", trace), ("tree", tree_trace), ("mtp", mtp_trace))
                if t is not None
            ],
            ignore_index=True,
        ),
        per_k=per_k,
        idle_rows=idle_rows,
        idle_messages=idle_messages,
        batch_rows=batch_rows,
    )
    say(f"profile written to {out} in {time.perf_counter() - t0:.0f} s")
    return manifest
