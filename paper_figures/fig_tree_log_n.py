"""Accepted length of the best tree versus its node budget: logarithmic growth.

Question: how does the expected number of tokens a verify pass commits grow with the verifier's
capacity N (Literature review, Pluralis, compiled August–October 2026, Part X: accepted length is O(log N))? A chain of N drafts saturates at
1 / (1 - p); an optimal tree keeps growing, but each doubling of N only adds a near-constant
number of tokens.

Scenario: scenarios/v4pro-dspark-10stage-wan.yaml with drafter.acceptance.extrapolate: true
(the math profile's rates held beyond position 7, an assumption needed for depths > 7) and
long outputs; analytical engine. Lines: Sequoia-optimal and confidence-shaped (dynamic, per
request) trees and a chain of the same node count (K = N); dashed: the least-squares fit
tau = a + b ln N over N >= 8. Right: what each doubling of N adds.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from _common import COLORS, MARKERS, fast, save, style, sweep

from wansim.analytical.tree_sizing import loglinear_fit

BUDGETS = fast([2, 4, 8, 16, 32, 64, 128, 256], [2, 8, 32, 128])
FIXED = {"drafter.acceptance.extrapolate": True, "workload.output_tokens": 1_000_001}


def main() -> None:
    style()
    curves = {}
    for kind in ("sequoia", "dynamic"):
        table = sweep(
            f"tree-log-n-{kind}",
            {"speculation.tree.budget_nodes": BUDGETS},
            {**FIXED, "speculation.policy": "tree", "speculation.tree.kind": kind},
        ).sort_values("speculation.tree.budget_nodes")
        curves[kind] = table["tau"].to_numpy()
    chain = sweep("tree-log-n-chain", {"speculation.k": [n for n in BUDGETS if n <= 64]}, FIXED)
    chain = chain.sort_values("speculation.k")

    ns = np.asarray(BUDGETS, dtype=float)
    fig, (ax, ax_inc) = plt.subplots(1, 2, figsize=(10.5, 4.0))
    for i, (kind, label) in enumerate([("sequoia", "Sequoia tree"), ("dynamic", "dynamic tree")]):
        ax.plot(ns, curves[kind], color=COLORS[i], marker=MARKERS[i], ms=4, lw=1.8, label=label)
        ax_inc.plot(
            ns[1:],
            np.diff(curves[kind]) / np.diff(np.log2(ns)),
            color=COLORS[i],
            marker=MARKERS[i],
            ms=4,
            lw=1.8,
            label=label,
        )
    ax.plot(
        chain["speculation.k"],
        chain["tau"],
        color=COLORS[2],
        marker=MARKERS[2],
        ms=4,
        lw=1.8,
        label="chain, K = N",
    )
    keep = ns >= 8
    slope, icept, r2 = loglinear_fit(ns[keep], curves["sequoia"][keep])
    xs = np.geomspace(8, ns.max(), 50)
    ax.plot(
        xs,
        icept + slope * np.log(xs),
        color="black",
        ls="--",
        lw=1,
        label=f"fit {icept:.2f} + {slope:.2f} ln N (R² = {r2:.3f})",
    )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("verifier capacity N (draft nodes per pass)")
    ax.set_ylabel("tau: tokens committed per verify pass")
    ax.set_title("(a) tokens per pass versus N", loc="left")
    ax.legend(frameon=False, loc="upper left")
    ax_inc.set_xscale("log", base=2)
    ax_inc.set_ylim(0, None)
    ax_inc.set_xlabel("verifier capacity N (draft nodes per pass)")
    ax_inc.set_ylabel("tokens added per doubling of N")
    ax_inc.set_title("(b) a near-constant gain per doubling = log growth", loc="left")
    ax_inc.legend(frameon=False, loc="upper right")
    fig.suptitle("DSpark math profile, rates held beyond position 7 (analytical)")
    save(fig, "tree_log_n")


if __name__ == "__main__":
    main()
