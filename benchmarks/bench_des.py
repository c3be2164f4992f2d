"""DES speed on the reference scenario: events and simulated tokens per wall-second, and the
engine's cost relative to bare SimPy.

Runs the 10-stage reference scenario with enough requests for >= 100,000 output tokens
(391 x 256), timing the whole ``simulate()`` call (build, run, metrics). Baseline in the same
run: a bare SimPy loop -- one process yielding ``env.timeout`` -- scheduling as many timeouts as
the engine scheduled events, so the ratio is the engine's cost per event over SimPy's own.
Each repeat times the engine and then the bare loop back to back; the ratio reported is the
median of those paired ratios (robust to a shared machine's load shifting between repeats),
the wall times the best of ``--repeat``. Each repeat also times the per-event reference
(``per_event=True``: every scenario event by event, as before the lone-ring path), so the
speed-up over it is paired too; the results must be equal (asserted). Also: the same with the timeline kept (Perfetto), a
concurrency-8 continuous-batching variant, and async in-pipe speculation (K = 3, 8 blocks in
flight, drafter on S0) alone and with 16 concurrent requests.

Run: .venv/bin/python benchmarks/bench_des.py [--repeat 5] [--tokens 100000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import simpy

from wansim.scenario import load_scenario
from wansim.sim import simulate

ROOT = Path(__file__).resolve().parents[1]
ASYNC = [
    "drafter.placement=first_stage",
    "speculation.k=3",
    "schedule.kind=async",
    "schedule.max_inflight_blocks=8",
]
REFERENCE = ROOT / "scenarios" / "v4pro-dspark-10stage-wan.yaml"


def bare_simpy(n_timeouts: int) -> float:
    """Wall seconds for SimPy to process ``n_timeouts`` timeouts yielded by one process."""
    env = simpy.Environment()

    def loop():
        timeout = env.timeout
        for _ in range(n_timeouts):
            yield timeout(1.0)

    env.process(loop())
    start = time.perf_counter()
    env.run()
    return time.perf_counter() - start


def measure(overrides: list[str], repeat: int, timeline: bool = False) -> dict:
    """The engine as users run it, paired in each repeat with the per-event reference
    (``simulate(..., per_event=True)``, every scenario event by event) and bare SimPy."""
    scenario = load_scenario(REFERENCE, overrides)
    warm = load_scenario(REFERENCE, [*overrides, "workload.requests=2"])
    simulate(warm)  # warm caches
    simulate(warm, per_event=True)
    walls, refs, bares = [], [], []
    for _ in range(repeat):
        start = time.perf_counter()
        result = simulate(scenario, timeline=timeline)
        walls.append(time.perf_counter() - start)
        start = time.perf_counter()
        reference = simulate(scenario, timeline=timeline, per_event=True)
        refs.append(time.perf_counter() - start)
        bares.append(bare_simpy(reference.details["events"]))
    assert result.metrics == reference.metrics, "the engine left the per-event reference"
    wall, ref, bare = min(walls), min(refs), min(bares)
    record = result.details["record"]
    events = reference.details["events"]
    return {
        "requests": scenario.workload.requests,
        "output_tokens": record.output_tokens,
        "events_per_event_engine": events,
        "events_scheduled": result.details["events"],
        "wall_s": round(wall, 3),
        "tokens_per_s": round(record.output_tokens / wall),
        "per_event_wall_s": round(ref, 3),
        "per_event_tokens_per_s": round(record.output_tokens / ref),
        "speed_up_vs_per_event": round(float(np.median(np.array(refs) / np.array(walls))), 2),
        "bare_simpy_s": round(bare, 3),
        "per_event_ratio_to_bare": round(float(np.median(np.array(refs) / np.array(bares))), 2),
        "des_tokens_per_s_metric": round(result.metrics["tokens_per_s"], 3),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    args = parser.parse_args()
    base = load_scenario(REFERENCE)
    requests = math.ceil(args.tokens / base.workload.output_tokens)
    n = [f"workload.requests={requests}"]
    cases = {
        "reference": lambda: measure(n, args.repeat),
        "reference_timeline": lambda: measure(n, args.repeat, timeline=True),
        "concurrency_8_continuous": lambda: measure(
            [*n, "workload.concurrency=8", "schedule.batching=continuous"], args.repeat
        ),
        # the block schedule (wansim/sim/async_speculation.py): stale blocks and cancellations
        "async_k3_8_blocks": lambda: measure([*n, *ASYNC], args.repeat),
        "async_k3_8_blocks_concurrency_16": lambda: measure(
            [*n, *ASYNC, "workload.concurrency=16"], args.repeat
        ),
    }
    chosen = args.only or list(cases)
    results = {name: cases[name]() for name in chosen}
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
