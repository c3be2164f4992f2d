"""The DES's cost per simulated token with the WAN-physics features off, paired against a
baseline checkout (the commit before them), and with them on.

Each run is a fresh subprocess (so the two code trees never share a process) that times one
``simulate()`` of the reference scenario with enough requests for ``--tokens`` output tokens;
baseline and branch alternate ``--repeat`` times and the reported ratio is the median of the
paired (branch / baseline) wall-time ratios, robust to a shared machine's load drifting between
pairs. The feature rows (per-message costs, tcp, payload per hop, compute noise and
stragglers, drift) run on the branch only, paired with its own features-off run.

Run: .venv/bin/python benchmarks/bench_wan_physics.py --baseline DIR [--repeat 5]
(DIR: a checkout of the baseline commit, e.g. ``git worktree add /tmp/base <commit>``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path.cwd()
REFERENCE = "scenarios/v4pro-dspark-10stage-wan.yaml"
CHILD = """
import json, sys, time
from wansim.config.scenario import load_scenario
from wansim.sim import simulate
over = json.loads(sys.argv[1])
sc = load_scenario(sys.argv[2], over)
simulate(load_scenario(sys.argv[2], [*over, "workload.requests=2"]))  # warm caches
t = time.perf_counter()
r = simulate(sc)
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "tokens": int(r.details["record"].output_tokens),
                  "events": r.details["events"]}))
"""


def run(tree: Path, overrides: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(overrides), str(tree / REFERENCE)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
    )
    return json.loads(out.stdout)


def paired(a_tree: Path, a_over, b_tree: Path, b_over, repeat: int) -> dict:
    ratios, a_walls, b_walls = [], [], []
    for _ in range(repeat):
        a, b = run(a_tree, a_over), run(b_tree, b_over)
        ratios.append(b["wall_s"] / a["wall_s"])
        a_walls.append(a["wall_s"] / a["tokens"] * 1e6)
        b_walls.append(b["wall_s"] / b["tokens"] * 1e6)
    return {
        "ratio_median": round(float(np.median(ratios)), 3),
        "ratio_min_max": [round(min(ratios), 3), round(max(ratios), 3)],
        "us_per_token_a_best": round(min(a_walls), 2),
        "us_per_token_b_best": round(min(b_walls), 2),
        "events_b": b["events"],
    }


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--only", default="", help="comma-separated row names (default: all)")
    args = parser.parse_args()
    n = [f"workload.requests={-(-args.tokens // 256)}"]
    per_message = [*n, "network.per_message_ms=3", "network.codec_ms_per_mb=2"]
    tcp = [*n, "network.transport=tcp"]
    extras = [
        *n,
        "payload.return_token_bytes=4",
        "payload.extra_tensors=[{stage: 2, values_per_token: 7168}]",
    ]
    slowdowns = [
        *n,
        "model.noise.kind=lognormal",
        "model.noise.cv=0.2",
        "model.straggler.fraction=0.05",
        "model.straggler.factor=3",
    ]
    drift = [*n, "network.drift.latency_factor=1.3", "network.drift.over_ms=60000"]
    rows = {
        "features_off_vs_baseline": (args.baseline, n, HERE, n),
        "per_message_costs_vs_off": (HERE, n, HERE, per_message),
        "tcp_vs_off": (HERE, n, HERE, tcp),
        "payload_per_hop_vs_off": (HERE, n, HERE, extras),
        "noise_and_stragglers_vs_off": (HERE, n, HERE, slowdowns),
        "drift_vs_off": (HERE, n, HERE, drift),
    }
    only = set(args.only.split(",")) if args.only else set(rows)
    results = {name: paired(*row, args.repeat) for name, row in rows.items() if name in only}
    results["load_avg_1min"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
