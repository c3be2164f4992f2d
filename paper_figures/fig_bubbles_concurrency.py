"""Bubbles versus concurrency: how much idle pipeline N concurrent requests fill, with and
without async in-pipe speculation, and what it costs each request.

Question: with one request in flight only one stage works at a time (a 10-stage pipe idles
~90% of the time). How does the bubble fraction fall as N requests share the pipe (one
micro-batch per request, or continuous batching at every stage), how does async speculation
(blocks launched ahead of their verdicts) fill the same bubbles with bets instead, and what do
throughput and each request's decode rate do?

Scenario: scenarios/v4pro-dspark-10stage-wan.yaml (10 stages, 25 ms per hop, 1 Gbit/s,
lognormal jitter, K = 7, math profile) with the drafter on S0 for every line; N = 1-64
concurrent requests (closed loop, 8 N + 24 requests per run, 256 tokens each). Lines: analytical
(sync: the closed-network approximation of wansim.analytical.concurrent; async: the block
schedule on that network; continuous batching: wansim.analytical.batched); markers: the DES
with 95% intervals where it has them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from _common import COLORS, MARKERS, Policy, errorbars, fast, save, style, sweep

POLICIES = [
    Policy("sync, one micro-batch per request", {}),
    Policy("sync, continuous batching", {"schedule.batching": "continuous"}),
    Policy(
        "async, 4 blocks in flight", {"schedule.kind": "async", "schedule.max_inflight_blocks": 4}
    ),
]
ON_S0 = {"drafter.placement": "first_stage", "drafter.kind": "draft_model"}
NS = fast([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64], [1, 4, 8, 16])
DES_NS = fast([1, 4, 16, 64], [1, 8])
DES_TOKENS = fast(256, 64)


def requests_for(ns):
    return [fast(8 * n + 24, 2 * n + 8) for n in ns]  # (distinct values: the sweep zips them)


def main() -> None:
    style()
    fig, (ax_b, ax_t) = plt.subplots(1, 2, figsize=(9.6, 3.9))
    for i, pol in enumerate(POLICIES):
        color, marker = COLORS[i], MARKERS[i]
        fixed = {**ON_S0, **pol.overrides, "workload.output_tokens": DES_TOKENS}
        zipped = {"workload.concurrency": NS, "workload.requests": requests_for(NS)}
        a = sweep(f"bubbles-{i}", {}, fixed, zipped=zipped).sort_values("workload.concurrency")
        n = a["workload.concurrency"]
        ax_b.plot(n, a["bubble_fraction"], color=color, lw=1.8, label=pol.label)
        ax_t.plot(n, a["throughput_tokens_per_s"], color=color, lw=1.8)
        ax_t.plot(n, a["tokens_per_s"], color=color, lw=1.2, ls="--")
        des_zip = {"workload.concurrency": DES_NS, "workload.requests": requests_for(DES_NS)}
        d = sweep(
            f"bubbles-{i}-des",
            {},
            fixed,
            engine="des",
            zipped=des_zip,
        ).sort_values("workload.concurrency")
        kw = {"color": color, "mfc": "white", "ms": 5, "lw": 0, "elinewidth": 1, "capsize": 2}
        ax_b.plot(
            d["workload.concurrency"],
            d["bubble_fraction"],
            marker,
            **{k: v for k, v in kw.items() if k in ("color", "mfc", "ms")},
        )
        ax_t.plot(
            d["workload.concurrency"],
            d["throughput_tokens_per_s"],
            marker,
            **{k: v for k, v in kw.items() if k in ("color", "mfc", "ms")},
        )
        ax_t.errorbar(
            d["workload.concurrency"], d["tokens_per_s"], yerr=errorbars(d), fmt=marker, **kw
        )
    for ax in (ax_b, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xticks(DES_NS if len(DES_NS) > 2 else NS)
        ax.get_xaxis().set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("concurrent requests N")
    ax_b.set_ylim(0, 1)
    ax_b.set_ylabel("bubble fraction (1 - mean stage utilisation)")
    ax_b.set_title("(a) idle share of the pipeline", loc="left")
    ax_b.legend(frameon=False, loc="lower left", fontsize=8)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("tokens/s (log scale)")
    ax_t.set_title("(b) throughput (solid), one request's rate (dashed)", loc="left")
    ax_t.plot([], [], color="gray", marker="o", mfc="white", lw=0, label="DES")
    ax_t.legend(frameon=False, loc="lower right", fontsize=8)
    fig.suptitle("Filling the bubbles: concurrency and async, 10 stages x 25 ms, K = 7")
    save(fig, "bubbles_concurrency")


if __name__ == "__main__":
    main()
