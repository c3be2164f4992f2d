"""Accepted length tau versus block size K per workload, and what it is worth in tokens/s.

Question: the DSpark drafter shipped with DeepSeek-V4-Pro was measured at K = 7 (Literature review, Pluralis, compiled August–October 2026, Part VII:
step-weighted tau 4.9-5.3 on math/code, 2.8-3.5 on chat). What tau does it imply at shorter
blocks, and how many tokens/s does each extra draft position buy on a WAN pipeline?

Scenario: traces/reference/dspark-v4pro.yaml (reconstructed from the literature review's ("Literature review, Pluralis, compiled August–October 2026") figures, not raw
traces) for (a): lines are the implied tau(K) = 1 + sum_k prod_{i<=k} p_i from the profile's
pooled per-position rates; open markers are the analytical engine's tau on
scenarios/v4pro-dspark-10stage-wan.yaml with the profile's per-prompt difficulty (a mixture of
requests, step-weighted); bars at K = 7 are the published ranges. (b): tokens/s of one request on
the same 10-stage, 25 ms-per-hop scenario (analytical), K = 1..7 per workload; the dashed line
is the same deployment without speculation.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from _common import COLORS, MARKERS, PROFILE, fast, save, style, sweep

from wansim.acceptance.closed_form import implied_tau
from wansim.acceptance.profile import load_profile

WORKLOADS = ["math", "code", "chat"]
PUBLISHED = {"math": (4.9, 5.3), "code": (4.9, 5.3), "chat": (2.8, 3.5)}
OUTPUT_TOKENS = fast(3000, 500)


def main() -> None:
    style()
    profile = load_profile(PROFILE)
    ks = list(range(1, profile.header.k + 1))
    model = sweep(
        "tau-vs-k",
        {"speculation.k": ks, "drafter.acceptance.workload": WORKLOADS},
        {"workload.output_tokens": OUTPUT_TOKENS},
    )
    plain = sweep(
        "tau-vs-k-none",
        {"drafter.acceptance.workload": WORKLOADS[:1]},
        {"speculation.policy": "none", "workload.output_tokens": OUTPUT_TOKENS},
    )

    fig, (ax_tau, ax_rate) = plt.subplots(1, 2, figsize=(9.6, 3.9))
    for i, name in enumerate(WORKLOADS):
        p = np.asarray(profile.workloads[name].per_position)
        taus = implied_tau(p)
        ax_tau.plot(ks, taus, color=COLORS[i], marker=MARKERS[i], ms=4, label=f"{name}: profile")
        rows = model[model["drafter.acceptance.workload"] == name].sort_values("speculation.k")
        ax_tau.plot(
            rows["speculation.k"],
            rows["tau"],
            ls="none",
            marker=MARKERS[i],
            mfc="white",
            ms=7,
            color=COLORS[i],
        )
        lo, hi = PUBLISHED[name]
        x = ks[-1] + 0.25 + 0.18 * i
        ax_tau.plot([x, x], [lo, hi], color=COLORS[i], lw=3, alpha=0.55, solid_capstyle="butt")
        ax_rate.plot(
            rows["speculation.k"],
            rows["tokens_per_s"],
            color=COLORS[i],
            marker=MARKERS[i],
            ms=4,
            label=name,
        )
    ax_rate.axhline(
        float(plain["tokens_per_s"].iloc[0]), color="black", ls="--", lw=1, label="no speculation"
    )
    ax_tau.plot(
        [], [], ls="none", marker="o", mfc="white", color="gray", label="engine (difficulty mix)"
    )
    ax_tau.plot([], [], lw=3, alpha=0.55, color="gray", label="published range, K = 7")
    ax_tau.set_xlabel("drafted tokens per block K")
    ax_tau.set_ylabel("tau: tokens committed per verify pass")
    ax_tau.set_xticks(ks)
    ax_tau.set_ylim(1, None)
    ax_tau.set_title("(a) implied tau at shorter blocks", loc="left")
    ax_tau.legend(frameon=False, loc="upper left", ncols=1)
    ax_rate.set_xlabel("drafted tokens per block K")
    ax_rate.set_ylabel("tokens/s of one request")
    ax_rate.set_xticks(ks)
    ax_rate.set_ylim(0, None)
    ax_rate.set_title("(b) 10 stages, 25 ms per hop (analytical)", loc="left")
    ax_rate.legend(frameon=False, loc="upper left")
    fig.suptitle("DSpark on DeepSeek-V4-Pro (reconstructed reference profile, T = 1.0)")
    save(fig, "tau_vs_k")


if __name__ == "__main__":
    main()
