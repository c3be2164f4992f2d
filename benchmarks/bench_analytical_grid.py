"""Analytical grid evaluation rate: one vectorised call over a million points.

Grid: K 1..16 x per-hop latency (25 values, 0-200 ms) x bandwidth (25 values, 1 Mbit/s -
100 Gbit/s) x activation bits {3,4,8,16} x stages 1..25 = 1,000,000 points, on the reference
scenario (profile with per-prompt difficulty), validation of every value included. Baseline in
the same run: the same closed forms (``sync_metrics``) called one point at a time on a sample of
the grid (scenarios parsed outside the timer), so the ratio is the vectorisation gain whatever
the machine's load.

Also the best CPU seconds of the process (``vectorised_cpu_s``), which a loaded machine inflates less.

Run: .venv/bin/python benchmarks/bench_analytical_grid.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from wansim.analytical import evaluate_grid
from wansim.analytical.sync import sync_metrics
from wansim.config.scenario import load_scenario, scenario_to_dict

ROOT = Path(__file__).resolve().parents[1]
GRID = {
    "speculation.k": np.arange(1, 17),
    "network.latency_ms": np.linspace(0, 200, 25),
    "network.bandwidth_mbps": np.geomspace(1, 1e5, 25),
    "payload.activation_bits": np.array([3, 4, 8, 16]),
    "stages": np.arange(1, 26),
}


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--sample", type=int, default=500, help="points for the one-at-a-time baseline"
    )
    args = parser.parse_args()
    base = load_scenario(
        ROOT / "scenarios" / "v4pro-dspark-10stage-wan.yaml",
        ["drafter.acceptance.extrapolate=true"],
    )
    evaluate_grid(base, {k: v[:2] for k, v in GRID.items()})  # warm caches (profile fit)

    times, cpus = [], []
    for _ in range(args.repeat):
        start, cpu = time.perf_counter(), time.process_time()
        frame = evaluate_grid(base, GRID)
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    points = len(frame)
    vector_s = min(times)

    rng = np.random.default_rng(0)
    raw = scenario_to_dict(base)
    sample = [
        {k: v[rng.integers(len(v))].item() for k, v in GRID.items()} for _ in range(args.sample)
    ]
    scenarios = [load_scenario(data=raw, overrides=point) for point in sample]
    start = time.perf_counter()
    for sc in scenarios:
        sync_metrics(sc)
    loop_s = (time.perf_counter() - start) / args.sample

    result = {
        "points": points,
        "vectorised_s": round(vector_s, 3),
        "vectorised_points_per_s": round(points / vector_s),
        # CPU seconds of this process (a loaded machine inflates them less than the wall)
        "vectorised_cpu_s": round(min(cpus), 3),
        "vectorised_points_per_cpu_s": round(points / min(cpus)),
        "one_at_a_time_ms_per_point": round(loop_s * 1e3, 3),
        "speed_up_vs_one_at_a_time": round(loop_s * points / vector_s),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
