"""Async in-pipe speculation: its gain over the sync schedule versus pipeline depth.

Question: S0 launches the next draft block before the verdict of the last one returns (async
in-pipe speculation), one block in flight per stage, betting that the blocks in flight are
accepted whole; a lost bet cancels every block behind it. How much faster than the sync
schedule does one request decode as the pipeline deepens, and where does the gain stop
growing (Literature review, Pluralis, compiled August–October 2026, Part IV puts this depth wall at 8-14 stages)?

Scenario: scenarios/v4pro-dspark-10stage-wan.yaml (25 ms per hop, 1 Gbit/s, lognormal jitter)
with the drafter on S0 (``drafter.placement: first_stage``: async needs a drafter that can draft
from its own drafts), 2-32 stages, ``schedule.max_inflight_blocks`` = stages; math and chat
profiles of traces/reference/dspark-v4pro.yaml; K = 1, 2, 3, 7. Gain = async tokens/s / sync
tokens/s at the same K and placement. Lines: the analytical approximation
(wansim.analytical.blocks); markers: the DES (async over sync rate, both simulated with the
same seed, so the same passes are verified; bars from the async run's 95% interval). Ticks on the x axis: where each curve reaches 90% of its gain at
32 stages (wansim.analytical.blocks.flattening_depth); the band is the literature review's ("Literature review, Pluralis, compiled August–October 2026") 8-14. Also
writes depth_wall.csv (the curves) and depth_wall.md (the flattening depths).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from _common import COLORS, MARKERS, OUT, des_workload, fast, save, style, sweep

from wansim.analytical.blocks import flattening_depth

WORKLOADS = ["math", "chat"]
KS = [1, 2, 3, 7]
DEPTHS = fast(list(range(2, 33)), [2, 4, 8, 12, 16, 24, 32])
DES_K = 2
DES_DEPTHS = fast([4, 8, 16], [4])
ON_S0 = {"drafter.placement": "first_stage", "drafter.kind": "draft_model"}


def curves() -> pd.DataFrame:
    """Analytical async and sync tokens/s per workload, K and depth; the gain."""
    grid = {"drafter.acceptance.workload": WORKLOADS, "speculation.k": KS}
    zipped = {"stages": DEPTHS, "schedule.max_inflight_blocks": DEPTHS}
    a = sweep("depth-wall-async", grid, {**ON_S0, "schedule.kind": "async"}, zipped=zipped)
    s = sweep("depth-wall-sync", {**grid, "stages": DEPTHS}, ON_S0)
    keys = ["drafter.acceptance.workload", "speculation.k", "stages"]
    merged = a[[*keys, "tokens_per_s"]].merge(
        s[[*keys, "tokens_per_s"]], on=keys, suffixes=("_async", "_sync")
    )
    merged["gain"] = merged["tokens_per_s_async"] / merged["tokens_per_s_sync"]
    return merged.rename(columns={"drafter.acceptance.workload": "workload", "speculation.k": "k"})


def des_points() -> pd.DataFrame:
    """The DES at a few depths, K = DES_K: async and sync run with the same seed, so they
    verify the same passes with the same acceptance (the async schedule is lossless) and the
    ratio's noise is timing only."""
    from _common import REFERENCE

    from wansim import load_scenario, simulate

    work = des_workload(48, 256)
    rows = []
    for wl in WORKLOADS:
        for p in DES_DEPTHS:
            over = {
                **ON_S0,
                **work,
                "speculation.k": DES_K,
                "stages": p,
                "drafter.acceptance.workload": wl,
            }
            sync = simulate(load_scenario(REFERENCE, over)).metrics
            over.update({"schedule.kind": "async", "schedule.max_inflight_blocks": p})
            a = simulate(load_scenario(REFERENCE, over)).metrics
            low, high = a["tokens_per_s_ci95"]
            base = sync["tokens_per_s"]
            rows.append(
                {
                    "workload": wl,
                    "stages": p,
                    "gain": a["tokens_per_s"] / base,
                    "gain_ci95_low": low / base,
                    "gain_ci95_high": high / base,
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    style()
    table = curves()
    des = des_points()
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.9), sharey=False)
    rows = []
    for ax, wl in zip(axes, WORKLOADS, strict=True):
        ax.axvspan(8, 14, color="0.9", zorder=0, label="review: wall at 8-14 stages")
        for i, k in enumerate(KS):
            c = table[(table["workload"] == wl) & (table["k"] == k)].sort_values("stages")
            wall = flattening_depth(c["stages"], c["gain"])
            rows.append(
                {
                    "workload": wl,
                    "K": k,
                    "gain at 2": float(c["gain"].iloc[0]),
                    "gain at 32": float(c["gain"].iloc[-1]),
                    "flattens at (90%)": wall,
                }
            )
            ax.plot(c["stages"], c["gain"], color=COLORS[i], lw=1.8, label=f"K = {k}")
            ax.plot([wall], [0], marker="|", ms=14, mew=2, color=COLORS[i], clip_on=False)
        d = des[des["workload"] == wl].sort_values("stages")
        i = KS.index(DES_K)
        ax.errorbar(
            d["stages"],
            d["gain"],
            yerr=[
                (d["gain"] - d["gain_ci95_low"]).clip(lower=0),
                (d["gain_ci95_high"] - d["gain"]).clip(lower=0),
            ],
            fmt=MARKERS[i],
            mfc="white",
            color=COLORS[i],
            ms=5,
            capsize=2,
            lw=0,
            elinewidth=1,
            label=f"DES, K = {DES_K}",
        )
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        ax.set_ylim(0, None)
        ax.set_xlim(0, 33)
        ax.set_xlabel("pipeline stages (one block in flight per stage)")
        ax.set_ylabel("async / sync tokens/s (same K)")
        ax.set_title(f"({'ab'[WORKLOADS.index(wl)]}) {wl} profile", loc="left")
    axes[0].legend(frameon=False, loc="upper left", fontsize=8)
    fig.suptitle("Async in-pipe speculation vs depth, 25 ms per hop: the depth wall")
    save(fig, "depth_wall")
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT / "depth_wall.csv", index=False, float_format="%.6g")
    walls = pd.DataFrame(rows)
    lines = [
        "| workload | K | gain at 2 stages | gain at 32 stages | flattens at (90% of the gain at 32) |",
        "|---|---|---|---|---|",
    ]
    for _, r in walls.iterrows():
        lines.append(
            f"| {r['workload']} | {r['K']} | {r['gain at 2']:.2f} | {r['gain at 32']:.2f} |"
            f" {r['flattens at (90%)']} |"
        )
    (OUT / "depth_wall.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
