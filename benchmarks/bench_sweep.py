"""A 1,000-point DES sweep: wall time, and the speed-up of the worker pool over one worker.

Sweep: the reference scenario with K 1..10 (last measured rate held beyond 7) x per-hop latency
(10 values, 1-200 ms) x pipeline depth (2, 4, ..., 20 stages) = 1,000 points, one seed each;
every run is 10 requests x 1,000 output tokens (~10k committed tokens). Timed end to end as a
user sees it (`run_sweep`: validation of every point, pool start-up, runs, shards, final table).

Runs, in this order, in the same process: the local pool with ``--workers`` workers (default: the
CPUs), then one worker (in-process, no pool), optionally the Dask backend (``--dask``). The
tables must be identical (determinism across backends and worker counts is checked for free).
``--sample N`` times the one-worker baseline on the first N points only and scales it (use it when
the full baseline takes too long; the speed-up is then an estimate, and says so).

The machine's 1-minute load average before and after is printed too: these machines are shared,
and a load above the core count inflates both times (the speed-up less so).

Run: .venv/bin/python benchmarks/bench_sweep.py [--workers 2] [--dask] [--sample N]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import pandas as pd

from wansim.sweep import parse_sweep, run_sweep
from wansim.sweep.executors import default_workers

ROOT = Path(__file__).resolve().parents[1]
GRID = {
    "speculation.k": list(range(1, 11)),
    "network.latency_ms": [1, 2, 5, 10, 20, 30, 50, 80, 120, 200],
    "stages": list(range(2, 21, 2)),
}
FIXED = {
    "workload.requests": 10,
    "workload.output_tokens": 1000,
    "drafter.acceptance.extrapolate": True,
}


def sweep(points: int | None = None):
    grid = dict(GRID)
    if points is not None:  # a sub-grid: the first `points` latency x depth cells at every K
        grid["stages"] = grid["stages"][: max(1, points // 100)]
    raw = {"base": "scenarios/v4pro-dspark-10stage-wan.yaml", "engine": "des", "grid": grid}
    raw["set"] = FIXED
    return parse_sweep(raw, ROOT)


def timed(spec, out: Path, **kw) -> tuple[float, object]:
    start = time.perf_counter()
    outcome = run_sweep(spec, out, overwrite=True, progress=False, **kw)
    return time.perf_counter() - start, outcome


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--dask", action="store_true", help="also time the Dask backend")
    parser.add_argument("--sample", type=int, help="points for the one-worker baseline")
    args = parser.parse_args()
    spec = sweep()
    result: dict = {"points": 1000, "tokens_per_run": 10 * 1000, "workers": args.workers}
    result["load_average_before"] = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wall, pool = timed(spec, tmp / "pool", workers=args.workers)
        assert len(pool.table) == 1000
        result["pool_wall_s"] = round(wall, 1)
        result["pool_runs_per_s"] = round(1000 / wall, 2)
        if args.sample:
            sub = sweep(args.sample)
            serial_wall, serial = timed(sub, tmp / "serial", workers=1)
            n = serial.plan.n_points
            merged = pool.table.merge(serial.table.drop(columns=["point"]), how="inner")
            assert len(merged) == n  # same metrics, bit for bit, at the shared points
            result["one_worker_wall_s"] = round(serial_wall * 1000 / n, 1)
            result["one_worker_basis"] = f"{n} points, scaled to 1000 (estimate)"
        else:
            serial_wall, serial = timed(spec, tmp / "serial", workers=1)
            pd.testing.assert_frame_equal(serial.table, pool.table)
            result["one_worker_wall_s"] = round(serial_wall, 1)
            result["one_worker_basis"] = "all 1000 points"
        result["speed_up"] = round(result["one_worker_wall_s"] / wall, 2)
        if args.dask:
            dask_wall, dask = timed(spec, tmp / "dask", backend="dask", workers=args.workers)
            pd.testing.assert_frame_equal(dask.table, pool.table)
            result["dask_wall_s"] = round(dask_wall, 1)
        tokens_per_s = pool.table["tokens_per_s"]
        result["sanity_tokens_per_s_range"] = [
            round(float(tokens_per_s.min()), 2),
            round(float(tokens_per_s.max()), 2),
        ]
    result["load_average_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
