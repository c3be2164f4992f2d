"""The DES's cost per simulated token with issue 13's features off, paired against the commit
before them (done-when of issue 13: within 2x).

Two long-lived worker processes, one per source tree (the baseline checkout and this tree),
each importing its own ``wansim`` once; one driver sends them the same run requests in turn,
alternating which goes first, so both see the same machine load and neither pays imports.
Each run is one ``simulate()`` of the reference scenario (``scenarios/v4pro-dspark-10stage-wan
.yaml`` of its own tree; the same file in both) with an override set, timed in the worker by
its process CPU time (``time.process_time``: what the run itself costs, the other sessions'
load on the shared cores excluded as far as the kernel's accounting allows) and by wall time.
Reported per case: the median over pairs of the CPU-time ratio (this tree / baseline) per
simulated token, its spread, the best microseconds per token of each, the events each run
scheduled (0: the lone-ring fast path) and the load average before and after.

Cases (every field the reference leaves at its default is issue 13's "off"):
- ``lone_ring``: the reference as it ships (one request at a time: the vectorised lone-ring
  path, which the new fields must keep whitelisted at their off values);
- ``concurrent_events``: 4 requests in flight, event by event (links, stages, FIFO queues);
- ``async_blocks``: the async block schedule (first-stage draft model, window 4), event by event
  through the scheduler the flush protocol and the hybrid extend;
- ``micro_batches``: 16 users in 4 micro-batches with 256-token chunks (the epoch each
  micro-batch message carries since faults reach micro-batches).

Run: .venv/bin/python benchmarks/bench_des_features_off.py --baseline DIR [--repeat 7]
(DIR: ``git worktree add --detach DIR 9b0d79d``, main before the issue-13 physics).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REFERENCE = "scenarios/v4pro-dspark-10stage-wan.yaml"
WORKER = r"""
import json, sys, time
import importlib
# the tree's own scenario module (the baseline predates the layout move; the editable
# install's finder would otherwise serve this tree's wansim.config to the baseline)
load_scenario = importlib.import_module(sys.argv[2]).load_scenario
from wansim.sim import simulate
for line in sys.stdin:
    over = json.loads(line)
    simulate(load_scenario(sys.argv[1], [*over, "workload.requests=2"]))  # warm caches
    sc = load_scenario(sys.argv[1], over)
    c, w = time.process_time(), time.perf_counter()
    r = simulate(sc)
    cpu, wall = time.process_time() - c, time.perf_counter() - w
    tokens = int(r.details["record"].output_tokens)
    print(json.dumps({"cpu_s": cpu, "wall_s": wall, "tokens": tokens,
                      "events": r.details["events"]}), flush=True)
"""

CASES = {
    "lone_ring": ["workload.requests=48"],
    "concurrent_events": ["workload.requests=24", "workload.concurrency=4"],
    # every stage on a host of 2 cores (wansim.sim.host: processor sharing, its wait per pass)
    "shared_host": ["workload.requests=24", "workload.concurrency=4", "model.host_cores=2"],
    "async_blocks": [
        "workload.requests=12",
        "drafter.placement=first_stage",
        "drafter.kind=draft_model",
        "schedule.kind=async",
        "schedule.max_inflight_blocks=4",
    ],
    "micro_batches": [
        "workload.requests=64",
        "workload.concurrency=16",
        "schedule.batching=continuous",
        "schedule.micro_batches=4",
        "schedule.prefill_chunk_tokens=256",
    ],
}


def _scenario_module(tree: Path) -> str:
    """Where the tree keeps ``load_scenario`` (before and after the layout move)."""
    moved = (tree / "wansim" / "config" / "scenario.py").exists()
    return "wansim.config.scenario" if moved else "wansim.scenario"


class Worker:
    """One tree's long-lived process: send overrides, read back one timing."""

    def __init__(self, tree: Path):
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tree / REFERENCE), _scenario_module(tree)],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, overrides: list[str]) -> dict:
        self.proc.stdin.write(json.dumps(overrides) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def paired(base: Worker, new: Worker, overrides: list[str], repeat: int) -> dict:
    ratios, walls, base_us, new_us = [], [], [], []
    b = n = None
    for i in range(repeat):
        if i % 2 == 0:
            b, n = base.run(overrides), new.run(overrides)
        else:
            n, b = new.run(overrides), base.run(overrides)
        per_b, per_n = b["cpu_s"] / b["tokens"], n["cpu_s"] / n["tokens"]
        ratios.append(per_n / per_b)
        walls.append((n["wall_s"] / n["tokens"]) / (b["wall_s"] / b["tokens"]))
        base_us.append(per_b * 1e6)
        new_us.append(per_n * 1e6)
    return {
        "cpu_ratio_median": round(statistics.median(ratios), 3),
        "cpu_ratio_min_max": [round(min(ratios), 3), round(max(ratios), 3)],
        "wall_ratio_median": round(statistics.median(walls), 3),
        "base_cpu_us_per_token_best": round(min(base_us), 2),
        "new_cpu_us_per_token_best": round(min(new_us), 2),
        "tokens": n["tokens"],
        "events_base": b["events"],
        "events_new": n["events"],
    }


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--new", type=Path, default=Path.cwd())
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else set(CASES)
    load_before = [round(x, 2) for x in os.getloadavg()]
    base, new = Worker(args.baseline.resolve()), Worker(args.new.resolve())
    try:
        results = {
            name: paired(base, new, over, args.repeat)
            for name, over in CASES.items()
            if name in only
        }
    finally:
        base.close()
        new.close()
    results["load_average_before"] = load_before
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    results["cpus"] = os.cpu_count()
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
