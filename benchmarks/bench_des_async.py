"""Async DES speed: CPU seconds of ``simulate()`` on the benchmark's async case, as one JSON line.

The reference scenario with async in-pipe speculation (K = 3, 8 blocks in flight, drafter on
S0: ``bench_des.ASYNC``), alone or with ``--concurrency`` requests in flight, ``--requests``
requests of 256 tokens (``--sync-batched``: the sync schedule with continuous batching instead,
``bench_des.py``'s concurrency case). Prints the best CPU seconds of ``--repeat`` runs (``cpu_s``, what
``paired.py --field cpu_s_best`` reads), tokens, events, and a digest of the metrics (sha256 of
their JSON), so two source trees run alternately by ``paired.py`` can be checked to give the
same metrics bit for bit. Uses only ``load_scenario`` and ``simulate`` (any tree has them).

Run: .venv/bin/python benchmarks/bench_des_async.py [--requests 80] [--concurrency 1]
     .venv/bin/python benchmarks/paired.py --base DIR --field cpu_s_best -- \\
         $PWD/benchmarks/bench_des_async.py --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from wansim.config.scenario import load_scenario
from wansim.sim import simulate

REFERENCE = Path(__file__).resolve().parents[1] / "scenarios" / "v4pro-dspark-10stage-wan.yaml"
ASYNC = [  # as bench_des.ASYNC
    "drafter.placement=first_stage",
    "drafter.kind=draft_model",
    "speculation.k=3",
    "schedule.kind=async",
    "schedule.max_inflight_blocks=8",
]


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--sync-batched", action="store_true", help="the sync schedule, continuous batching"
    )
    args = parser.parse_args()
    schedule = ["schedule.batching=continuous"] if args.sync_batched else ASYNC
    over = [
        f"workload.requests={args.requests}",
        *schedule,
        f"workload.concurrency={args.concurrency}",
    ]
    scenario = load_scenario(REFERENCE, over)
    cpus = []
    for _ in range(args.repeat):
        start = time.process_time()
        result = simulate(scenario)
        cpus.append(time.process_time() - start)
    tokens = int(result.details["record"].output_tokens)
    metrics = json.dumps(result.metrics, sort_keys=True, default=str)
    out = {
        "cpu_s_best": round(min(cpus), 4),
        "tokens": tokens,
        "tokens_per_cpu_s": round(tokens / min(cpus)),
        "events": int(result.details["events"]),
        "metrics_sha256": hashlib.sha256(metrics.encode()).hexdigest()[:16],
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
