"""TCP and faults on a grid (``analytical.grid.evaluate_grid``, and so ``wansim optimize`` and
vectorised sweeps): each point by the model ``analyze`` uses, one point at a time.

The vectorised closed forms have neither TCP's window (a fixed point of the lap) nor the faults'
expected value over the run: a tcp ring on the grid once came out as the ideal transport's
(the frame-per-lap ring at 20 ms: 20.96 tokens/s where ``wansim run`` says 6.35), and a faulty
ring was refused."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from wansim.analytical import analyze, evaluate_grid
from wansim.analytical.engine import mean_metrics
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError, WansimInputError
from wansim.studies.optimize import optimize

TCP = "scenarios/tcp-ring-frame-per-lap.yaml"
FAILOVER = "scenarios/ring-stage-failover.yaml"
GRID = {"speculation.k": [2, 4], "network.latency_ms": [10.0, 20.0]}
SAME = ("tokens_per_s", "throughput_tokens_per_s", "ttft_ms_mean", "tau", "lap_ms_mean")


@pytest.mark.parametrize("path", [TCP, FAILOVER])
def test_every_point_is_what_wansim_run_answers(path):
    frame = evaluate_grid(load_scenario(path), GRID)
    assert len(frame) == 4
    for _, row in frame.iterrows():
        sets = [f"speculation.k={int(row['speculation.k'])}"]
        sets.append(f"network.latency_ms={row['network.latency_ms']}")
        one = analyze(load_scenario(path, sets)).metrics
        for key in SAME:
            assert row[key] == pytest.approx(one[key], rel=1e-12), (path, sets, key)
        assert row["bubble_fraction"] == pytest.approx(one["bubble_fraction"], abs=1e-12)


def test_the_tcp_grid_is_not_the_ideal_transports():
    """At 20 ms a hop every frame of the frame-per-lap ring restarts its window: a third of the
    ideal ring's tokens/s; at 10 ms (RTT 20 ms < the lap) the window stays open."""
    tcp = evaluate_grid(load_scenario(TCP), GRID)
    ideal = evaluate_grid(load_scenario(TCP, ["network.transport=ideal"]), GRID)
    slow = tcp["network.latency_ms"] == 20.0
    ratio = tcp["tokens_per_s"] / ideal["tokens_per_s"]
    assert (ratio[slow] < 0.4).all() and np.allclose(ratio[~slow], 1.0)


def test_the_vectorised_forms_refuse_what_they_cannot_broadcast():
    for path, field in ((TCP, "network.transport"), (FAILOVER, "faults.events")):
        with pytest.raises(ScenarioError, match=rf"^{field}: is answered one point at a time"):
            mean_metrics(load_scenario(path))


def test_optimize_a_faulty_ring():
    """K on the fail-over ring, by goodput (one analytical run a point for it): the ranking's
    tokens/s and goodput are ``wansim run``'s."""
    res = optimize(FAILOVER, [("speculation.k", [2, 3, 4, 5])], metric="goodput_tokens_per_s")
    assert res["evaluated"] == 4 and not res["skipped"]
    best = res["table"].iloc[0]
    one = analyze(load_scenario(FAILOVER, [f"speculation.k={int(best['speculation.k'])}"]))
    assert best["goodput_tokens_per_s"] == pytest.approx(one.metrics["goodput_tokens_per_s"])
    assert best["tokens_per_s"] == pytest.approx(one.metrics["tokens_per_s"], rel=1e-12)
    assert list(res["table"]["goodput_tokens_per_s"]) == sorted(
        res["table"]["goodput_tokens_per_s"], reverse=True
    )


def test_optimize_on_the_command_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "wansim", "optimize", TCP, "--over", "network.latency_ms=10,20"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "network.latency_ms=10" in proc.stdout.splitlines()[1]  # the faster ring first


def test_a_fault_metric_without_faults_is_refused():
    with pytest.raises(WansimInputError, match=r"^--metric: is reported with faults only"):
        optimize(TCP, [("speculation.k", [2, 3])], metric="goodput_tokens_per_s")
