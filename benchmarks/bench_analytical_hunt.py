"""Analytical speed on the agreement hunt's scenarios: CPU seconds of ``analyze()`` over a
slice of its random scenarios, each with at least two requests in flight (as the monotone
property test draws them: the concurrent, block-schedule and micro-batch fixed points), as one
JSON line.

Prints the CPU seconds of the slice (``cpu_s``, best of ``--repeat``; what ``paired.py
--field cpu_s_best`` reads), the points answered and refused, and a digest of the metrics
(sha256 of their JSON), so two source trees run alternately by ``paired.py`` can be compared
on the same answers. Uses only ``draw_scenario``, ``load_scenario`` and ``analyze``.

Run: .venv/bin/python benchmarks/bench_analytical_hunt.py [--seeds 0:40]
     .venv/bin/python benchmarks/paired.py --base DIR --field cpu_s_best -- \\
         $PWD/benchmarks/bench_analytical_hunt.py --repeat 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.errors import WansimInputError
from wansim.studies.agreement_hunt import draw_scenario


def loaded(seed: int) -> dict:
    """The hunt's scenario, with 4 requests in flight where it had one."""
    data = draw_scenario(seed)
    wl = data["workload"]
    if wl["concurrency"] < 2:
        wl["concurrency"] = 4
        wl["requests"] = max(wl["requests"], 16)
    return data


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0:40", help="first:end of the hunt's seeds")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    first, end = (int(x) for x in args.seeds.split(":"))
    scenarios = [load_scenario(data=loaded(seed)) for seed in range(first, end)]
    cpus = []
    for _ in range(args.repeat):
        answers, refused = [], 0
        start = time.process_time()
        for scenario in scenarios:
            try:
                answers.append(analyze(scenario).metrics)
            except WansimInputError:
                refused += 1
        cpus.append(time.process_time() - start)
    text = json.dumps(answers, sort_keys=True, default=str)
    out = {
        "cpu_s_best": round(min(cpus), 3),
        "points": len(scenarios),
        "refused": refused,
        "metrics_sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
