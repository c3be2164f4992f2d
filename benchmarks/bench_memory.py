"""Peak resident memory of long DES runs (each in a fresh process: ``ru_maxrss``).

The reference scenario with enough requests for ``--tokens`` output tokens; the baseline in
the same run is the interpreter with the same imports and a 2-request run (what every run costs
before its length matters).

``--sweep-points N``: instead, a DES sweep of N tiny runs (2 stages, 2 requests x 16 tokens,
N seeds of one point, local pool of 2 workers) with the parent's resident memory sampled every
0.1 s: flat means the parent does not grow with the runs it has collected (results stream to
shards on disk).

Run: .venv/bin/python benchmarks/bench_memory.py [--tokens 10000000] [--sweep-points 5000]
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
from wansim.config.scenario import load_scenario
from wansim.sim import simulate
requests = int(sys.argv[1])
sc = load_scenario("scenarios/v4pro-dspark-10stage-wan.yaml", [f"workload.requests={requests}"])
start = time.perf_counter()
result = simulate(sc)
wall = time.perf_counter() - start
print(json.dumps({"output_tokens": result.details["record"].output_tokens, "wall_s": round(wall, 2),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


SWEEP_CHILD = """
import json, sys, tempfile, threading, time
from pathlib import Path
from wansim.sweep import parse_sweep, run_sweep
n = int(sys.argv[1])
samples = []
stop = threading.Event()
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
def sample():
    t0 = time.perf_counter()
    while not stop.is_set():
        samples.append((time.perf_counter() - t0, rss_mb()))
        time.sleep(0.1)
raw = {"name": "mem", "base": "scenarios/v4pro-dspark-10stage-wan.yaml", "engine": "des",
       "grid": {"network.latency_ms": [5.0]}, "seeds": n,
       "set": {"stages": 2, "workload.requests": 2, "workload.output_tokens": 16}}
spec = parse_sweep(raw, Path.cwd())
thread = threading.Thread(target=sample, daemon=True)
thread.start()
with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    outcome = run_sweep(spec, Path(tmp) / "out", workers=2, progress=False)
    wall = time.perf_counter() - start
stop.set()
thread.join()
t_end = samples[-1][0]
at = lambda f: max(r for t, r in samples if t <= f * t_end)
print(json.dumps({"runs": len(outcome.table), "wall_s": round(wall, 1),
                  "rss_mb_peak_by_25_50_75_100pct_of_time": [round(at(f), 1) for f in (0.25, 0.5, 0.75, 1.0)]}))
"""


def sweep_memory(points: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SWEEP_CHILD, str(points)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


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
    parser.add_argument("--sweep-points", type=int, help="measure a DES sweep's parent instead")
    args = parser.parse_args()
    if args.sweep_points:
        result = {
            "sweep": sweep_memory(args.sweep_points),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
        print(json.dumps(result, indent=2))
        return result
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
