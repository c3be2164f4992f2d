"""Serving many users: throughput against each user's TPOT p99 as users grow, with and without
micro-batched pipeline parallelism.

Question: as 1..128 users share a 10-stage WAN pipeline, how much throughput does each
speculation policy deliver, and at what cost to every user's tail time per output token? One
continuous batch leaves most stages idle (only the stage holding the batch works); micro-batches
(one per stage, chunked prefill sharing the passes) keep several stages busy at once. Where does
each policy sit on the throughput / TPOT-p99 frontier, and do the two engines agree?

Scenario: scenarios/v4pro-dspark-10stage-wan.yaml (10 stages, 25 ms per hop, 1 Gbit/s,
lognormal jitter 3 ms, DSpark K = 7 on the math profile), 512-token prompts, 128-token outputs,
a closed loop of U = 1..128 users (3 U + 40 requests per run). Lines: chain (K = 7) and a
Sequoia tree of 16 nodes, each with one continuous batch (micro-batching off) and with 10
micro-batches and a 256-token prefill chunk (on); async in-pipe speculation (4 blocks in
flight, a draft model on S0) with one micro-batch per request (async keeps its own blocks in
flight: micro-batches are refused with it). Solid/dashed lines: the analytical engine (open
symbols on it where its result is not validated); filled/open markers: the DES, on the same
axes.
"""

from __future__ import annotations

import csv

import matplotlib.pyplot as plt
from _common import COLORS, MARKERS, OUT, REFERENCE, fast, plain_log_ticks, save, style

from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.sim import simulate

MICRO = {
    "schedule.batching": "continuous",
    "schedule.micro_batches": 10,
    "schedule.prefill_chunk_tokens": 256,
}
ONE_BATCH = {"schedule.batching": "continuous"}
TREE = {"speculation.policy": "tree", "speculation.tree.budget_nodes": 16}
ASYNC = {
    "schedule.kind": "async",
    "schedule.max_inflight_blocks": 4,
    "drafter.placement": "first_stage",
    "drafter.kind": "draft_model",
}
# (label, overrides, micro-batching on)
LINES = [
    ("chain K=7", ONE_BATCH, False),
    ("chain K=7", MICRO, True),
    ("tree 16 nodes", {**TREE, **ONE_BATCH}, False),
    ("tree 16 nodes", {**TREE, **MICRO}, True),
    ("async, 4 blocks", ASYNC, False),
]
USERS = fast([1, 2, 4, 8, 16, 32, 64, 128], [1, 8, 32])
DES_USERS = fast([1, 8, 32, 128], [8, 32])
OUTPUT_TOKENS = fast(128, 48)


def point(overrides: dict, users: int):
    requests = fast(3 * users + 40, 2 * users + 8)  # enough requests for a p99 at 1 user
    return load_scenario(
        REFERENCE,
        {
            **overrides,
            "workload.concurrency": users,
            "workload.requests": requests,
            "workload.output_tokens": OUTPUT_TOKENS,
        },
    )


def main() -> None:
    style()
    fig, ax = plt.subplots(figsize=(8.6, 6.2))
    rows = []
    for i, (label, overrides, micro) in enumerate(LINES):
        color = COLORS[i // 2]  # one colour per policy
        marker = MARKERS[i // 2]
        ls = "-" if micro else "--"
        name = f"{label}, micro-batches {'on' if micro else 'off'}"
        ana = [(u, analyze(point(overrides, u))) for u in USERS]
        xs = [r.metrics["tpot_ms_p99"] for _, r in ana]
        ys = [r.metrics["throughput_tokens_per_s"] for _, r in ana]
        ax.plot(xs, ys, color=color, ls=ls, lw=1.6, label=f"{name} (analytical)")
        for (u, r), x, y in zip(ana, xs, ys, strict=True):
            valid = r.approximation["validated"]
            ax.plot(x, y, ".", color=color, ms=4 if valid else 0)
            if not valid:
                ax.plot(x, y, "x", color=color, ms=4, mew=0.8)
            if u in (1, 8, 32, 128):
                ax.annotate(f"{u}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
            rows.append(_row("analytical", name, u, r.metrics, valid))
        des = [(u, simulate(point(overrides, u))) for u in DES_USERS]
        ax.plot(
            [r.metrics["tpot_ms_p99"] for _, r in des],
            [r.metrics["throughput_tokens_per_s"] for _, r in des],
            marker,
            color=color,
            mfc=color if micro else "white",
            ms=6,
            lw=0,
            label=f"{name} (DES)",
        )
        for u, r in des:
            ax.annotate(
                f"{u}",
                (r.metrics["tpot_ms_p99"], r.metrics["throughput_tokens_per_s"]),
                textcoords="offset points",
                xytext=(-9, -9),
                fontsize=7,
                color=color,
            )
            rows.append(_row("des", name, u, r.metrics, True))
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax, "x")
    plain_log_ticks(ax, "y")
    ax.set_xlabel("TPOT p99 per user (ms per output token)")
    ax.set_ylabel("throughput (output tokens/s, all users)")
    ax.set_title(
        "Serving 1-128 users on 10 stages x 25 ms (numbers: users; x: the analytical result is"
        " not validated)",
        loc="left",
        fontsize=9,
    )
    fig.legend(frameon=False, fontsize=7.5, ncol=2, loc="outside lower center")
    save(fig, "serving_many_users")
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "serving_many_users.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _row(engine: str, line: str, users: int, m: dict, validated: bool) -> dict:
    return {
        "engine": engine,
        "line": line,
        "users": users,
        "throughput_tokens_per_s": round(m["throughput_tokens_per_s"], 3),
        "tpot_ms_p99": round(m["tpot_ms_p99"], 3),
        "tokens_per_s": round(m["tokens_per_s"], 3),
        "bubble_fraction": round(m["bubble_fraction"], 4),
        "validated": validated,
    }


if __name__ == "__main__":
    main()
