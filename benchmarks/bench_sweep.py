"""A 1,000-point DES sweep: wall time, and the speed-up of the worker pool over one worker.

Sweep: the reference scenario with K 1..10 (last measured rate held beyond 7) x per-hop latency
(10 values, 1-200 ms) x pipeline depth (2, 4, ..., 20 stages) = 1,000 points, one seed each;
every run is 10 requests x 1,000 output tokens (~10k committed tokens).

1. Wall time: the whole sweep as a user runs it (`run_sweep`, local pool of ``--workers``
   processes: validation of every point, pool start-up, runs, shards, final table).
2. Speed-up over one worker, paired: these machines are shared and their load changes by the
   minute, so one long pool run followed by one long single-worker run compares different
   machines. Instead the sweep is cut into its 10 latency slices (100 points each) and every
   slice runs on the pool (kept warm across slices) and on one worker (in-process) back to back,
   alternating which goes first; speed-up = total one-worker time / total pool time (the pool's
   one-off start-up is reported separately), with the per-slice ratios' median and range.
3. ``--dask``: the whole sweep again on a Dask LocalCluster with the same worker count.

Also printed: the pool workers' CPU seconds during step 1 and the share of its cores the pool got
(CPU / (wall x workers)): below ~0.9 other processes were taking the cores.

Every table must equal the first one (determinism across backends, worker counts and slicing is
checked for free). The machine's 1-minute load average before and after is printed.

``--seeds 10`` runs every point with 10 seeds (``seeds: 10``): the 10,000-run sweep; ``--wall-only`` times the
whole sweep only (step 1, and step 3 with ``--dask``).

Run: .venv/bin/python benchmarks/bench_sweep.py [--workers 2] [--dask] [--seeds 10] [--wall-only]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from wansim.sweep import parse_sweep, run_sweep
from wansim.sweep.executors import LocalExecutor, default_workers

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


SEEDS = {"n": 1}


def sweep(grid: dict | None = None):
    raw = {
        "name": "bench",
        "base": "scenarios/v4pro-dspark-10stage-wan.yaml",
        "engine": "des",
        "grid": grid or GRID,
        "set": FIXED,
        "seeds": SEEDS["n"],
    }
    return parse_sweep(raw, ROOT)


def timed(spec, out: Path, **kw):
    start = time.perf_counter()
    outcome = run_sweep(spec, out, overwrite=True, progress=False, **kw)
    return time.perf_counter() - start, outcome.table


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def comparable(table: pd.DataFrame) -> pd.DataFrame:
    keys = list(GRID)
    return table.drop(columns=["point"]).sort_values(keys).reset_index(drop=True)


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--dask", action="store_true", help="also time the Dask backend")
    parser.add_argument(
        "--seeds", type=int, default=1, help="seeds per point (10: the 10,000-point sweep)"
    )
    parser.add_argument(
        "--wall-only", action="store_true", help="step 1 only (and --dask): no paired slices"
    )
    args = parser.parse_args()
    SEEDS["n"] = args.seeds
    points = math.prod(len(v) for v in GRID.values()) * args.seeds
    result: dict = {"points": points, "tokens_per_run": 10 * 1000, "workers": args.workers}
    result["load_average_before"] = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        first_pool = LocalExecutor(args.workers)  # created inside the timing, as run_sweep does
        try:
            _, full = timed(sweep(), tmp / "full", executor=first_pool)
            wall = time.perf_counter() - start
            worker_cpu = sum(cpu_seconds(pid) for pid in first_pool.pool._processes)
        finally:
            first_pool.close()
        assert len(full) == points
        result["sweep_wall_s"] = round(wall, 1)
        result["sweep_runs_per_s"] = round(points / wall, 2)
        # how much of its cores the pool got: worker CPU seconds / (wall x workers)
        result["sweep_worker_cpu_s"] = round(worker_cpu, 1)
        result["sweep_core_share"] = round(worker_cpu / (wall * args.workers), 2)

        if args.wall_only:
            if args.dask:
                dask_wall, dask = timed(sweep(), tmp / "dask", backend="dask", workers=args.workers)
                pd.testing.assert_frame_equal(dask, full)
                result["dask_sweep_wall_s"] = round(dask_wall, 1)
            result["load_average_after"] = round(os.getloadavg()[0], 2)
            print(json.dumps(result))
            return result
        start = time.perf_counter()
        pool = LocalExecutor(args.workers)
        list(pool.imap(os.getpid, [()] * (4 * args.workers)))  # start every worker
        startup = time.perf_counter() - start
        pool_total = 0.0
        one_total = 0.0
        ratios = []
        slices = []
        try:
            for i, latency in enumerate(GRID["network.latency_ms"]):
                spec = sweep({**GRID, "network.latency_ms": [latency]})
                order = ["pool", "one"] if i % 2 == 0 else ["one", "pool"]
                took = {}
                for which in order:
                    if which == "pool":
                        took[which], table = timed(spec, tmp / "p", executor=pool)
                    else:
                        took[which], table = timed(spec, tmp / "o", workers=1)
                    slices.append(table)
                pool_total += took["pool"]
                one_total += took["one"]
                ratios.append(took["one"] / took["pool"])
        finally:
            pool.close()
        merged = pd.concat(slices[::2], ignore_index=True)
        pd.testing.assert_frame_equal(comparable(merged), comparable(full))
        merged = pd.concat(slices[1::2], ignore_index=True)
        pd.testing.assert_frame_equal(comparable(merged), comparable(full))
        result["paired_pool_s"] = round(pool_total, 1)
        result["paired_one_worker_s"] = round(one_total, 1)
        result["pool_start_up_s"] = round(startup, 2)
        result["speed_up"] = round(one_total / pool_total, 2)
        result["speed_up_per_slice_median"] = round(statistics.median(ratios), 2)
        result["speed_up_per_slice_range"] = [round(min(ratios), 2), round(max(ratios), 2)]
        if args.dask:
            dask_wall, dask = timed(sweep(), tmp / "dask", backend="dask", workers=args.workers)
            pd.testing.assert_frame_equal(dask, full)
            result["dask_sweep_wall_s"] = round(dask_wall, 1)
    result["load_average_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
