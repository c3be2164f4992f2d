"""Draft trees versus the K = 7 chain: how many nodes pay, at which bandwidth and batch size.

Question: a tree of N draft nodes commits more tokens per lap than a chain (Literature review, Pluralis, compiled August–October 2026, Part X: about
+0.7 accepted tokens per step and +10-20% tokens/s at batch 1, below 1x at batch 64), but every
node costs each forward hop s_act / B and each stage its share of a b (N + 1)-token pass. Where
is the best N (the literature review's ("Literature review, Pluralis, compiled August–October 2026") bandwidth-aware tree sizing, Part III), and when does a tree lose?

Scenario: scenarios/v4pro-dspark-10stage-wan.yaml (10 stages, 25 ms per hop, DSpark drafter,
math profile from traces/reference/dspark-v4pro.yaml whose sibling model is ASSUMED - see its
generator), analytical engine, Sequoia-optimal trees built from the pooled rates (depth <= 7,
the measured positions), tokens/s of one request relative to the K = 7 chain of the same
deployment. (a) batch 1 at 0.1, 1 and 10 Gbit/s per hop; (b) continuous batches of 1, 4, 16 and 64
sequences (workload.concurrency with schedule.batching: continuous) at 10 Gbit/s. Markers: the
best N of each curve; (c) extra accepted tokens per step of the tree over the chain (batch 1).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from _common import COLORS, MARKERS, fast, save, style, sweep

BUDGETS = fast([2, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128], [4, 8, 16, 32, 64])
BANDWIDTHS = [100, 1000, 10_000]
BATCHES = [1, 4, 16, 64]


def relative(tree, chain, key):
    """Join tree rows to the chain row with the same ``key`` value: tokens/s ratio."""
    base = chain.set_index(key)["tokens_per_s"]
    return tree["tokens_per_s"].to_numpy() / base.loc[tree[key]].to_numpy()


def main() -> None:
    style()
    fixed = {"speculation.policy": "tree", "speculation.tree.kind": "sequoia"}
    bw_tree = sweep(
        "tree-sizing-bw",
        {"speculation.tree.budget_nodes": BUDGETS, "network.bandwidth_mbps": BANDWIDTHS},
        fixed,
    )
    bw_chain = sweep("tree-sizing-bw-chain", {"network.bandwidth_mbps": BANDWIDTHS})
    batch_fixed = {"schedule.batching": "continuous", "network.bandwidth_mbps": 10_000}
    b_tree = sweep(
        "tree-sizing-batch",
        {"speculation.tree.budget_nodes": BUDGETS, "workload.concurrency": BATCHES},
        {**fixed, **batch_fixed},
    )
    b_chain = sweep("tree-sizing-batch-chain", {"workload.concurrency": BATCHES}, batch_fixed)

    fig, (ax_bw, ax_b, ax_tau) = plt.subplots(1, 3, figsize=(13.5, 4.0))
    for i, bw in enumerate(BANDWIDTHS):
        rows = bw_tree[bw_tree["network.bandwidth_mbps"] == bw].sort_values(
            "speculation.tree.budget_nodes"
        )
        ratio = relative(rows, bw_chain, "network.bandwidth_mbps")
        label = f"{bw / 1000:g} Gbit/s" if bw >= 1000 else f"{bw} Mbit/s"
        ax_bw.plot(
            rows["speculation.tree.budget_nodes"],
            ratio,
            color=COLORS[i],
            lw=1.8,
            marker=MARKERS[i],
            ms=3.5,
            label=label,
        )
        j = ratio.argmax()
        ax_bw.plot(
            rows["speculation.tree.budget_nodes"].iloc[j],
            ratio[j],
            marker="*",
            ms=13,
            color=COLORS[i],
            mec="black",
            mew=0.6,
            ls="none",
        )
        chain_tau = float(bw_chain.loc[bw_chain["network.bandwidth_mbps"] == bw, "tau"].iloc[0])
        if bw == 1000:
            ax_tau.plot(
                rows["speculation.tree.budget_nodes"],
                rows["tau"] - chain_tau,
                color=COLORS[i],
                lw=1.8,
                marker=MARKERS[i],
                ms=3.5,
                label="Sequoia tree - chain K = 7",
            )
    for i, b in enumerate(BATCHES):
        rows = b_tree[b_tree["workload.concurrency"] == b].sort_values(
            "speculation.tree.budget_nodes"
        )
        ratio = relative(rows, b_chain, "workload.concurrency")
        ax_b.plot(
            rows["speculation.tree.budget_nodes"],
            ratio,
            color=COLORS[i],
            lw=1.8,
            marker=MARKERS[i],
            ms=3.5,
            label=f"batch {b}",
        )
        j = ratio.argmax()
        ax_b.plot(
            rows["speculation.tree.budget_nodes"].iloc[j],
            ratio[j],
            marker="*",
            ms=13,
            color=COLORS[i],
            mec="black",
            mew=0.6,
            ls="none",
        )
    for ax in (ax_bw, ax_b):
        ax.axhline(1.0, color="black", lw=1, ls="--")
        ax.axhspan(1.10, 1.20, color="gray", alpha=0.15, lw=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tree budget N (draft nodes, root excluded)")
        ax.set_ylabel("tokens/s relative to the K = 7 chain")
    ax_bw.set_title("(a) batch 1: the best N falls with bandwidth", loc="left")
    ax_bw.legend(frameon=False, loc="lower left", title="per-hop bandwidth")
    ax_b.set_title("(b) 10 Gbit/s: the best N falls with batch", loc="left")
    ax_b.legend(frameon=False, loc="lower left")
    ax_b.text(
        0.98,
        0.97,
        "shaded: review's +10-20% at batch 1",
        transform=ax_b.transAxes,
        ha="right",
        va="top",
        fontsize=8,
        color="dimgray",
    )
    ax_tau.axhspan(0.6, 0.8, color="gray", alpha=0.15, lw=0)
    ax_tau.axhline(0.0, color="black", lw=1, ls="--")
    ax_tau.set_xscale("log", base=2)
    ax_tau.set_ylim(-0.5, None)  # N < 7 trees are shorter than the chain (far below)
    ax_tau.set_xlabel("tree budget N (draft nodes, root excluded)")
    ax_tau.set_ylabel("extra tokens committed per verify pass")
    ax_tau.set_title("(c) accepted-length gain (shaded: review's ~0.7)", loc="left")
    ax_tau.legend(frameon=False, loc="upper left")
    fig.suptitle("Sequoia trees on the 10-stage WAN reference (analytical; sibling rates assumed)")
    save(fig, "tree_sizing")


if __name__ == "__main__":
    main()
