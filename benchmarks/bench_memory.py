"""Peak resident memory of long DES runs (each in a fresh process: ``ru_maxrss``).

The reference scenario with enough requests for ``--tokens`` output tokens; the baseline in
the same run is the interpreter with the same imports and a 2-request run (what every run costs
before its length matters).

Run: .venv/bin/python benchmarks/bench_memory.py [--tokens 10000000]
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
requests = int(sys.argv[1])
sc = load_scenario("scenarios/v4pro-dspark-10stage-wan.yaml", [f"workload.requests={requests}"])
start = time.perf_counter()
result = simulate(sc)
wall = time.perf_counter() - start
print(json.dumps({"output_tokens": result.details["record"].output_tokens, "wall_s": round(wall, 2),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


def run(requests: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(requests)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=10_000_000)
    args = parser.parse_args()
    per_request = 256  # the reference's output_tokens
    result = {
        "baseline_2_requests": run(2),
        "engine": run(math.ceil(args.tokens / per_request)),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
