"""Peak resident memory of long DES runs (each in a fresh process: ``ru_maxrss``).

The reference scenario with enough requests for ``--tokens`` output tokens, run by the engine
as users run it and by the per-event reference (``per_event=True``); the baseline in the same
run is the interpreter with the same imports and a 2-request run (what every run costs before
its length matters).

Run: .venv/bin/python benchmarks/bench_memory.py [--tokens 10000000] [--per-event-tokens 1000000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

CHILD = """
import json, resource, sys, time
from wansim.scenario import load_scenario
from wansim.sim import simulate
requests, per_event = int(sys.argv[1]), sys.argv[2] == "1"
sc = load_scenario("scenarios/v4pro-dspark-10stage-wan.yaml", [f"workload.requests={requests}"])
start = time.perf_counter()
result = simulate(sc, per_event=per_event)
wall = time.perf_counter() - start
print(json.dumps({"output_tokens": result.details["record"].output_tokens, "wall_s": round(wall, 2),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


def run(requests: int, per_event: bool) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(requests), "1" if per_event else "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--per-event-tokens", type=int, default=1_000_000)
    args = parser.parse_args()
    per_request = 256  # the reference's output_tokens
    result = {
        "baseline_2_requests": run(2, False),
        "engine": run(math.ceil(args.tokens / per_request), False),
        "per_event_reference": run(math.ceil(args.per_event_tokens / per_request), True),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
