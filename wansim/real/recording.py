"""What a real run records, assembled from the processes' raw per-pass logs (no torch here).

Raw logs (``RUN/raw/``, appended and flushed per row by the processes, so a failed run keeps
them; their columns are the record types of :mod:`wansim.real.records`): ``steps.csv`` (stage 0: one row per verify step), ``stage{i}.csv`` (one row per pass
through stage i), ``link{h}.csv`` (one row per frame through hop h's relay).

Per job (``RUN/<name>/``):

- ``trace.csv``: the acceptance trace (``workload, prompt_id, step, k, accepted`` with
  ``# key: value`` metadata; a tree run adds ``accepted_ranks, walk_children`` and its ``k`` is
  the tree's depth), written and fitted by ``wansim.acceptance.trace``;
  ``profile.yaml`` the profile fitted from it (k >= 1 only);
- ``compute_table.csv``: per stage (and ``drafter``), tokens in the pass -> median/p10/p90 ms;
- ``steps.csv``: stage 0's step rows; ``draft_stage`` says where the step's drafts were made
  (0: draft model; P-1: MTP head, whose ``draft_ms`` is taken from the last stage's row of the
  previous pass, after which it drafted them: that time sits in the previous step's lap);
- ``links.csv``: per hop, frames and bytes per pass, scheduled vs achieved one-way delay of the
  pass's activation (or verdict) frame, and the emulator's error (achieved - scheduled);
- ``summary.json``: wansim.results.metric_names names measured for real (``tokens_per_s``, ``tau``,
  ``lap_ms_p50``...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from wansim.real.frames import Kind  # numpy only: the wire's frame kinds, defined once

HIDDEN_KIND = int(Kind.HIDDEN)
VERDICT_KIND = int(Kind.VERDICT)


@dataclass(frozen=True)
class RunResult:
    """One job's measurements. ``outputs`` maps prompt id -> generated token ids."""

    name: str
    job: int
    out_dir: str
    outputs: dict[int, list[int]]
    steps: pd.DataFrame
    trace: pd.DataFrame
    compute_table: pd.DataFrame
    links: pd.DataFrame
    summary: dict
    paths: dict[str, str] = field(default_factory=dict)


def _read(path: Path) -> pd.DataFrame:
    if not path.is_file():
        return pd.DataFrame()
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def read_raw(raw_dir: Path, stages: int) -> dict[str, pd.DataFrame]:
    """All raw logs of a pipeline: ``steps``, ``stage{i}``, ``link{h}``."""
    out = {"steps": _read(raw_dir / "steps.csv"), "cancelled": _read(raw_dir / "cancelled.csv")}
    for i in range(stages):
        out[f"stage{i}"] = _read(raw_dir / f"stage{i}.csv")
        out[f"link{i}"] = _read(raw_dir / f"link{i}.csv")
    return out


def compute_table(raw: dict[str, pd.DataFrame], stages: int, passes: set[int]) -> pd.DataFrame:
    """Per stage: n tokens in the pass -> median / p10 / p90 compute ms (and the drafter by k)."""
    rows = []
    for i in range(stages):
        df = raw[f"stage{i}"]
        if df.empty:
            continue
        df = df[df["pass"].isin(passes)]
        for n, g in df.groupby("n_tokens"):
            ms = g["compute_ms"].to_numpy(float)
            rows.append(
                {
                    "stage": str(i),
                    "n_tokens": int(n),
                    "count": len(ms),
                    "median_ms": float(np.median(ms)),
                    "p10_ms": float(np.percentile(ms, 10)),
                    "p90_ms": float(np.percentile(ms, 90)),
                    "codec_ms": float(g["codec_ms"].median()),
                    "verify_ms": float(g["verify_ms"].median()),
                }
            )
    steps = raw["steps"]
    if not steps.empty:
        steps = steps[steps["pass"].isin(passes)]
        by = "nodes" if "nodes" in steps else "k"  # drafted tokens per pass (trees: nodes)
        for k, g in steps.groupby(by):
            if int(k) == 0:
                continue
            ms = g["draft_ms"].to_numpy(float)
            rows.append(
                {
                    "stage": "drafter",
                    "n_tokens": int(k),
                    "count": len(ms),
                    "median_ms": float(np.median(ms)),
                    "p10_ms": float(np.percentile(ms, 10)),
                    "p90_ms": float(np.percentile(ms, 90)),
                    "codec_ms": 0.0,
                    "verify_ms": 0.0,
                }
            )
    return pd.DataFrame(rows)


def link_timings(
    raw: dict[str, pd.DataFrame], stages: int, passes: set[int], links: list[dict]
) -> pd.DataFrame:
    """Per hop: bytes per pass, and scheduled vs achieved delay of the pass's main frame, over
    ``passes`` (the job's verify passes; a compute-profile job has only its own passes).

    Achieved = receiver's arrival time - sender's ``send_ns`` (both ``monotonic_ns``); scheduled
    = the relay's own schedule for that frame (arrival -> due delivery: latency + jitter +
    serialisation + FIFO queueing). Their difference is the emulator's error on this run.
    """
    rows = []
    steps = raw["steps"]
    for h in range(stages):
        rel = raw[f"link{h}"]
        dst = (h + 1) % stages
        base = {"hop": h, "src_stage": h, "dst_stage": dst, "return_hop": h == stages - 1}
        base["latency_ms"] = links[h]["latency_ms"] if h < len(links) else None
        if rel.empty:
            rows.append(base)
            continue
        rel = rel[rel["step"].isin(passes)]
        per_pass_bytes = rel.groupby("step")["bytes"].sum()
        main_kind = VERDICT_KIND if h == stages - 1 else HIDDEN_KIND
        main = rel[rel["kind"] == main_kind].set_index("step")
        if h == stages - 1:
            verdicts = steps[steps["pass"].isin(passes)].drop_duplicates("pass")
            recv = verdicts.set_index("pass")["verdict_ns"]  # a batched pass: one verdict
        else:
            st = raw[f"stage{dst}"]
            recv = (
                st[st["pass"].isin(passes)].set_index("pass")["recv_ns"] if not st.empty else None
            )
        achieved = scheduled = err = late = into = out = np.array([])
        if recv is not None and not main.empty:
            common = main.index.intersection(recv.index)
            m = main.loc[common]
            achieved = (recv.loc[common].to_numpy(float) - m["send_ns"].to_numpy(float)) / 1e6
            scheduled = (m["scheduled_ns"].to_numpy(float) - m["arrival_ns"].to_numpy(float)) / 1e6
            late = (m["delivered_ns"].to_numpy(float) - m["scheduled_ns"].to_numpy(float)) / 1e6
            err = achieved - scheduled
            into = (m["arrival_ns"].to_numpy(float) - m["send_ns"].to_numpy(float)) / 1e6
            out = (recv.loc[common].to_numpy(float) - m["delivered_ns"].to_numpy(float)) / 1e6

        def pct(a, q):
            return float(np.percentile(a, q)) if len(a) else None

        rows.append(
            {
                **base,
                "frames": len(rel),
                "passes": int(per_pass_bytes.size),
                "bytes_per_pass_mean": float(per_pass_bytes.mean())
                if len(per_pass_bytes)
                else None,
                "scheduled_ms_mean": float(scheduled.mean()) if len(scheduled) else None,
                "achieved_ms_mean": float(achieved.mean()) if len(achieved) else None,
                "achieved_ms_p50": pct(achieved, 50),
                "achieved_ms_p99": pct(achieved, 99),
                "error_ms_p50": pct(err, 50),
                "error_ms_p99": pct(err, 99),
                "error_ms_mean": float(err.mean()) if len(err) else None,
                "into_relay_ms_p50": pct(into, 50),
                "into_relay_ms_p99": pct(into, 99),
                "out_of_relay_ms_p50": pct(out, 50),
                "out_of_relay_ms_p99": pct(out, 99),
                "wake_late_ms_p50": pct(late, 50),
                "wake_late_ms_p99": pct(late, 99),
                "jitter_ms_mean": float(main["jitter_ms"].mean()) if len(main) else None,
            }
        )
    return pd.DataFrame(rows)


def summarize(
    steps: pd.DataFrame, raw: dict[str, pd.DataFrame], stages: int, passes: set[int]
) -> dict:
    """wansim.results.metric_names names, measured. Rates count every committed token of a step
    (``accepted + 1``), so ``tokens_per_s == tau / lap`` up to stage 0's bookkeeping between
    steps; outputs are cut to ``max_new_tokens`` separately."""
    if steps.empty:
        return {"steps": 0}
    lap = steps["lap_ms"].to_numpy(float)
    new = steps["new_tokens"].to_numpy(float)
    durations = []
    for _, g in steps.groupby("prompt_index"):
        durations.append((g["verdict_ns"].max() - g["start_ns"].min()) / 1e9)
    decode_s = float(sum(durations))
    busy = []
    for i in range(stages):
        st = raw[f"stage{i}"]
        st = st[st["pass"].isin(set(steps["pass"]))] if not st.empty else st
        ms = float(st["compute_ms"].sum()) if not st.empty else 0.0
        once = steps.drop_duplicates("pass")  # a batched pass drafted once for its blocks
        at = once["draft_stage"] if "draft_stage" in once else pd.Series(0, once.index)
        ms += float(once["draft_ms"][at == i].sum())
        busy.append(ms / 1e3 / decode_s if decode_s > 0 else None)
    wire = 0
    for h in range(stages):
        rel = raw[f"link{h}"]
        if not rel.empty:
            wire += int(rel[rel["step"].isin(set(steps["pass"]))]["bytes"].sum())
    k = steps["k"].to_numpy(float)
    drafted = steps["nodes"].to_numpy(float) if "nodes" in steps else k
    acc = steps["accepted"].to_numpy(float)
    util = [round(u, 4) if u is not None else None for u in busy]
    known = [u for u in busy if u is not None]
    return {
        "steps": len(steps),
        "prompts": int(steps["prompt_index"].nunique()),
        "new_tokens": int(new.sum()),
        "decode_s": decode_s,
        "tokens_per_s": float(new.sum() / decode_s) if decode_s > 0 else None,
        "throughput_tokens_per_s": float(new.sum() / decode_s) if decode_s > 0 else None,
        "tau": float(new.mean()),
        "acceptance_rate": float(acc.sum() / k.sum()) if k.sum() > 0 else None,
        "lap_ms_mean": float(lap.mean()),
        "lap_ms_p50": float(np.percentile(lap, 50)),
        "lap_ms_p99": float(np.percentile(lap, 99)),
        "tpot_ms_p50": float(np.percentile(lap / new, 50)),
        "tpot_ms_p99": float(np.percentile(lap / new, 99)),
        "draft_ms_mean": float(steps["draft_ms"].mean()),
        "stage_utilization": util,
        "bubble_fraction": float(1 - np.mean(known)) if known else None,
        "bytes_per_token": float(wire / new.sum()),
        "wasted_token_fraction": float((drafted - acc).sum() / (drafted + 1).sum()),
    }


def cancellation(raw: dict[str, pd.DataFrame], stages: int, job: int) -> dict:
    """Async jobs: blocks cancelled by a lost bet, and the work they cost: stage-tokens computed
    for them (n tokens x stages that computed them) and drafter ms spent on them."""
    c = raw.get("cancelled", pd.DataFrame())
    c = c[c["job"] == job] if not c.empty else c
    if c.empty:
        return {"cancelled_blocks": 0, "cancelled_stage_tokens": 0}
    stale = set(c["pass"])
    tokens = 0
    computed = []
    for i in range(stages):
        st = raw[f"stage{i}"]
        if st.empty:
            computed.append(0)
            continue
        rows = st[(st["job"] == job) & st["pass"].isin(stale)]
        tokens += int(rows["n_tokens"].sum())
        computed.append(len(rows))
    s0 = raw["stage0"]
    draft_ms = float(s0[(s0["job"] == job) & s0["pass"].isin(stale)]["draft_ms"].sum())
    return {
        "cancelled_blocks": len(stale),
        "cancelled_stage_tokens": tokens,
        "cancelled_computed_per_stage": computed,
        "cancelled_draft_ms": draft_ms,
    }


def _last_stage_draft_ms(steps: pd.DataFrame, last: pd.DataFrame, last_index: int) -> None:
    """Steps drafted at the last stage (MTP head): ``draft_ms`` := the last stage's draft time
    for them, logged on its row of the pass before (the drafts were made right after verifying
    it; stage 0 passes are numbered consecutively, one request at a time)."""
    mask = steps["draft_stage"] == last_index
    if not mask.any() or last.empty or "draft_ms" not in last:
        return
    made = last.drop_duplicates("pass").set_index("pass")["draft_ms"]
    prev = steps.loc[mask, "pass"] - 1
    steps.loc[mask, "draft_ms"] = prev.map(made).fillna(0.0).to_numpy(float)


def write_job(
    out_dir: Path,
    name: str,
    job: int,
    raw_dir: Path,
    stages: int,
    meta: dict,
    outputs: dict,
    links: list[dict],
) -> RunResult:
    """Assemble and write one job's files (also after a failure: whatever was recorded)."""
    from wansim.acceptance.trace import TREE_COLUMNS, fit_profile, write_trace

    out_dir.mkdir(parents=True, exist_ok=True)
    raw = read_raw(raw_dir, stages)
    if not raw["steps"].empty and "draft_stage" in raw["steps"]:
        _last_stage_draft_ms(raw["steps"], raw[f"stage{stages - 1}"], stages - 1)
    steps = raw["steps"]
    steps = steps[steps["job"] == job].copy() if not steps.empty else steps
    passes = set(steps["pass"]) if not steps.empty else set()
    for i in range(stages):  # the job's prefill passes count for the compute table too
        st = raw[f"stage{i}"]
        if not st.empty:
            passes |= set(st[st["job"] == job]["pass"])
    paths = {}
    columns = ["workload", "prompt_id", "step", "k", "accepted"]
    if not steps.empty and meta.get("tree", "none") != "none":
        columns += list(TREE_COLUMNS)  # a tree run: the sibling ranks of each walk
    trace = (
        steps.loc[:, columns].reset_index(drop=True)
        if not steps.empty
        else pd.DataFrame(columns=columns)
    )
    if len(trace):
        paths["trace"] = str(out_dir / "trace.csv")
        write_trace(trace, paths["trace"], meta)
        if int(trace["k"].min()) >= 1:
            from wansim.acceptance.profile import write_profile

            prof = fit_profile(
                trace,
                drafter=str(meta.get("drafter", "unknown")),
                target=str(meta.get("target", "unknown")),
                temperature=float(meta.get("temperature", 0.0)),
                verifier=str(meta.get("verifier", "greedy")),
                provenance=f"wansim real run {meta.get('run', '')} job {job}",
                source="measured",
            )
            paths["profile"] = str(out_dir / "profile.yaml")
            write_profile(prof, paths["profile"], "measured by the real execution path")
    steps_out = steps
    ct = compute_table(raw, stages, passes)
    decode_passes = set(steps["pass"]) if not steps.empty else set()
    lt = link_timings(raw, stages, decode_passes or passes, links)
    summary = summarize(steps, raw, stages, decode_passes)
    summary.update(cancellation(raw, stages, job))
    if int(meta.get("concurrency", 1)) > 1 and not steps.empty:
        # requests overlap: throughput is all tokens over the job's span; tokens_per_s stays
        # the per-request rate (tokens over the sum of each request's own decode time)
        span_s = (steps["verdict_ns"].max() - steps["start_ns"].min()) / 1e9
        summary["throughput_tokens_per_s"] = float(steps["new_tokens"].sum() / span_s)
    summary["meta"] = meta
    for fname, df in (("compute_table.csv", ct), ("links.csv", lt), ("steps.csv", steps_out)):
        df.to_csv(out_dir / fname, index=False)
        paths[fname.removesuffix(".csv")] = str(out_dir / fname)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (out_dir / "outputs.json").write_text(json.dumps(outputs) + "\n")
    paths["summary"] = str(out_dir / "summary.json")
    return RunResult(
        name=name,
        job=job,
        out_dir=str(out_dir),
        outputs={int(k): list(v) for k, v in outputs.items()},
        steps=steps_out,
        trace=trace,
        compute_table=ct,
        links=lt,
        summary=summary,
        paths=paths,
    )


def locate_stall(raw_dir: Path, stages: int, pass_id: int) -> tuple[int | None, int | None, str]:
    """Where did pass ``pass_id`` stop? (stage, hop, words) from the raw logs."""
    raw = read_raw(raw_dir, stages)
    for h in range(stages):
        dst = (h + 1) % stages
        rel = raw[f"link{h}"]
        delivered = not rel.empty and bool((rel["step"] == pass_id).any())
        if h < stages - 1:
            st = raw[f"stage{dst}"]
            reached = not st.empty and bool((st["pass"] == pass_id).any())
        else:
            reached = False
        if not reached:
            if not delivered:
                return (
                    h,
                    h,
                    f"stage {h} processed pass {pass_id} but hop {h} (stage {h} -> stage {dst}) "
                    "never delivered it: stalled link",
                )
            if h < stages - 1:
                return (
                    dst,
                    h,
                    f"hop {h} delivered pass {pass_id} to stage {dst}, which never finished it: "
                    "stalled stage",
                )
            return h, h, f"the return hop {h} delivered the verdict of pass {pass_id} late"
    return None, None, f"pass {pass_id} went around; cause unknown"
