"""DES speed on the reference scenario: events and simulated tokens per wall-second, and the
engine's cost relative to bare SimPy.

Runs the 10-stage reference scenario with enough requests for >= 100,000 output tokens
(391 x 256), timing the whole ``simulate()`` call (build, run, metrics). Baseline in the same
run: a bare SimPy loop -- one process yielding ``env.timeout`` -- scheduling as many timeouts as
the engine scheduled events, so the ratio is the engine's cost per event over SimPy's own.
Each repeat times the engine and then the bare loop back to back; the ratio reported is the
median of those paired ratios (robust to a shared machine's load shifting between repeats),
the wall times the best of ``--repeat``. Also: the same with the timeline kept (Perfetto), a
concurrency-8 continuous-batching variant, and async in-pipe speculation (K = 3, 8 blocks in
flight, drafter on S0) alone and with 16 concurrent requests.

Run: .venv/bin/python benchmarks/bench_des.py [--repeat 5] [--tokens 100000]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import simpy

from wansim.scenario import load_scenario
from wansim.sim import simulate

ROOT = Path(__file__).resolve().parents[1]
ASYNC = [
    "drafter.placement=first_stage",
    "drafter.kind=draft_model",
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
    scenario = load_scenario(REFERENCE, overrides)
    simulate(load_scenario(REFERENCE, [*overrides, "workload.requests=2"]))  # warm caches
    walls, bares = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        result = simulate(scenario, timeline=timeline)
        walls.append(time.perf_counter() - start)
        bares.append(bare_simpy(result.details["events"]))
    wall, bare = min(walls), min(bares)
    ratio = float(np.median(np.array(walls) / np.array(bares)))
    record = result.details["record"]
    events = result.details["events"]
    return {
        "requests": scenario.workload.requests,
        "output_tokens": record.output_tokens,
        "events": events,
        "wall_s": round(wall, 3),
        "events_per_s": round(events / wall),
        "tokens_per_s": round(record.output_tokens / wall),
        "bare_simpy_s": round(bare, 3),
        "bare_events_per_s": round(events / bare),
        "ratio_to_bare": round(ratio, 2),
        "des_tokens_per_s_metric": round(result.metrics["tokens_per_s"], 3),
    }


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=100_000)
    args = parser.parse_args()
    base = load_scenario(REFERENCE)
    requests = math.ceil(args.tokens / base.workload.output_tokens)
    n = [f"workload.requests={requests}"]
    results = {
        "reference": measure(n, args.repeat),
        "reference_timeline": measure(n, args.repeat, timeline=True),
        "concurrency_8_continuous": measure(
            [*n, "workload.concurrency=8", "schedule.batching=continuous"], args.repeat
        ),
        # the block schedule (wansim/sim/async_speculation.py): stale blocks and cancellations add events
        "async_k3_8_blocks": measure([*n, *ASYNC], args.repeat),
        "async_k3_8_blocks_concurrency_16": measure(
            [*n, *ASYNC, "workload.concurrency=16"], args.repeat
        ),
    }
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
