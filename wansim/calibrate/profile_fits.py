"""The profile bundle's timing fits (pure functions, tested on synthetic data): the profiling
runs' records as one row per stage per pass, per hop frame and per batched pass, then a
stage's cost per pass by non-negative least squares on its role, layers and tokens (the middle
role from a 3-stage plan's middle stage, else from the last stage's parts), drafting linear in
K and tree width, a batched pass's cost per request beyond the first, and each hop's
per-message cost (the runs: :mod:`wansim.calibrate.profiling`; the bundle's model:
:mod:`wansim.calibrate.bundle`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from wansim.calibrate.bundle import ROLES
from wansim.stages.profiled_cost import CODEC_OPS, stage_role


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
    (:func:`codec_cost_per_op`, one op per role), on a fixed cost and a cost per token per
    role, layers and layers*n; prefill on a fixed cost per role and layers. The middle role is
    fitted like the others where the rows have middle stages (a 3-stage plan); else it is
    derived (:func:`_middle`: the last stage without verifying, and the first stage's cost per
    token, since neither runs the LM head or the verifier). Rows of the MTP head's pipeline
    (``drafter_kind`` mtp) are left out. Returns the bundle's ``stage_cost`` mapping (+
    ``fit_rmse_ms``, ``middle``: measured | derived)."""
    if "drafter_kind" in rows.columns:
        rows = rows[rows["drafter_kind"] != "mtp"]
    codec = codec_cost_per_op(rows)
    v = rows[rows["kind"] == "verify"]
    roles = [r for r in ROLES if (v["role"] == r).any()]
    v = v[v["role"].isin(roles)]
    is_role = [(v["role"] == r).to_numpy(float) for r in roles]
    layers = v["layers"].to_numpy(float)
    n = v["n_tokens"].to_numpy(float)
    # the codec's ops beyond fp32's: one per role here, two at a middle stage
    ops = v["role"].map(CODEC_OPS).to_numpy(float)
    x = np.column_stack([*is_role, layers, *(m * n for m in is_role), layers * n])
    y = v["service_ms"].to_numpy(float) - ops * v["bits"].map(lambda b: codec[int(b)]).to_numpy(
        float
    )
    coef = nonnegative_least_squares(x, y)
    rmse = float(np.sqrt(np.mean((x @ coef - y) ** 2)))
    r_n = len(roles)
    fixed = {r: float(coef[i]) for i, r in enumerate(roles)}
    per_token = {r: float(coef[r_n + 1 + i]) for i, r in enumerate(roles)}
    measured = "middle" in roles
    if not measured:
        fixed["middle"] = _middle(fixed["last"], rows, "verify")
        per_token["middle"] = per_token["first"]
    out = {
        "fixed_ms": {r: fixed[r] for r in ROLES},
        "per_layer_ms": float(coef[r_n]),
        "per_token_ms": {r: per_token[r] for r in ROLES},
        "per_layer_token_ms": float(coef[-1]),
        "codec_ms_per_op": codec,
        "middle": "measured" if measured else "derived",
        "fit_rmse_ms": rmse,
        "verify_passes": len(y),
    }
    pre = rows[(rows["kind"] == "prefill") & rows["role"].isin(roles)]
    pre = pre[pre["bits"] == 32] if (pre["bits"] == 32).any() else pre
    p_roles = [r for r in roles if (pre["role"] == r).any()]
    xp = np.column_stack(
        [*((pre["role"] == r).to_numpy(float) for r in p_roles), pre["layers"].to_numpy(float)]
    )
    cp = nonnegative_least_squares(xp, pre["service_ms"].to_numpy(float))
    pfixed = {r: float(cp[i]) for i, r in enumerate(p_roles)}
    if "middle" not in p_roles:
        pfixed["middle"] = _middle(pfixed["last"], rows, "prefill")
    out["prefill"] = {
        "fixed_ms": {r: pfixed[r] for r in ROLES},
        "per_layer_ms": float(cp[-1]),
        "passes": len(pre),
    }
    return out


def _middle(fixed_last: float, rows: pd.DataFrame, kind: str) -> float:
    """A middle stage (where no plan has one) = the last stage without verifying + stage 0's
    fp32 encode."""
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
