"""What an out-of-domain drafter and a fine-tuned target cost in tokens/s.

Question: Literature review, Pluralis, compiled August–October 2026, Part IX: a generic drafter loses 28-38% of its acceptance out of domain and
falls to tau ~ 1.2 on a fine-tuned target. What does that do to the decode rate of the WAN
pipeline, and which block size and tree size are still worth it?

Scenario: scenarios/v4pro-dspark-10stage-wan.yaml (DSpark math profile), analytical engine, with
drafter.acceptance.domain_shift g from 0.1 to 1 (g scales every conditional rate of the chain
and every rank's marginal in a tree). (a) tau and (b) tokens/s of one request for the K = 7
chain, the best chain (K = 1..7) and the best Sequoia tree (N = 2..64), against no speculation.
Shaded: the g that lose 28-38% of tau; dotted: the g where tau = 1.2 (both solved here, not typed).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from _common import COLORS, REFERENCE, fast, save, style, sweep

from wansim.analytical.tree_sizing import domain_shift_for
from wansim.config.scenario import load_scenario

SHIFTS = fast(list(np.round(np.linspace(0.1, 1.0, 19), 3)), [0.1, 0.2, 0.5, 0.8, 1.0])
BUDGETS = fast([2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64], [2, 4, 8, 32])


def best_over(table):
    return table.loc[table.groupby("drafter.acceptance.domain_shift")["tokens_per_s"].idxmax()]


def main() -> None:
    style()
    grid = {"drafter.acceptance.domain_shift": SHIFTS}
    chain7 = sweep("domain-chain7", grid).sort_values("drafter.acceptance.domain_shift")
    chains = sweep("domain-chains", {**grid, "speculation.k": list(range(1, 8))})
    trees = sweep(
        "domain-trees",
        {**grid, "speculation.tree.budget_nodes": BUDGETS},
        {"speculation.policy": "tree"},
    )
    plain = sweep(
        "domain-none", {"drafter.acceptance.domain_shift": [1.0]}, {"speculation.policy": "none"}
    )
    best_chain = best_over(chains).sort_values("drafter.acceptance.domain_shift")
    best_tree = best_over(trees).sort_values("drafter.acceptance.domain_shift")
    ref = load_scenario(REFERENCE)
    g_loss = [domain_shift_for(ref, loss, "tau") for loss in (0.28, 0.38)]
    g_ft = domain_shift_for(ref, 1.2, "to_tau")

    fig, (ax_tau, ax_rate) = plt.subplots(1, 2, figsize=(10.5, 4.0))
    g = chain7["drafter.acceptance.domain_shift"]
    ax_tau.plot(g, chain7["tau"], color=COLORS[0], lw=1.8, label="chain, K = 7")
    ax_tau.plot(
        best_tree["drafter.acceptance.domain_shift"],
        best_tree["tau"],
        color=COLORS[1],
        lw=1.8,
        label="best Sequoia tree (tokens/s)",
    )
    ax_rate.plot(g, chain7["tokens_per_s"], color=COLORS[0], lw=1.8, label="chain, K = 7")
    ax_rate.plot(
        best_chain["drafter.acceptance.domain_shift"],
        best_chain["tokens_per_s"],
        color=COLORS[2],
        lw=1.8,
        ls="-.",
        label="best chain, K = 1..7",
    )
    ax_rate.plot(
        best_tree["drafter.acceptance.domain_shift"],
        best_tree["tokens_per_s"],
        color=COLORS[1],
        lw=1.8,
        label="best Sequoia tree",
    )
    ax_rate.axhline(
        float(plain["tokens_per_s"].iloc[0]), color="black", ls="--", lw=1, label="no speculation"
    )
    for ax in (ax_tau, ax_rate):
        ax.axvspan(min(g_loss), max(g_loss), color="gray", alpha=0.18, lw=0)
        ax.axvline(g_ft, color="dimgray", ls=":", lw=1.2)
        ax.set_xlabel("domain shift g (multiplies the drafter's acceptance)")
        ax.set_xlim(0.1, 1.0)
    ax_tau.text(np.mean(g_loss), 1.15, "28-38% lost", ha="center", fontsize=8, color="dimgray")
    ax_tau.text(
        g_ft + 0.01, 2.7, "tau = 1.2\n(fine-tuned\ntarget)", fontsize=8, color="dimgray", va="top"
    )
    ax_tau.set_ylabel("tau: tokens committed per verify pass")
    ax_tau.set_ylim(1, None)
    ax_tau.set_title("(a) accepted length", loc="left")
    ax_tau.legend(frameon=False, loc="upper left")
    ax_rate.set_ylabel("tokens/s of one request")
    ax_rate.set_ylim(0, None)
    ax_rate.set_title("(b) decode rate, 10 stages at 25 ms per hop", loc="left")
    ax_rate.legend(frameon=False, loc="upper left")
    fig.suptitle("Out-of-domain drafting on the WAN reference (analytical)")
    save(fig, "domain_shift")


if __name__ == "__main__":
    main()
