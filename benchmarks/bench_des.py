"""DES speed on the reference scenario: events and simulated tokens per wall-second, and the
engine's cost relative to bare SimPy.

Runs the 10-stage reference scenario with enough requests for >= 100,000 output tokens
(391 x 256), timing the whole ``simulate()`` call (build, run, metrics). Baseline in the same
run: a bare SimPy loop -- one process yielding ``env.timeout`` -- scheduling as many timeouts as
the engine scheduled events, so the ratio is the engine's cost per event over SimPy's own.
Each repeat times the engine as ``simulate`` runs it (the vectorised lone ring where it
applies: ``wansim/sim/lone_ring.py``, else events on ``wansim/sim/kernel.py``'s loop), the
per-event engine on SimPy's own loop (``per_event=True``, the reference) and the bare loop back
to back; ratios are the medians of those paired ratios (robust to a shared machine's
load shifting between repeats), the times the best of ``--repeat`` (wall, and CPU seconds of
the process, which a loaded machine inflates less). Also: the same with the timeline kept (Perfetto;
paired repeat by repeat with the same run untimed, and the time to write the trace file), a
concurrency-8 continuous-batching variant, and async in-pipe speculation (K = 3, 8 blocks in
flight, drafter on S0) alone and with 16 concurrent requests.

Run: .venv/bin/python benchmarks/bench_des.py [--repeat 5] [--tokens 100000]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import simpy

from wansim.config.scenario import load_scenario
from wansim.sim import simulate
from wansim.sim.perfetto import write_perfetto

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


def _timed(scenario, **kwargs):
    """(result, wall s, CPU s of this process) of one ``simulate`` call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(scenario, **kwargs)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def measure(overrides: list[str], repeat: int, timeline: bool = False) -> dict:
    """The engine as ``simulate`` runs it (the lone ring where it applies) paired repeat by
    repeat with the per-event engine (``per_event=True``) and with bare SimPy."""
    scenario = load_scenario(REFERENCE, overrides)
    simulate(load_scenario(REFERENCE, [*overrides, "workload.requests=2"]))  # warm caches
    walls, cpus, event_walls, event_cpus, bares, untimed = [], [], [], [], [], []
    for _ in range(repeat):
        if timeline:  # the same run without the timeline, paired (target 3)
            untimed.append(_timed(scenario)[1])
        result, wall, cpu = _timed(scenario, timeline=timeline)
        walls.append(wall)
        cpus.append(cpu)
        per_event, wall, cpu = _timed(scenario, timeline=timeline, per_event=True)
        event_walls.append(wall)
        event_cpus.append(cpu)
        bares.append(bare_simpy(per_event.details["events"]))
        assert result.metrics == per_event.metrics  # the fast path changes nothing
    wall, bare, event_wall = min(walls), min(bares), min(event_walls)
    record = result.details["record"]
    events = per_event.details["events"]
    tokens = record.output_tokens
    kept = {}
    if timeline:
        kept = {
            "untimed_wall_s": round(min(untimed), 3),
            "over_untimed_median_of_pairs": round(
                float(np.median(np.array(walls) / np.array(untimed))), 2
            ),
            # reading the kept timeline and writing the Perfetto file (not in the run's time)
            "perfetto_write_s": round(_write_s(result), 3),
            "per_event_perfetto_write_s": round(_write_s(per_event), 3),
        }
    return {
        "requests": scenario.workload.requests,
        "output_tokens": tokens,
        "events": result.details["events"],
        "per_event_events": events,
        "wall_s": round(wall, 3),
        "cpu_s": round(min(cpus), 3),
        "tokens_per_s": round(tokens / wall),
        "tokens_per_cpu_s": round(tokens / min(cpus)),
        "per_event_wall_s": round(event_wall, 3),
        "per_event_tokens_per_s": round(tokens / event_wall),
        "speed_up_median_of_pairs": round(
            float(np.median(np.array(event_walls) / np.array(walls))), 2
        ),
        "bare_simpy_s": round(bare, 3),
        "per_event_ratio_to_bare": round(
            float(np.median(np.array(event_walls) / np.array(bares))), 2
        ),
        "des_tokens_per_s_metric": round(result.metrics["tokens_per_s"], 3),
        **kept,
    }


def _write_s(result) -> float:
    """Wall seconds to write ``result``'s timeline as a Perfetto trace (a temporary file)."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_perfetto(result, Path(tmp) / "trace.json")
        return time.perf_counter() - start


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    args = parser.parse_args()
    base = load_scenario(REFERENCE)
    requests = math.ceil(args.tokens / base.workload.output_tokens)
    n = [f"workload.requests={requests}"]
    cases = {
        "reference": (n, False),
        "reference_timeline": (n, True),
        "concurrency_8_continuous": (
            [*n, "workload.concurrency=8", "schedule.batching=continuous"],
            False,
        ),
        # the block schedule (wansim/sim/async_speculation.py): stale blocks and cancellations
        "async_k3_8_blocks": ([*n, *ASYNC], False),
        "async_k3_8_blocks_concurrency_16": ([*n, *ASYNC, "workload.concurrency=16"], False),
    }
    results = {
        name: measure(overrides, args.repeat, timeline=timeline)
        for name, (overrides, timeline) in cases.items()
        if not args.only or name in args.only
    }
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
