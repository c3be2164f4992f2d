"""The analytical engine's answer on a tcp ring: CPU seconds of one ``analyze`` (best of
``--repeat``, the request walk's cache cleared before each) for one request, one request with
a last-stage drafter, one request of lognormal lengths and one micro-batch of 8 (one frame a
lap, walked), and 8 requests without batching (a train, with the window range where the tree
has it) on ``scenarios/tcp-ring-frame-per-lap.yaml``, with a digest of the metrics to 9
significant digits (equal answers).

Run paired against an older tree: .venv/bin/python benchmarks/paired.py --base DIR --repeat 5
--field one_batch_s -- $PWD/benchmarks/bench_analytical_tcp.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import yaml

from wansim.analytical import analyze
from wansim.config.scenario import load_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "tcp-ring-frame-per-lap.yaml"
CASES = {
    "one_request": {},
    "last_stage": {"drafter": {"placement": "last_stage"}},
    "varied_lengths": {"workload": {"lengths": {"kind": "lognormal", "output_cv": 0.78}}},
    "one_batch": {
        "schedule": {"batching": "continuous", "micro_batches": 1},
        "workload": {"concurrency": 8},
    },
    "eight_requests": {"workload": {"concurrency": 8}},
}


def scenario(case: dict):
    data = yaml.safe_load(SCENARIO.read_text())
    data["workload"]["requests"] = 48
    for section, changes in case.items():
        data[section].update(changes)
    return load_scenario(data=data)


def fresh() -> None:
    """Forget the request walks remembered per scenario (where the tree has them)."""
    from wansim.analytical import transport

    walk = getattr(transport, "request_walk_ms", None)
    if hasattr(walk, "cache_clear"):
        walk.cache_clear()


def rounded(value):
    """``value`` with its floats to 9 significant digits (lists and dicts walked)."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    out = {}
    for name, case in CASES.items():
        sc = scenario(case)
        metrics = analyze(sc).metrics  # warm: imports and caches
        best = float("inf")
        for _ in range(args.repeat):
            fresh()
            start = time.process_time()
            analyze(sc)
            best = min(best, time.process_time() - start)
        out[f"{name}_s"] = best
        text = json.dumps(rounded(metrics), sort_keys=True, default=str)
        out[f"{name}_digest"] = hashlib.sha256(text.encode()).hexdigest()[:12]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
