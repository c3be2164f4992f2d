"""Paired timing of two source trees: a command run alternately against each, same machine load.

The shared machines these benchmarks run on are loaded by other jobs, so an absolute time says
little; alternating the two trees run by run and taking the median of the per-pair ratios does.
The baseline tree is a checkout of an older commit (``git archive COMMIT | tar -x -C DIR``);
both run with this venv's interpreter and their own ``wansim`` first on ``PYTHONPATH``.

Run: .venv/bin/python benchmarks/paired.py --base DIR [--repeat 7] [--field F] -- wansim --help
     (``wansim ...`` runs as ``python -m wansim ...``, a ``.py`` script with this interpreter;
     ``--field vectorised_s``: the time the command reports in its JSON instead of the wall)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(tree: Path, command: list[str], field: str | None = None) -> float:
    """Wall seconds of ``command`` with ``tree`` first on the import path; with ``field``, that
    number from the JSON object the command prints instead (a time it measured itself), or
    with ``field="cpu_s"`` the CPU seconds (user + system) the command's process used."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-m", "wansim", *command[1:]] if command[0] == "wansim" else command
    if argv[0].endswith(".py"):
        argv = [sys.executable, *argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if field == "cpu_s":
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall if field is None else float(json.loads(done.stdout)[field])


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True, help="baseline source tree")
    parser.add_argument("--new", type=Path, default=Path.cwd(), help="tree under test (here)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--field", help="time field of the command's JSON output, or cpu_s (else wall)"
    )
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    timed(args.new, args.command)  # warm the file cache for both
    timed(args.base, args.command)
    new, base = [], []
    for _ in range(args.repeat):
        new.append(timed(args.new, args.command, args.field))
        base.append(timed(args.base, args.command, args.field))
    result = {
        "command": " ".join(args.command),
        "measure": args.field or "wall_s",
        "new_s_median": round(statistics.median(new), 3),
        "new_s_best": round(min(new), 3),
        "base_s_median": round(statistics.median(base), 3),
        "base_s_best": round(min(base), 3),
        "speed_up_median_of_pairs": round(
            statistics.median(b / n for b, n in zip(base, new, strict=True)), 2
        ),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
