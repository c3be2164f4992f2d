"""The link emulator's timing accuracy through a real relay process (machine-dependent, so a
benchmark, not a test: the tests check the relay's rule and its wait on a virtual clock).

Two configurations the test suite used to time: a 15 ms link, 64-byte frames every 2 ms; and a
5 ms link at 20 Mbit/s, 16 KiB frames every 2 ms (they queue); and a busy hop, 4 KiB frames
every 2 ms for 3 s, whose relay CPU ``benchmarks/paired.py --field cpu_s`` pairs across trees. Error = achieved one-way delay
minus the relay's schedule, split into the legs into and out of the relay and the relay's own
wake-up lateness. On an idle machine the error's p50 is below 1 ms; the 1-minute load average
is printed beside each row, since busy cores make every wake-up late (a load of 19 on 2 cores
gave p50 errors of 80-450 ms).

Run: .venv/bin/python benchmarks/bench_link_accuracy.py [--repeat 3] [--only CASE]
Needs the ``real`` extra only for numpy (no torch).
"""

from __future__ import annotations

import argparse
import json

from wansim.real.link import LinkSpec
from wansim.real.link_accuracy import measure_link_accuracy

CASES = {
    "15ms-64B-every-2ms": (LinkSpec(latency_ms=15.0), {"frames": 150, "interval_ms": 2.0}),
    "5ms-20Mbps-16KiB-every-2ms": (
        LinkSpec(latency_ms=5.0, bandwidth_mbps=20.0),
        {"frames": 120, "frame_bytes": 16384, "interval_ms": 2.0},
    ),
    # a busy hop (500 frames/s): the relay's own CPU (``--field cpu_s`` of benchmarks/paired.py)
    "5ms-4KiB-every-2ms": (
        LinkSpec(latency_ms=5.0),
        {"frames": 1500, "frame_bytes": 4096, "interval_ms": 2.0},
    ),
}
FIELDS = (
    "error_ms_min",
    "error_ms_p50",
    "error_ms_p99",
    "into_relay_ms_p50",
    "wake_late_ms_p50",
    "out_of_relay_ms_p50",
    "load_avg_1min",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=sorted(CASES), help="one case")
    args = ap.parse_args()
    for name, (spec, kw) in CASES.items():
        if args.only and name != args.only:
            continue
        for i in range(args.repeat):
            acc = measure_link_accuracy(spec, **kw).as_dict()
            row = {"case": name, "run": i, **{f: round(acc[f], 3) for f in FIELDS}}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
