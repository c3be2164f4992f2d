"""What a real run measured, in the simulator's terms (no torch here: pandas on the run's logs).

A real job leaves, per verify pass, stage 0's step row (``steps.csv``: start, draft end, verdict
times), each stage's pass row (``raw/stage{i}.csv``: when the activation arrived, when the
stage's output left) and each relay's frame rows (``raw/link{h}.csv``: the sender's
``send_ns`` stamp, when the relay got it, when it was due). All clocks are ``monotonic_ns`` of
one machine. :func:`decompose` cuts every lap into the parts the simulator has, exactly (the
parts sum to the lap to the nanosecond):

    lap_j  = verdict_j - verdict_(j-1)                  (verify to verify, the simulator's lap;
                                                         the first from the step's start)
           = draft_j + sum_i service_i,j + sum_h hop_h,j - overlap_j

    draft      the drafter's K tokens: a draft model at stage 0 (step start -> draft end), or
               the MTP head at the last stage (its ``draft_ms`` for the pass, logged in
               ``stage{P-1}.csv``: it drafts right after verifying the pass, before the verdict
               leaves; ``steps.csv``'s ``draft_stage`` says which)
    service_0  stage 0's bookkeeping since the last verdict + its layers + encoding + sending
               the draft ids (and draft probabilities) ahead of its activation frame (with the
               MTP head: also taking the drafts that came back with the verdict)
    overlap    0, except for an async bet (a block begun before the previous verdict of its
               request): its start -> that verdict, the part of its path the lap does not
               contain; its service_0 then runs from its own start
    service_i  stage i: activation frame received -> its own output frame handed to the socket
               (decode, layers, encode; at the last stage the LM head and the verifier, and
               with the MTP head sending the drafts ahead of the verdict, drafting excluded)
    hop_h      achieved one-way delay of the pass's main frame on hop h (the activation, or the
               verdict on the return hop): sender's send stamp -> receiver has the whole frame

and ``hop_h - scheduled_h`` (the relay's own schedule: latency + serialisation + FIFO wait) is
the link emulator's error on that frame.

:func:`real_metrics` computes the metrics of wansim.results.metric_names from the same records with the simulator's
definitions (``wansim.sim.metrics``): per request M = max_new_tokens - 1 decode tokens (the
first comes from prefill; the last pass's overshoot is not counted), decode time = first step's
start (within microseconds of the prefill verdict, which stage 0 does not stamp) to the last
verdict, ``tokens_per_s`` = mean over requests of M / decode time, ``tau`` = sum M / passes,
laps verify to verify. :func:`phase1_differences` lists how that differs from the phase-1
``summary.json`` (which counts every committed token, ``accepted + 1``, and times laps from
each step's start).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wansim.numerics.intervals import t_interval

HIDDEN_KIND = 2
VERDICT_KIND = 5


def _job_rows(raw: dict[str, pd.DataFrame], key: str, passes: set[int]) -> pd.DataFrame:
    df = raw.get(key, pd.DataFrame())
    if df.empty:
        return df
    col = "pass" if "pass" in df.columns else "step"
    return df[df[col].isin(passes)]


def decompose(steps: pd.DataFrame, raw: dict[str, pd.DataFrame], stages: int) -> pd.DataFrame:
    """One row per verify pass and per prefill pass of a job (``kind`` verify | prefill).

    Columns: ``kind, prompt_index, step, pass, k, accepted, n_tokens, lap_ms, draft_ms,
    draft_stage, service{i}_ms`` for each stage, ``hop{h}_ms`` (achieved), ``hop{h}_scheduled_ms``,
    ``hop{h}_error_ms`` and ``hop{h}_bytes`` (all frames of the pass on that hop) for each hop.
    Prefill rows have the stage services and forward hops (stage 0 does not stamp the prefill
    verdict, so their return hop and lap are NaN); with the MTP head their ``draft_ms`` is the
    drafting after the prefill (the first step's drafts), out of the last stage's service.
    """
    steps = steps.sort_values(["prompt_index", "step"]).reset_index(drop=True)
    verify_passes = set(int(p) for p in steps["pass"])
    stage_rows = [raw.get(f"stage{i}", pd.DataFrame()) for i in range(stages)]
    draft_stage = draft_stage_of(steps)
    job = int(steps["job"].iloc[0]) if "job" in steps.columns and len(steps) else None
    s0 = stage_rows[0]
    if job is not None and not s0.empty:
        s0 = s0[s0["job"] == job]
    prefill_passes = set(int(p) for p in s0[s0["pos"] == 0]["pass"]) if not s0.empty else set()
    passes = verify_passes | prefill_passes

    stage_by_pass = [
        st[st["pass"].isin(passes)].set_index("pass") if not st.empty else None for st in stage_rows
    ]
    links = [_job_rows(raw, f"link{h}", passes) for h in range(stages)]
    main = []
    nbytes = []
    for h, rel in enumerate(links):
        kind = VERDICT_KIND if h == stages - 1 else HIDDEN_KIND
        if rel.empty:
            main.append(pd.DataFrame(columns=["send_ns", "arrival_ns", "scheduled_ns"]))
            nbytes.append(pd.Series(dtype=float))
            continue
        main.append(rel[rel["kind"] == kind].drop_duplicates("step").set_index("step"))
        nbytes.append(rel.groupby("step")["bytes"].sum())

    def main_send(h: int, p: int) -> float:
        m = main[h]
        return float(m.at[p, "send_ns"]) if p in m.index else np.nan

    def recv(i: int, p: int) -> float:
        st = stage_by_pass[i]
        return float(st.at[p, "recv_ns"]) if st is not None and p in st.index else np.nan

    def drafted_after(p: int) -> float:
        """The last stage's drafting right after verifying pass p (MTP head), else 0."""
        st = stage_by_pass[stages - 1]
        if draft_stage != stages - 1 or st is None or p not in st.index:
            return 0.0
        return float(st.at[p, "draft_ms"])

    rows = []
    prev_verdict: dict[int, float] = {}
    first_start: dict[int, float] = {}
    for r in steps.to_dict("records"):
        first_start.setdefault(int(r["prompt_index"]), float(r["start_ns"]))
        row = _verify_row(r, stages, main_send, recv, main, nbytes, prev_verdict)
        if draft_stage == stages - 1:  # stage 0 only took the returned drafts: bookkeeping
            row["service0_ms"] += row["draft_ms"]
            row["draft_ms"] = drafted_after(row["pass"])
            row[f"service{stages - 1}_ms"] -= row["draft_ms"]
        row["draft_stage"] = draft_stage
        rows.append(row)
    prefills = s0[s0["pos"] == 0].sort_values("pass") if not s0.empty else s0
    for j, r in enumerate(prefills.to_dict("records")):
        p = int(r["pass"])
        start = float(r["start_ns"])
        end = first_start.get(j, np.nan)  # the prefill verdict is within microseconds of it
        row = {
            "kind": "prefill",
            "prompt_index": j,
            "step": -1,
            "pass": p,
            "k": 0,
            "accepted": 0,
            "n_tokens": int(r["n_tokens"]),
            "start_ns": start,
            "end_ns": end,
            "lap_ms": (end - start) / 1e6,
            "draft_ms": drafted_after(p),
            "draft_stage": draft_stage,
            "service0_ms": (main_send(0, p) - start) / 1e6,
        }
        for i in range(1, stages):
            row[f"service{i}_ms"] = (main_send(i, p) - recv(i, p)) / 1e6
        row[f"service{stages - 1}_ms"] -= row["draft_ms"]
        for h in range(stages):
            dst_recv = recv(h + 1, p) if h < stages - 1 else np.nan
            _hop_fields(row, h, p, dst_recv, main_send(h, p), main, nbytes)
        rows.append(row)
    return pd.DataFrame(rows)


def draft_stage_of(table: pd.DataFrame) -> int:
    """Where the drafts were made: ``draft_stage`` of ``steps.csv`` or of :func:`decompose`'s
    table (0: the draft model at stage 0; P-1: the MTP head at the last stage). Records from
    before the column existed are the draft model's: 0."""
    if "draft_stage" not in table.columns or table.empty:
        return 0
    return int(table["draft_stage"].max())


def _hop_fields(row: dict, h: int, p: int, recv_ns: float, send_ns: float, main, nbytes) -> None:
    m = main[h]
    row[f"hop{h}_ms"] = (recv_ns - send_ns) / 1e6
    if p in m.index:
        sched = (float(m.at[p, "scheduled_ns"]) - float(m.at[p, "arrival_ns"])) / 1e6
    else:
        sched = np.nan
    row[f"hop{h}_scheduled_ms"] = sched
    row[f"hop{h}_error_ms"] = row[f"hop{h}_ms"] - sched
    row[f"hop{h}_bytes"] = float(nbytes[h].get(p, np.nan)) if len(nbytes[h]) else np.nan


def _verify_row(r: dict, stages, main_send, recv, main, nbytes, prev_verdict) -> dict:
    prompt = int(r["prompt_index"])
    p = int(r["pass"])
    start, draft_end, verdict = (
        float(r["start_ns"]),
        float(r["draft_end_ns"]),
        float(r["verdict_ns"]),
    )
    before = prev_verdict.get(prompt, start)  # the first step: from its own start
    prev_verdict[prompt] = verdict
    row = {
        "kind": "verify",
        "prompt_index": prompt,
        "step": int(r["step"]),
        "pass": p,
        "k": int(r["k"]),
        "accepted": int(r["accepted"]),
        "n_tokens": int(r["k"]) + 1,
        "start_ns": before,
        "end_ns": verdict,
        "lap_ms": (verdict - before) / 1e6,
        "draft_ms": (draft_end - start) / 1e6,
    }
    verdict_send = float(r["send_ns_verdict"])
    # an async bet began before the verdict the lap starts at: its stage-0 service runs from
    # its own start, and the part of its path before that verdict is the lap's overlap
    began = min(start, before)
    row["overlap_ms"] = (before - began) / 1e6
    row["service0_ms"] = (main_send(0, p) - began) / 1e6 - row["draft_ms"]
    for i in range(1, stages):
        send_i = verdict_send if i == stages - 1 else main_send(i, p)
        row[f"service{i}_ms"] = (send_i - recv(i, p)) / 1e6
    for h in range(stages):
        send_h = verdict_send if h == stages - 1 else main_send(h, p)
        dst_recv = verdict if h == stages - 1 else recv(h + 1, p)
        _hop_fields(row, h, p, dst_recv, send_h, main, nbytes)
    return row


def verify_rows(passes: pd.DataFrame) -> pd.DataFrame:
    return passes[passes["kind"] == "verify"]


def real_metrics(passes: pd.DataFrame, stages: int, max_new_tokens: int) -> dict:
    """Metrics (wansim.results.metric_names names) of a real job with the simulator's definitions (module docstring).

    ``passes`` is :func:`decompose`'s table. ``stage_utilization`` counts each stage's service
    time (what the scenario's compute tables hold) plus drafting on the drafter's stage (stage 0
    or, for the MTP head, the last), prefill included,
    over the job's makespan (the first prefill's start to the last verdict, the gaps between
    requests included, as the simulator's makespan includes its admissions); ``ttft_ms_mean``
    is prefill start to the first step's start (the prefill verdict is not stamped; the two
    are microseconds apart).
    """
    v = verify_rows(passes)
    m = max_new_tokens - 1
    decode_ms = v.groupby("prompt_index")["lap_ms"].sum().to_numpy(float)
    rates = 1e3 * m / decode_ms
    tpot = decode_ms / m
    laps = v["lap_ms"].to_numpy(float)
    n_requests = len(decode_ms)
    n_passes = len(v)
    k = v["k"].to_numpy(float)
    acc = v["accepted"].to_numpy(float)
    pre = passes[passes["kind"] == "prefill"]
    makespan = (float(passes["end_ns"].max()) - float(passes["start_ns"].min())) / 1e6
    # a batched pass has one row per block but was served (and drafted) once
    once = passes.drop_duplicates("pass") if "pass" in passes.columns else passes
    busy = np.array(once[[f"service{i}_ms" for i in range(stages)]].sum(), dtype=float)
    busy[draft_stage_of(passes)] += float(once["draft_ms"].sum())
    util = busy / makespan
    wire = float(v[[f"hop{h}_bytes" for h in range(stages)]].to_numpy(float).sum())
    lap_p50, lap_p99 = np.quantile(laps, [0.5, 0.99])
    tpot_p50, tpot_p99 = np.quantile(tpot, [0.5, 0.99])
    return {
        "tokens_per_s": float(rates.mean()),
        "throughput_tokens_per_s": 1e3 * n_requests * max_new_tokens / makespan,
        "tau": n_requests * m / n_passes,
        "lap_ms_mean": float(laps.mean()),
        "lap_ms_p50": float(lap_p50),
        "lap_ms_p99": float(lap_p99),
        "tpot_ms_p50": float(tpot_p50),
        "tpot_ms_p99": float(tpot_p99),
        "ttft_ms_mean": float(pre["lap_ms"].mean()) if len(pre) else None,
        "bubble_fraction": float(1.0 - np.mean(util)),
        "stage_utilization": [float(u) for u in util],
        "bytes_per_token": wire / (n_requests * m),
        "wasted_token_fraction": 1.0 - n_requests * m / float((k + 1).sum()),
        "target_exact": True,
        "acceptance_rate": float(acc.sum() / k.sum()) if k.sum() > 0 else None,
        "requests": n_requests,
        "verify_passes": n_passes,
        "tokens_per_s_ci95": list(t_interval(rates)),
    }


def real_bets(steps: pd.DataFrame, cancelled: pd.DataFrame | None) -> dict:
    """The bets of an async run (``schedule: async``): a verified block with a block launched
    behind it before its verdict bet that it accepts all K drafts and its bonus equals the
    drafter's guess. Lost: the block behind was cancelled (``cancelled.csv``'s ``after_pass``);
    won: the next verified block of the request started before this one's verdict. Returns
    ``{"won", "lost", "win_rate"}`` (the rate over the bets placed; the engines' bet outcome
    is the same event, so their rate per verified block compares with it)."""
    lost_after = set()
    if cancelled is not None and len(cancelled):
        lost_after = set(zip(cancelled["prompt_index"], cancelled["after_pass"], strict=True))
    won = lost = 0
    for prompt, g in steps.sort_values(["prompt_index", "step"]).groupby("prompt_index"):
        start = g["start_ns"].to_numpy()
        verdict = g["verdict_ns"].to_numpy()
        for i, pass_id in enumerate(g["pass"].to_numpy()):
            if (prompt, pass_id) in lost_after:
                lost += 1
            elif i + 1 < len(g) and start[i + 1] < verdict[i]:
                won += 1
    placed = won + lost
    return {"won": won, "lost": lost, "win_rate": won / placed if placed else None}


def phase1_differences(summary: dict, real: dict) -> dict:
    """Phase-1 ``summary.json`` vs :func:`real_metrics` on the same job, with the reason."""
    keys = ("tokens_per_s", "tau", "lap_ms_mean", "lap_ms_p50", "lap_ms_p99", "tpot_ms_p50")
    why = {
        "tokens_per_s": "phase 1: all committed tokens (accepted + 1, overshoot included) over "
        "the summed decode time; here: mean over requests of (max_new_tokens - 1) / decode time",
        "tau": "phase 1: mean of accepted + 1 over steps; here: decode tokens (the last pass "
        "truncated to what the request needed) / passes",
        "lap_ms_mean": "phase 1: step start -> verdict; here: verdict -> verdict (adds stage "
        "0's bookkeeping between steps)",
        "lap_ms_p50": "as lap_ms_mean",
        "lap_ms_p99": "as lap_ms_mean",
        "tpot_ms_p50": "phase 1: per step, lap / (accepted + 1); here: per request, decode "
        "time / (max_new_tokens - 1)",
    }
    out = {}
    for key in keys:
        a, b = summary.get(key), real.get(key)
        if a is None or b is None:
            continue
        out[key] = {"phase1": a, "calibrate": b, "relative": (b - a) / a if a else None}
        out[key]["why"] = why[key]
    return out


def emulator_accuracy(passes: pd.DataFrame, stages: int) -> dict:
    """The link emulator's error (achieved - scheduled, ms) on the job's verify passes:
    pooled over hops and per hop (p50, p99, mean, max)."""
    v = verify_rows(passes)
    per_hop = []
    pooled = []
    for h in range(stages):
        e = v[f"hop{h}_error_ms"].dropna().to_numpy(float)
        pooled.append(e)
        per_hop.append(_summary(e))
    allv = np.concatenate(pooled) if pooled else np.array([])
    return {**_summary(allv), "per_hop": per_hop}


def _summary(e: np.ndarray) -> dict:
    if not len(e):
        return {"p50": None, "p99": None, "mean": None, "max": None, "frames": 0}
    return {
        "p50": float(np.percentile(e, 50)),
        "p99": float(np.percentile(e, 99)),
        "mean": float(e.mean()),
        "max": float(e.max()),
        "frames": len(e),
    }
