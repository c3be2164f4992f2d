"""The cost of a pass after an idle, measured by ``calibrate profile`` (``model.idle_cost``).

What runs: the reference 2-stage pipeline (3+3 layers, fp32, K = 4, one request) at several
link latencies (:data:`LATENCIES_MS`; the longer the links, the longer each stage idles between
its passes), the same prompts on every pipeline, prompt by prompt with the latency order
rotating. The passes are the same tokens at every latency (greedy decoding), so a pass costs
more at a longer latency only because its stage idled longer.

Per pass (:func:`idle_pass_rows`): the work a stage does after idling, and the idle before it.
Stage 0: the drafting and its pass (the verdict arrives, S0 drafts K tokens, computes and
sends), idle from its previous send to this drafting's start; stage 1: its pass (frame in ->
frame out), idle from its previous send to this frame's arrival. The first pass of each prompt
(after the prefill) is left out.

Fit (:func:`fit_idle_cost`): per latency and stage, the mean work per pass (the engines' costs
are means) less that stage's mean at the shortest latency, averaged over the two stages, at the
latency's median idle: the table's points, relative to the warmest latency (its extra is 0 by
construction; a negative difference is clamped at 0). ``reference``: the table's extra at the
idle of the bundle's own passes (``profiling.LATENCY_MS``), which the bundle's fitted costs
already hold and a prediction takes off them before the engines add the cell's own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LATENCIES_MS = (0.0, 5.0, 20.0, 50.0, 100.0)
QUICK_LATENCIES_MS = (5.0, 50.0)
K = 4
COLUMNS = ("latency_ms", "prompt_index", "stage", "idle_ms", "work_ms")


def idle_pass_rows(steps: pd.DataFrame, stage1: pd.DataFrame, latency_ms: float) -> pd.DataFrame:
    """One row per measured pass (module docstring) of one job: ``steps`` (the job's steps:
    prompt_index, step, start_ns, sent_ns) and ``stage1`` (its raw stage-1 rows: prompt, pos,
    recv_ns, sent_ns; ``pos == 0`` the prefill)."""
    rows = []
    s = steps.sort_values(["prompt_index", "step"])
    for p, g in s.groupby("prompt_index", sort=True):
        start = g["start_ns"].to_numpy(float)
        sent = g["sent_ns"].to_numpy(float)
        for i in range(1, len(g)):  # step 0 follows the prefill
            idle, work = start[i] - sent[i - 1], sent[i] - start[i]
            rows.append((latency_ms, int(p), 0, idle / 1e6, work / 1e6))
    key = "prompt_index" if "prompt_index" in stage1.columns else None
    groups = stage1.groupby(key, sort=True) if key else [(0, stage1)]
    for p, g in groups:
        g = g.sort_values("recv_ns")
        recv = g["recv_ns"].to_numpy(float)
        sent = g["sent_ns"].to_numpy(float)
        decode = (g["pos"] > 0).to_numpy()
        for i in range(1, len(g)):
            if decode[i] and decode[i - 1]:  # (the first decode pass follows the prefill)
                idle, work = recv[i] - sent[i - 1], sent[i] - recv[i]
                rows.append((latency_ms, int(p), 1, idle / 1e6, work / 1e6))
    return pd.DataFrame(rows, columns=list(COLUMNS))


ROLES = {"drafting": 0, "pass": 1}  # stage 0 drafts, then its pass; stage 1: a pass


def _table(idle: pd.Series, extra: pd.Series, lats, reference_latency_ms: float) -> dict:
    """Points [median idle, extra] per latency (idle strictly increasing) and the reference."""
    points = sorted([round(float(idle[lat]), 4), round(float(extra[lat]), 4)] for lat in lats)
    xs = np.array([p[0] for p in points])
    keep = np.concatenate([[True], np.diff(xs) > 0])  # (idle strictly increasing)
    points = [p for p, k in zip(points, keep, strict=True) if k]
    ref_idle = float(idle[reference_latency_ms]) if reference_latency_ms in idle.index else None
    ref_extra = (
        float(np.interp(ref_idle, [p[0] for p in points], [p[1] for p in points]))
        if ref_idle is not None
        else 0.0
    )
    return {"points": points, "reference_idle_ms": ref_idle, "reference_extra_ms": ref_extra}


def _over_shortest(rows: pd.DataFrame, by: str, value: str, what: str):
    """(the latencies in order, per latency and ``by`` the mean ``value`` less the shortest
    latency's); a ValueError naming ``what`` without two latencies."""
    if rows.empty or rows["latency_ms"].nunique() < 2:
        raise ValueError(f"the idle cost needs {what} at two link latencies or more")
    lats = sorted(rows["latency_ms"].unique())
    mean = rows.groupby(["latency_ms", by])[value].mean().unstack(by)
    return lats, mean - mean.loc[lats[0]]


MESSAGE_COLUMNS = ("latency_ms", "prompt_index", "role", "idle_ms", "error_ms")


def idle_message_rows(passes: pd.DataFrame, latency_ms: float) -> pd.DataFrame:
    """One row per verify pass (after the first of its prompt) and hop: the hop's role
    (forward | return), its per-message cost (``hop{h}_error_ms``: achieved less scheduled
    delay, :func:`wansim.calibrate.measure.decompose`) and its sender's idle before it: one
    message a lap, so the lap less that cost (the serialisation, ~0.04 ms at 1000 Mbit/s,
    left in)."""
    v = passes[(passes["kind"] == "verify") & (passes["step"] > 0)]
    rows = []
    for h, role in ((0, "forward"), (1, "return")):
        for lap, err in zip(v["lap_ms"], v[f"hop{h}_error_ms"], strict=True):
            if np.isfinite(lap) and np.isfinite(err):
                rows.append((latency_ms, 0, role, float(lap - err), float(err)))
    return pd.DataFrame(rows, columns=list(MESSAGE_COLUMNS))


def fit_message_idle_cost(rows: pd.DataFrame, reference_latency_ms: float) -> dict:
    """A message after its hop's sender idled: per latency, the mean per-message cost less
    the shortest latency's (the mean of the two hop roles' differences, clamped at 0), at the
    median idle; the reference at the bundle's own latency (module docstring)."""
    lats, by_role = _over_shortest(rows, "role", "error_ms", "messages")
    extra = by_role.mean(axis=1).clip(lower=0.0)
    idle = rows.groupby("latency_ms")["idle_ms"].median()
    return _table(idle, extra, lats, reference_latency_ms)


def fit_idle_cost(rows: pd.DataFrame, reference_latency_ms: float) -> dict:
    """The table of [idle ms, extra ms] points and the reference (module docstring), pooled
    over the two stages, and per role (``stages``: ``drafting``, stage 0's drafting and pass,
    and ``pass``, stage 1's pass, each at its own median idle); ``host``: the same per role at
    the host's idle before the pass (``model.idle_follows: host``: every stage on one host),
    the hop into the stage: half its median idle less the other stage's mean work."""
    lats, extra_by_stage = _over_shortest(rows, "stage", "work_ms", "passes")
    extra = extra_by_stage.mean(axis=1).clip(lower=0.0)
    idle = rows.groupby("latency_ms")["idle_ms"].median()
    pooled = _table(idle, extra, lats, reference_latency_ms)
    stage_idle = rows.groupby(["latency_ms", "stage"])["idle_ms"].median().unstack("stage")
    roles = {
        role: _table(stage_idle[s], extra_by_stage[s].clip(lower=0.0), lats, reference_latency_ms)
        for role, s in ROLES.items()
        if s in extra_by_stage.columns
    }
    # the host's idle before a stage's pass (model.idle_follows host): the hop into it. The
    # stage's own idle spans its outgoing hop, the other stage's work and that hop; the two
    # hops alike (their frames differ by < 0.1 ms at the profile's 1000 Mbit/s): half the rest
    work = rows.groupby(["latency_ms", "stage"])["work_ms"].mean().unstack("stage")
    host = {}
    if set(work.columns) == {0, 1}:
        for role, s in ROLES.items():
            into = ((stage_idle[s] - work[1 - s]) / 2).clip(lower=0.0)
            host[role] = _table(into, extra_by_stage[s].clip(lower=0.0), lats, reference_latency_ms)
    return {
        **pooled,
        "latencies_ms": [float(x) for x in lats],
        "stages": roles,
        "host": host,
        "extra_ms_by_stage": {
            int(s): [round(float(extra_by_stage.at[lat, s]), 4) for lat in lats]
            for s in extra_by_stage.columns
        },
        "passes": len(rows),
        "k": K,
    }
