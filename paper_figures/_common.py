"""Shared helpers for the figure scripts: paths, style, saving, sweeps, policies.

Every figure is regenerated from ``scenarios/`` and ``traces/`` alone. Environment:

- ``WANSIM_FIGURES_OUT``: where PNG/PDF/CSV go (default ``paper_figures/out``);
- ``WANSIM_FIGURES_FAST=1``: coarse grids and short DES runs (the test suite's mode: same code
  path, fewer points).

Curves come from the sweep machinery (:func:`sweep`): the analytical engine draws the lines
(vectorised), the DES confirms chosen points (markers with 95% intervals). A policy whose
scenario the analytical engine does not model is drawn from the DES instead, so adding a policy
to a figure is one line in its ``POLICIES`` list.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from wansim.errors import WansimInputError  # noqa: E402
from wansim.sweep import parse_sweep, run_sweep  # noqa: E402

SCENARIOS = ROOT / "scenarios"
TRACES = ROOT / "traces"
REFERENCE = SCENARIOS / "v4pro-dspark-10stage-wan.yaml"
PROFILE = TRACES / "reference" / "dspark-v4pro.yaml"
FAST = os.environ.get("WANSIM_FIGURES_FAST", "") not in ("", "0")
OUT = Path(os.environ.get("WANSIM_FIGURES_OUT", ROOT / "paper_figures" / "out"))

COLORS = ["#1b6ca8", "#d1495b", "#2a9d8f", "#e9a03b", "#6d597a", "#555555"]
MARKERS = ["o", "s", "^", "D", "v", "P"]


@dataclasses.dataclass(frozen=True)
class Policy:
    """A line on a figure: a label and the scenario overrides that make it."""

    label: str
    overrides: dict[str, Any]


def style() -> None:
    plt.rcParams.update(
        {
            "figure.dpi": 110,
            "savefig.dpi": 150,
            "font.size": 9.5,
            "axes.titlesize": 10,
            "axes.labelsize": 9.5,
            "legend.fontsize": 8.5,
            "xtick.labelsize": 8.5,
            "ytick.labelsize": 8.5,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "figure.constrained_layout.use": True,
        }
    )


def save(fig, name: str) -> list[Path]:
    """``OUT/name.png`` and ``OUT/name.pdf``."""
    OUT.mkdir(parents=True, exist_ok=True)
    paths = [OUT / f"{name}.png", OUT / f"{name}.pdf"]
    for p in paths:
        fig.savefig(p)
    plt.close(fig)
    for p in paths:
        print(f"wrote {p}")
    return paths


def sweep(
    name: str,
    grid: dict[str, list],
    fixed: dict[str, Any] | None = None,
    *,
    engine: str = "analytical",
    base: Path = REFERENCE,
    seeds: int = 1,
    zipped: dict[str, list] | None = None,
):
    """Run a sweep (results under ``OUT/_sweeps/name``, recomputed every time) -> table."""
    raw = {
        "name": name,
        "base": str(base),
        "engine": engine,
        "grid": grid,
        "zip": zipped or {},
        "set": fixed or {},
        "seeds": seeds,
    }
    spec = parse_sweep(raw, ROOT)
    runs = seeds * math.prod(len(v) for v in grid.values())
    workers = 1 if engine == "analytical" or runs < 12 else None  # a pool pays off past ~12 runs
    out = OUT / "_sweeps" / name
    return run_sweep(spec, out, overwrite=True, progress=False, workers=workers).table


def policy_sweep(name: str, policy: Policy, grid, fixed=None, *, des_fixed=None, seeds=1):
    """A policy's curve: the analytical engine when it models the policy, else the DES.

    Returns (table, engine)."""
    fixed = {**(fixed or {}), **policy.overrides}
    try:
        return sweep(name, grid, fixed, engine="analytical"), "analytical"
    except WansimInputError as err:
        if "analytical engine" not in str(err):
            raise
    return sweep(name, grid, {**fixed, **(des_fixed or {})}, engine="des", seeds=seeds), "des"


def des_supports(overrides: dict[str, Any], base: Path = REFERENCE) -> bool:
    """Whether the DES simulates the base with these overrides (else: no DES markers)."""
    from wansim.config.scenario import load_scenario
    from wansim.sim import check_supported

    try:
        check_supported(load_scenario(base, overrides))
    except WansimInputError:
        return False
    return True


def des_workload(requests: int, output_tokens: int) -> dict[str, int]:
    """DES run length for confirmation points (shorter in fast mode)."""
    if FAST:
        requests, output_tokens = max(4, requests // 4), max(64, output_tokens // 4)
    return {"workload.requests": requests, "workload.output_tokens": output_tokens}


def errorbars(table, metric: str = "tokens_per_s"):
    """(lower, upper) error lengths from the DES 95% interval columns."""
    lo = table[metric] - table[f"{metric}_ci95_low"]
    hi = table[f"{metric}_ci95_high"] - table[metric]
    return [lo.clip(lower=0).to_numpy(), hi.clip(lower=0).to_numpy()]


def fast(full, quick):
    return quick if FAST else full


def plain_log_ticks(ax, axis: str = "y") -> None:
    """Log axis with plain numbers (0.5, 1, 2, 5, 10, ...) instead of powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(FuncFormatter(lambda v, _: ""))
