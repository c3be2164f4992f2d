"""A stage that dies mid-run in the new modes (batched, async, tree): the run ends with a named
error (which stage, which hops lost their peer) and what finished is kept: the job's trace so
far, and in ``calibrate predict`` the finished cells (real runs and both engines' predictions)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")

from wansim.real.config import DecodeSpec, PipelineSpec, TreeSpec  # noqa: E402
from wansim.real.errors import PipelineError  # noqa: E402
from wansim.real.runner import Pipeline  # noqa: E402

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[2]

MODES = {
    "batched": DecodeSpec(k=2, max_new_tokens=40, batching="continuous", concurrency=2),
    "async": DecodeSpec(k=2, max_new_tokens=40, schedule="async", max_inflight_blocks=2),
    "tree": DecodeSpec(max_new_tokens=40, tree=TreeSpec("static", branching=(2, 1))),
}


@pytest.mark.parametrize(
    "mode",
    [
        "batched",
        pytest.param("async", marks=pytest.mark.slow),
        pytest.param("tree", marks=pytest.mark.slow),
    ],
)
def test_stage_crash_in_new_modes_is_named_and_trace_kept(tiny_dirs, code_prompts, tmp_path, mode):
    """The middle stage of 3 dies on its 6th pass (fault injection: exit code 3, no report)."""
    target_dir, drafter_dir = tiny_dirs
    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        stages=3,
        fail_stage_after_passes=(1, 5),
        stall_timeout_s=30,
    )
    with Pipeline(spec, tmp_path) as pipe, pytest.raises(PipelineError) as err:
        pipe.generate(code_prompts[:2], MODES[mode], name="dead")
    msg = str(err.value)
    assert err.value.stage == 1, msg
    assert "stage 1 died (exit code 3)" in msg, msg
    assert "hop 0 (stage 0 -> stage 1)" in msg and "hop 1 (stage 1 -> stage 2)" in msg
    trace = tmp_path / "dead" / "trace.csv"
    rows = [line for line in trace.read_text().splitlines() if line and not line.startswith("#")]
    assert len(rows) >= 2  # the header and the steps verified before the crash


@pytest.mark.slow
def test_predict_keeps_finished_cells_when_a_stage_is_killed(tmp_path, tiny_dirs):
    """``calibrate predict`` over a chain cell and a batched 3-stage cell; stage 2 of the
    batched cell holds at its 3rd pass (WANSIM_HOLD_AFTER, wansim.support.hold) and is killed there
    (SIGKILL): exit 1, one line naming the dead stage, and the finished chain cell printed and
    kept in predict.json (complete: false) with both engines' predictions."""
    from wansim.calibrate.profiling import run_profile

    target, drafter = tiny_dirs
    run_profile(
        tmp_path / "bundle",
        quick=True,
        target_dir=target,
        drafter_dir=drafter,
        plans=((((0, 1), (1, 6)), 32), (((0, 5), (5, 6)), 32)),
        ks=(2,),
        size={
            "prompts": 1,
            "tokens": 16,
            "acceptance_prompts": 2,
            "acceptance_tokens": 16,
            "tree_prompts": 1,
            "tree_tokens": 16,
            "quality_prompts": 1,
            "quality_tokens": 8,
        },
    )
    matrix = tmp_path / "matrix.yaml"
    cells = [
        {"stages": 2, "latency_ms": 1, "k": 2},
        {"stages": 3, "latency_ms": 1, "k": 2, "concurrency": 2, "batching": "continuous"},
    ]
    matrix.write_text(yaml.safe_dump({"defaults": {"prompts": 2, "tokens": 12}, "cells": cells}))
    out = tmp_path / "out"
    pidfile = tmp_path / "held.pid"
    cmd = [
        sys.executable, "-m", "wansim", "calibrate", "predict", "--profile",
        str(tmp_path / "bundle"), "--matrix", str(matrix), "--out", str(out),
        "--des-requests", "100", "--json", "--target", target, "--drafter", drafter,
    ]  # fmt: skip
    env = {
        **os.environ,
        "WANSIM_HOLD_AFTER": "stage2-pass:3",  # only the batched cell has a stage 2
        "WANSIM_HOLD_PIDFILE": str(pidfile),
    }
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + 400  # guards against a hang only; the hold waits for us
    try:
        while not pidfile.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pidfile.is_file(), proc.communicate(timeout=60)
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("calibrate predict failed: stage 2 died (exit code -9)"), last
    kept = json.loads((out / "predict.json").read_text())
    assert kept["summary"]["complete"] is False
    assert kept["summary"]["finished_cells"] == ["P2-L1-K2"]
    by_name = {c["name"]: c for c in kept["cells"]}
    chain = by_name["P2-L1-K2"]
    assert chain["status"] == "measured" and len(chain["real"]["runs"]) == 1
    assert chain["des"]["tokens_per_s"] > 0 and chain["analytical"]["tokens_per_s"] > 0
    assert by_name["P3-L1-K2-concurrent-batched"]["status"] == "pending"
    assert json.loads(stdout)["cells"] == kept["cells"]
