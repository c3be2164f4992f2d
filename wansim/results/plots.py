"""Plots of one run (``wansim run --out DIR``): lap breakdown, stage utilisation, latency CDF.

Each function takes the engines' results (``{"des": Result, "analytical": Result}``, one or
both) and writes one PNG. Matplotlib runs headless (Agg); nothing here is needed to compute a
metric.

- ``lap_breakdown.png``: one verify lap of the scenario, position by position around the ring:
  compute on stage i (the drafter's pass on its stage) and transport on hop i (propagation with
  mean jitter and retransmissions, and serialisation of the message), from the scenario's
  compute and link models (expected values, as in the analytical engine).
- ``stage_utilization.png``: busy share of every stage, per engine.
- ``latency_cdf.png``: distribution of lap times (DES: every lap measured; analytical: the lap
  distribution the engine computes its percentiles from) and, from the DES, of each request's
  time per output token.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

ENGINE_COLORS = {"des": "#1b6ca8", "analytical": "#d1495b"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 9.5,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "figure.constrained_layout.use": True,
        }
    )
    return plt


def lap_breakdown_table(scenario) -> pd.DataFrame:
    """Per ring position i: compute on S_i, drafting on S_i, and hop i's transport (ms, means).

    Hop i carries S_i's output to S_(i+1); the last hop returns the verdict to S0."""
    from wansim.analytical.sync import lap_parts, ring_message_bytes
    from wansim.config.scenario import hop_name
    from wansim.links.expected_delay import hop_mean
    from wansim.links.wire_bytes import serialise_ms
    from wansim.stages.compute import stage_ms_each

    parts = lap_parts(scenario)
    p = scenario.stages
    hops = scenario.resolved_hops()
    sizes = ring_message_bytes(scenario, parts)
    compute = stage_ms_each(scenario, parts["batch"] * parts["tokens"])
    draft_stage = 0 if scenario.drafter.placement == "first_stage" else p - 1
    rows = []
    for i, hop in enumerate(hops):
        size = sizes[i]
        total = float(hop_mean(hop, size))
        ser = float(serialise_ms(size, hop.bandwidth_mbps))
        rows.append(
            {
                "stage": f"S{i}",
                "hop": hop_name(i, p),
                "compute_ms": float(compute[i]),
                "draft_ms": float(parts["draft_ms"]) if i == draft_stage else 0.0,
                "propagation_ms": total - ser,
                "serialisation_ms": ser,
                "message_bytes": size,
            }
        )
    return pd.DataFrame(rows)


def plot_lap_breakdown(results: dict, path: Path) -> Path:
    plt = _pyplot()
    result = results.get("analytical") or results["des"]
    table = lap_breakdown_table(result.scenario)
    p = len(table)
    x = np.arange(p)
    compute = table["compute_ms"] + table["draft_ms"]
    transport = table["propagation_ms"] + table["serialisation_ms"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * p + 2.5), 3.8))
    w = 0.38
    ax.bar(x - w / 2, table["compute_ms"], w, color="#1b6ca8", label="stage compute")
    ax.bar(
        x - w / 2,
        table["draft_ms"],
        w,
        bottom=table["compute_ms"],
        color="#2a9d8f",
        label="drafting",
    )
    ax.bar(x + w / 2, table["propagation_ms"], w, color="#e9a03b", label="propagation + jitter")
    ax.bar(
        x + w / 2,
        table["serialisation_ms"],
        w,
        bottom=table["propagation_ms"],
        color="#d1495b",
        label="serialisation",
    )
    labels = [f"S{i}\n→S{(i + 1) % p}" if p <= 16 else f"{i}" for i in range(p)]
    ax.set_xticks(x, labels, fontsize=8 if p <= 16 else 7)
    ax.set_xlabel("ring position i: compute on stage S_i, then hop S_i → S_(i+1) (last: return)")
    ax.set_ylabel("ms per verify lap (mean)")
    lap = float(compute.sum() + transport.sum())
    share = float(transport.sum()) / lap if lap else 0.0
    title = f"{result.scenario.name}: lap {lap:.1f} ms, {share:.0%} transport"
    if "des" in results:
        title += f" (DES measured mean lap {results['des'].metrics['lap_ms_mean']:.1f} ms)"
    ax.set_title(title, loc="left", fontsize=9.5)
    ax.legend(frameon=False, ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_stage_utilization(results: dict, path: Path) -> Path:
    plt = _pyplot()
    engines = list(results)
    p = len(next(iter(results.values())).metrics["stage_utilization"])
    fig, ax = plt.subplots(figsize=(max(5.5, 0.45 * p + 2.5), 3.4))
    w = 0.8 / len(engines)
    x = np.arange(p)
    for j, engine in enumerate(engines):
        util = np.asarray(results[engine].metrics["stage_utilization"], dtype=float)
        ax.bar(
            x + (j - (len(engines) - 1) / 2) * w,
            100 * util,
            w,
            color=ENGINE_COLORS.get(engine, "gray"),
            label=f"{engine} (bubble {results[engine].metrics['bubble_fraction']:.0%})",
        )
    ax.set_xticks(x, [f"S{i}" for i in range(p)], fontsize=8 if p <= 16 else 6)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("busy share of the run (%)")
    ax.set_ylim(0, max(5.0, ax.get_ylim()[1]))
    ax.set_title("stage utilisation (compute + drafting, prefill included)", loc="left")
    ax.legend(frameon=False)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def analytical_lap_distribution(scenario) -> tuple[np.ndarray, np.ndarray]:
    """(lap values ms, probabilities): the distribution the analytical percentiles come from."""
    from wansim.analytical.distribution import lap_distribution
    from wansim.analytical.sync import lap_constant, lap_parts, ring_message_bytes

    parts = lap_parts(scenario)
    hops = list(scenario.resolved_hops())
    sizes = ring_message_bytes(scenario, parts)
    constant, stage_terms = lap_constant(scenario, parts)
    values, pmf, _ = lap_distribution(hops, sizes, constant, stage_terms)
    return values, pmf


def plot_latency_cdf(results: dict, path: Path) -> Path:
    plt = _pyplot()
    des = results.get("des")
    fig, axes = plt.subplots(1, 2 if des is not None else 1, figsize=(9.0 if des else 5.2, 3.5))
    axes = np.atleast_1d(axes)
    ax = axes[0]
    if des is not None:
        laps = np.sort(des.details["record"].laps_ms)
        ax.step(
            laps,
            np.arange(1, len(laps) + 1) / len(laps),
            where="post",
            color=ENGINE_COLORS["des"],
            label=f"DES ({len(laps):,} laps)",
        )
    if "analytical" in results:
        values, pmf = analytical_lap_distribution(results["analytical"].scenario)
        cdf = np.cumsum(pmf)
        keep = (cdf > 1e-5) & (cdf < 1 - 1e-4)
        if len(values) == 1 or not keep.any():  # no randomness: a step at the constant lap
            ax.axvline(values[0], color=ENGINE_COLORS["analytical"], label="analytical (fixed)")
        else:
            ax.plot(
                values[keep],
                cdf[keep],
                color=ENGINE_COLORS["analytical"],
                ls="--",
                label="analytical",
            )
    for name, m in results.items():
        for q in ("p50", "p99"):
            ax.axvline(
                m.metrics[f"lap_ms_{q}"], color=ENGINE_COLORS.get(name, "gray"), lw=0.6, alpha=0.5
            )
    ax.set_xlabel("lap: verify to verify of one request (ms)")
    ax.set_ylabel("fraction of laps ≤ x")
    ax.set_title("lap time CDF (thin lines: p50, p99)", loc="left")
    ax.legend(frameon=False, loc="lower right")
    if des is not None:
        rec = des.details["record"]
        tpot = np.sort(rec.decode_ms / rec.decode_tokens)
        axes[1].step(
            tpot,
            np.arange(1, len(tpot) + 1) / len(tpot),
            where="post",
            color=ENGINE_COLORS["des"],
            label=f"DES ({len(tpot)} requests)",
        )
        axes[1].set_xlabel("time per output token of a request (ms)")
        axes[1].set_ylabel("fraction of requests ≤ x")
        axes[1].set_title("TPOT CDF over requests", loc="left")
        axes[1].legend(frameon=False, loc="lower right")
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def request_table(result) -> pd.DataFrame:
    """The DES's per-request record as a table (one row per request, in admission order)."""
    from wansim.sim.metrics import measured_mask

    rec = result.details["record"]
    decode_ms = rec.decode_ms
    return pd.DataFrame(
        {
            "request": np.arange(len(rec.arrival_ms)),
            "arrival_ms": rec.arrival_ms,
            "admitted_ms": rec.admitted_ms,
            "first_token_ms": rec.first_token_ms,
            "finish_ms": rec.finish_ms,
            "ttft_ms": rec.first_token_ms - rec.arrival_ms,
            "decode_ms": decode_ms,
            "decode_tokens": rec.decode_tokens,
            "verify_passes": rec.passes,
            "tau": rec.decode_tokens / rec.passes,
            "tokens_per_s": 1e3 * rec.decode_tokens / decode_ms,
            "tpot_ms": decode_ms / rec.decode_tokens,
            "measured": measured_mask(rec),
        }
    )


def write_run_plots(results: dict, out_dir: Path) -> list[Path]:
    """The three PNGs (a plot the scenario cannot support is skipped with a note on stderr)."""
    import sys

    written = []
    for name, fn in (
        ("lap_breakdown.png", plot_lap_breakdown),
        ("stage_utilization.png", plot_stage_utilization),
        ("latency_cdf.png", plot_latency_cdf),
    ):
        try:
            written.append(fn(results, out_dir / name))
        except Exception as err:  # a plot must never lose the run's numbers
            print(f"warning: {name} skipped ({type(err).__name__}: {err})", file=sys.stderr)
    return written
