"""Tokens/s of one request versus per-hop latency and versus pipeline depth, per policy.

Question: how fast does one request decode as the WAN gets slower or the pipeline deeper, and
how much of that does speculation win back? Every token pays a lap of link latencies without
speculation; a verified block of K drafts divides the laps by tau.

Scenario: scenarios/v4pro-dspark-10stage-wan.yaml (DeepSeek-V4-Pro in 10 stages, 1 Gbit/s,
lognormal jitter 3 ms, DSpark drafter on the last stage, math profile from
traces/reference/dspark-v4pro.yaml, 64 requests x 256 tokens, one at a time). (a) per-hop latency
0-200 ms at 10 stages; (b) 1-32 stages at 25 ms per hop. Lines: the analytical engine; markers:
the DES at chosen points with 95% confidence intervals.

The async line is in-pipe speculation (S0 launches up to 8 blocks of K = 3 ahead of their
verdicts, drafter on S0; wansim.analytical.blocks draws it, the DES confirms it). Adding a policy
is one more ``Policy`` line below: a policy the analytical engine does not model is drawn from
the DES; DES markers appear for every policy the DES simulates.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from _common import (
    COLORS,
    MARKERS,
    Policy,
    des_supports,
    des_workload,
    errorbars,
    fast,
    plain_log_ticks,
    policy_sweep,
    save,
    style,
    sweep,
)

POLICIES = [
    Policy("no speculation", {"speculation.policy": "none"}),
    Policy("chain, K = 7", {"speculation.policy": "chain", "speculation.k": 7}),
    Policy(
        "tree, Sequoia 32 nodes",
        {
            "speculation.policy": "tree",
            "speculation.tree.kind": "sequoia",
            "speculation.tree.budget_nodes": 32,
        },
    ),
    # async in-pipe speculation needs the drafter on S0 (it drafts from its own drafts)
    Policy(
        "async chain, K = 3, 8 blocks in flight",
        {
            "speculation.policy": "chain",
            "speculation.k": 3,
            "schedule.kind": "async",
            "schedule.max_inflight_blocks": 8,
            "drafter.placement": "first_stage",
            "drafter.kind": "draft_model",
        },
    ),
]

LATENCIES = fast(
    [0, 2, 5, 10, 15, 20, 25, 30, 40, 50, 60, 80, 100, 125, 150, 175, 200], [0, 25, 100, 200]
)
DEPTHS = fast(list(range(1, 33)), [1, 4, 10, 32])
DES_LATENCIES = fast([5, 25, 80, 200], [25])
DES_DEPTHS = fast([2, 5, 10, 20, 32], [10])


def panel(ax, field, values, des_values, fixed, xlabel, title):
    for i, policy in enumerate(POLICIES):
        color, marker = COLORS[i], MARKERS[i]
        slug = f"{field.split('.')[-1]}-{i}"
        des_fixed = des_workload(64, 256)
        table, engine = policy_sweep(
            f"lat-depth-{slug}", policy, {field: values}, fixed, des_fixed=des_fixed
        )
        table = table.sort_values(field)
        ax.plot(table[field], table["tokens_per_s"], color=color, lw=1.8, label=policy.label)
        if engine == "des":  # the line is the DES itself: show its intervals
            ax.errorbar(
                table[field],
                table["tokens_per_s"],
                yerr=errorbars(table),
                fmt=marker,
                color=color,
                ms=4,
                capsize=2,
            )
            continue
        if not des_supports(policy.overrides):  # analytical only, until the DES has it
            continue
        des = sweep(
            f"lat-depth-{slug}-des",
            {field: des_values},
            {**(fixed or {}), **policy.overrides, **des_fixed},
            engine="des",
        )
        ax.errorbar(
            des[field],
            des["tokens_per_s"],
            yerr=errorbars(des),
            fmt=marker,
            mfc="white",
            color=color,
            ms=5,
            capsize=2,
            lw=0,
            elinewidth=1,
        )
    ax.set_yscale("log")
    plain_log_ticks(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tokens/s of one request (log scale)")
    ax.set_title(title, loc="left")


def main() -> None:
    style()
    fig, (ax_lat, ax_depth) = plt.subplots(1, 2, figsize=(9.6, 3.9))
    panel(
        ax_lat,
        "network.latency_ms",
        LATENCIES,
        DES_LATENCIES,
        None,
        "one-way latency per hop (ms)",
        "(a) 10 stages, latency per hop varies",
    )
    panel(
        ax_depth,
        "stages",
        DEPTHS,
        DES_DEPTHS,
        None,
        "pipeline stages (one WAN hop each)",
        "(b) 25 ms per hop, depth varies",
    )
    handles, labels = ax_lat.get_legend_handles_labels()
    marker = plt.Line2D([], [], color="gray", marker="o", mfc="white", lw=0)
    ax_lat.legend(
        [*handles, marker], [*labels, "DES, 95% interval"], loc="upper right", frameon=False
    )
    fig.suptitle("V4-Pro + DSpark (math), one request at a time: lines analytical, markers DES")
    save(fig, "tokens_vs_latency_depth")


if __name__ == "__main__":
    main()
