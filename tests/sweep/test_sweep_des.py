"""DES sweeps: a real ``wansim sweep`` process killed with SIGKILL mid-run, resumed, and compared
with a clean run, on the local pool and on Dask."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REFERENCE, ROOT
from wansim.sweep import run_sweep

ISSUE_SWEEP = ROOT / "scenarios" / "k-latency-sweep.yaml"
GRID = {"speculation.k": [1, 3, 5, 7], "network.latency_ms": [5, 25, 80]}


def small_des_sweep(tmp_path) -> Path:
    """The issue's 24-run grid with short runs (8 requests x 300 tokens)."""
    doc = {
        "base": str(REFERENCE),
        "engine": "des",
        "grid": GRID,
        "set": {"workload.output_tokens": 300, "workload.requests": 8},
        "seeds": 2,
    }
    path = tmp_path / "des-sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def sweep_cmd(sweep: Path, out: Path, backend: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "wansim",
        "sweep",
        str(sweep),
        "--out",
        str(out),
        "--backend",
        backend,
        "--workers",
        "2",
        "--batch-size",
        "1",
        "--quiet",
        *extra,
    ]


def parts(out: Path) -> list[Path]:
    return sorted((out / "parts").glob("part-*.parquet")) if (out / "parts").is_dir() else []


def kill_mid_run(cmd: list[str], out: Path, min_parts: int, timeout_s: float) -> int:
    """Start the sweep in its own process group, SIGKILL the whole group (the sweep and its
    workers: a machine going down) once ``min_parts`` batches are on disk; return how many.

    The sweep holds after its ``min_parts``-th shard (``WANSIM_HOLD_AFTER``, wansim.support.hold) until
    the kill, so it cannot finish first under load; the deadline only guards against a hang."""
    env = {**os.environ, "WANSIM_HOLD_AFTER": f"sweep-part:{min_parts}"}
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.monotonic() + timeout_s
    try:
        while len(parts(out)) < min_parts:
            if proc.poll() is not None:
                raise AssertionError(f"sweep ended before the kill: {proc.communicate()}")
            if time.monotonic() > deadline:
                raise AssertionError("no results appeared in time")
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    return len(parts(out))


def check_killed_then_resumed(sweep: Path, out: Path, backend: str, clean, min_parts, timeout):
    kept = kill_mid_run(sweep_cmd(sweep, out, backend), out, min_parts, timeout)
    assert not (out / "results.parquet").exists()
    assert kept == min_parts < clean.plan.n_runs
    done = subprocess.run(
        sweep_cmd(sweep, out, backend, "--resume"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # only the missing runs were computed (a batch is one run here)
    assert f"{clean.plan.n_runs - kept} computed, {kept} reused" in done.stdout
    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == clean.plan.n_runs
    assert not table.duplicated(["point", "replicate"]).any()
    pd.testing.assert_frame_equal(table, clean.table)


@pytest.fixture(scope="module")
def small_clean(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clean")
    sweep = small_des_sweep(tmp)
    return sweep, run_sweep(sweep, tmp / "out", workers=1, progress=False)


def test_des_sweep_table(small_clean):
    _, clean = small_clean
    table = clean.table
    assert len(table) == 24 and table["seed"].is_unique
    assert {"tokens_per_s", "tokens_per_s_ci95_low", "tau", "stage_utilization_9"} <= set(
        table.columns
    )
    # two seeds of the same point are different samples
    by_point = table.groupby("point")["tokens_per_s"]
    assert (by_point.nunique() == 2).all()
    # and the physics shows through: more latency, fewer tokens/s at every K and seed
    for _, g in table.groupby(["speculation.k", "replicate"]):
        assert g.sort_values("network.latency_ms")["tokens_per_s"].is_monotonic_decreasing


@pytest.mark.parametrize("backend", ["local", pytest.param("dask", marks=pytest.mark.slow)])
def test_sigkill_then_resume_equals_clean_run(tmp_path, small_clean, backend):
    if backend == "dask":
        pytest.importorskip("dask.distributed")
    sweep, clean = small_clean
    check_killed_then_resumed(sweep, tmp_path / "out", backend, clean, 2, 120)


@pytest.mark.slow
def test_issue_sweep_sigkill_resume_on_both_backends(tmp_path):
    """The issue's sweep as written (24 DES runs of 64 requests x 3000 tokens)."""
    clean = run_sweep(ISSUE_SWEEP, tmp_path / "clean", workers=2, progress=False)
    assert len(clean.table) == 24
    for backend in ("local", "dask"):
        check_killed_then_resumed(ISSUE_SWEEP, tmp_path / backend, backend, clean, 3, 600)
