"""Fuzzing (issue 17 part 5): generated scenarios never crash, hang, exhaust memory or yield
NaN/inf; every rejection is one line naming the field (exit 2 through the CLI).

Everything is seeded (:func:`fuzz_cases.make_case` is a pure function of seed and index), so a
failure names a case that ``python tests/fuzz/fuzz_harness.py SEED INDEX [--cli]`` reproduces.
The time limits (:mod:`fuzz_harness`: 120 s a case) are hang detectors far above any case's
cost, not timing assertions: the slowest case seen (async with 3 concurrent requests, analytical)
took 48 s on 2 cores at load average 24 (~4 s unloaded).

Last slow run (seed 17, main at d5f220b, 2026-12-03, nice 10 at load 1-4, 260 s): 10,000
cases in process: 8,640 rejected with one line, 1,360 ok, 0 failures (no crash, hang, memory
blow-up or NaN/inf), slowest 33 s; 300 CLI cases: 266 rejected (exit 2, one line), 34 ok, 0
failures, slowest 27 s. The run before it (main at 3e98497) had found 17 failures in code new
that day (zero-size max and a 1e9-float pmf in ``analytical/batched.py``, a 1,024-stage
concurrent ring evaluating the head-of-line wait per hop); each is fixed with a regression
case in ``test_fuzz_regressions.py``. Reproduce a case: ``python tests/fuzz/fuzz_harness.py
17 INDEX``.

Fresh seeds (2026-12-06, main at 97dd400 and after): seeds 4545-4553, 4555-4559 and
4561-4566 x 20,000 cases in process, and 3 x 600 CLI cases (seeds 4554, 4560, 4567), found 11
defects, each fixed with a regression case: an IndexError (a one-stage ring with
an extra tensor and several requests), OverflowError/ValueError where a lap of ~1e13 ms has a
grid finer than its float resolution (the waits' and the shifted mixture's grids), a brentq
bracket that rounds to one point (a 1e7-token prompt), a negative delay (a drift factor near
0 under jitter), a TypeError (a stage inheriting a model.compute that is not a mapping),
OSErrors from a file name too long to look up and from a file that cannot be read
(/proc/self/mem), and three error lines (a 10,053-character path, 418 characters, a blank
key). Seeds 4550-4552, 4556-4559, 4561, 4562, 4566 and CLI 4554, 4567 found nothing.
"""

from __future__ import annotations

import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_cases import FAMILIES, make_case
from fuzz_harness import run_cli, run_pool, summarise

SEED = 17
FAST_CASES = 200
FAST_CLI = 10
SLOW_CASES = 10_000
SLOW_CLI = 300


def _check(outcomes, what: str) -> None:
    summary = summarise(outcomes)
    print(
        f"{what}: {summary['cases']} cases, {summary['counts']}, slowest {summary['slowest_s']} s"
    )
    assert not summary["failures"], "\n".join(summary["failures"])


def _cli_cases(indices: list[int], workers: int) -> list:
    def one(index: int):
        case = make_case(SEED, index)
        command = "run" if index % 2 else "validate"
        with tempfile.TemporaryDirectory(prefix="wansim-fuzz-cli-") as tmp:
            return run_cli(case, command, Path(tmp))

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, indices))


def test_every_family_is_generated_and_cases_are_reproducible():
    families = {make_case(SEED, i).family for i in range(FAST_CASES)}
    assert families == set(FAMILIES)
    a, b = make_case(SEED, 123), make_case(SEED, 123)
    assert (a.label, a.data, a.files, a.overrides) == (b.label, b.data, b.files, b.overrides)


def test_fuzz_fast_slice():
    """~200 cases in process (validation, both engines) and ~10 through the CLI."""
    _check(run_pool(SEED, list(range(FAST_CASES)), workers=1), "in process")
    _check(_cli_cases(list(range(FAST_CLI)), workers=1), "CLI")


@pytest.mark.slow
def test_fuzz_ten_thousand_scenarios():
    start = time.perf_counter()
    _check(run_pool(SEED, list(range(SLOW_CASES)), workers=2), "in process")
    # through the CLI: a stride over the same cases (31 is prime to the family cycle, so every
    # family is covered)
    _check(_cli_cases([7 + 31 * i for i in range(SLOW_CLI)], workers=2), "CLI")
    print(f"fuzz: {time.perf_counter() - start:.0f} s")
