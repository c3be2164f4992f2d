"""The 10-stage WAN ceiling: tokens/s of one request with and without speculation.

Question: for DeepSeek-V4-Pro split over 10 machines joined by WAN links, what decode rate can
one request reach as the per-hop latency grows, on math, code and chat - and how many times
faster is it with the shipped DSpark drafter (K = 7) than plain decoding? (The literature review's ("Literature review, Pluralis, compiled August–October 2026") Part VII
ceiling table.)

Scenario: scenarios/v4pro-dspark-10stage-wan.yaml (10 stages, 1 Gbit/s, lognormal jitter 3 ms,
6 ms compute per stage pass, DSpark K = 7 drafting in 4 ms on the last stage) and its no-speculation
twin (speculation.policy: none), per-hop latency 5-200 ms, 3000-token outputs; acceptance from
traces/reference/dspark-v4pro.yaml. Analytical engine for every cell; the DES confirms the 25 ms
row (column ``des_tokens_per_s``, 95% interval in the CSV). Writes wan_ceiling.png/.pdf and the
table as wan_ceiling.csv and wan_ceiling.md.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from _common import OUT, des_workload, fast, save, style, sweep
from matplotlib.colors import LogNorm
from matplotlib.ticker import FuncFormatter

WORKLOADS = ["math", "code", "chat"]
LATENCIES = fast([5, 10, 25, 50, 100, 200], [5, 25, 100])
DES_LATENCY = 25
FIXED = {"workload.output_tokens": 3000}


def build_table() -> pd.DataFrame:
    spec = sweep(
        "ceiling-spec",
        {"network.latency_ms": LATENCIES, "drafter.acceptance.workload": WORKLOADS},
        FIXED,
    )
    none = sweep(
        "ceiling-none", {"network.latency_ms": LATENCIES}, {**FIXED, "speculation.policy": "none"}
    )
    des_fixed = des_workload(16, 3000)
    des_spec = sweep(
        "ceiling-spec-des",
        {"drafter.acceptance.workload": WORKLOADS},
        {"network.latency_ms": DES_LATENCY, **des_fixed},
        engine="des",
    )
    des_none = sweep(
        "ceiling-none-des",
        {"network.latency_ms": [DES_LATENCY]},
        {"speculation.policy": "none", **des_fixed},
        engine="des",
    )
    rows = []
    for lat in LATENCIES:
        base = float(none.loc[none["network.latency_ms"] == lat, "tokens_per_s"].iloc[0])
        for w in WORKLOADS:
            cell = spec[
                (spec["network.latency_ms"] == lat) & (spec["drafter.acceptance.workload"] == w)
            ]
            row = {
                "latency_ms": lat,
                "workload": w,
                "tokens_per_s_no_spec": base,
                "tokens_per_s_k7": float(cell["tokens_per_s"].iloc[0]),
                "speed_up": float(cell["tokens_per_s"].iloc[0]) / base,
                "tau": float(cell["tau"].iloc[0]),
                "lap_ms": float(cell["lap_ms_mean"].iloc[0]),
            }
            if lat == DES_LATENCY:
                d = des_spec[des_spec["drafter.acceptance.workload"] == w].iloc[0]
                row["des_tokens_per_s_k7"] = float(d["tokens_per_s"])
                row["des_ci95_k7"] = (
                    f"[{d['tokens_per_s_ci95_low']:.2f}, {d['tokens_per_s_ci95_high']:.2f}]"
                )
                row["des_tokens_per_s_no_spec"] = float(des_none["tokens_per_s"].iloc[0])
            rows.append(row)
    return pd.DataFrame(rows)


def write_tables(table: pd.DataFrame) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT / "wan_ceiling.csv", index=False, float_format="%.4g")
    lines = [
        "| per-hop latency (ms) | no speculation (tok/s) | "
        + " | ".join(f"{w}, K = 7 (tok/s, speed-up)" for w in WORKLOADS)
        + " |",
        "|---:|---:|" + "---:|" * len(WORKLOADS),
    ]
    for lat, g in table.groupby("latency_ms", sort=True):
        g = g.set_index("workload")
        cells = [
            f"{g.loc[w, 'tokens_per_s_k7']:.2f} ({g.loc[w, 'speed_up']:.1f}x)" for w in WORKLOADS
        ]
        lines.append(
            f"| {lat:g} | {g['tokens_per_s_no_spec'].iloc[0]:.2f} | " + " | ".join(cells) + " |"
        )
    (OUT / "wan_ceiling.md").write_text(
        "10-stage WAN ceiling, one request (analytical; scenarios/v4pro-dspark-10stage-wan.yaml,"
        " 3000-token outputs)\n\n" + "\n".join(lines) + "\n"
    )
    print(f"wrote {OUT / 'wan_ceiling.csv'}\nwrote {OUT / 'wan_ceiling.md'}")


def draw(table: pd.DataFrame) -> None:
    style()
    cols = ["no speculation", *(f"{w}, K = 7" for w in WORKLOADS)]
    lat = sorted(table["latency_ms"].unique())
    values = np.zeros((len(lat), len(cols)))
    text = [["" for _ in cols] for _ in lat]
    for r, latency in enumerate(lat):
        g = table[table["latency_ms"] == latency].set_index("workload")
        values[r, 0] = g["tokens_per_s_no_spec"].iloc[0]
        text[r][0] = f"{values[r, 0]:.2f}"
        for c, w in enumerate(WORKLOADS, start=1):
            values[r, c] = g.loc[w, "tokens_per_s_k7"]
            text[r][c] = f"{values[r, c]:.2f}\n({g.loc[w, 'speed_up']:.1f}x)"
    fig, ax = plt.subplots(figsize=(7.2, 0.62 * len(lat) + 1.5))
    im = ax.imshow(
        values, cmap="YlGnBu", norm=LogNorm(values.min() / 1.5, values.max() * 1.5), aspect="auto"
    )
    for r in range(len(lat)):
        for c in range(len(cols)):
            dark = np.log(values[r, c] / values.min()) > 0.6 * np.log(values.max() / values.min())
            ax.text(
                c,
                r,
                text[r][c],
                ha="center",
                va="center",
                fontsize=8.5,
                color="white" if dark else "black",
            )
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(lat)), [f"{v:g}" for v in lat])
    ax.set_ylabel("one-way latency per hop (ms)")
    ax.tick_params(axis="x", top=True, labeltop=True, bottom=False, labelbottom=False)
    ax.grid(False)
    for s in ax.spines.values():
        s.set_visible(False)
    cbar = fig.colorbar(im, ax=ax, shrink=0.9, pad=0.02)
    cbar.set_label("tokens/s of one request (log scale)")
    cbar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    cbar.ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_title(
        "10-stage WAN ceiling: tokens/s (speed-up over no speculation)", loc="left", pad=22
    )
    save(fig, "wan_ceiling")


def main() -> None:
    table = build_table()
    write_tables(table)
    draw(table)


if __name__ == "__main__":
    main()
