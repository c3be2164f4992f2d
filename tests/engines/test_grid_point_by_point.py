"""TCP, faults, a KV capacity and a shared host on a grid (``analytical.grid.evaluate_grid``,
and so ``wansim optimize`` and vectorised sweeps): each point by the model ``analyze`` uses.

The vectorised closed forms have none of them (TCP's window is a fixed point of the lap, the
faults an expected value over the run, a KV capacity an admission limit and its queue, a shared
host a fixed point of the compute stretch): a tcp ring on the grid once came out as the ideal
transport's (the frame-per-lap ring at 20 ms: 20.96 tokens/s where ``wansim run`` says 6.35), a
KV-limited or shared-host ring as if unlimited, silently, and a faulty ring was refused."""

from __future__ import annotations

import subprocess
import sys

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
    ideal ring's tokens/s; at 10 ms (RTT 20 ms < the lap) the window stays open, but for the
    run's first request, whose prompt and first frames meet cold connections: 0.2% of the
    run's tokens/s (on the scenario at 10 ms the DES's tcp/ideal is 0.9966, this 0.9967)."""
    tcp = evaluate_grid(load_scenario(TCP), GRID)
    ideal = evaluate_grid(load_scenario(TCP, ["network.transport=ideal"]), GRID)
    slow = tcp["network.latency_ms"] == 20.0
    ratio = tcp["tokens_per_s"] / ideal["tokens_per_s"]
    assert (ratio[slow] < 0.4).all()
    assert ((ratio[~slow] <= 1.0) & (ratio[~slow] > 0.995)).all(), ratio


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


# hunt points (wansim.studies.agreement_hunt.draw_scenario) whose one-point grid once differed
# from wansim run: a KV capacity (seeds 21, 43, 49, 51, 56: its admission limit and queue were
# left out, throughput up to 4x), tcp with 4 requests and a failure (276: the faults taken on
# the tcp scenario, not on its ideal equivalent as analyze takes them) beside others that
# always agreed (0, 2, 5)
AGREEING = (0, 2, 5, 21, 43, 49, 51, 56, 276)


def _one_point_agrees(seed: int) -> None:
    from wansim.studies.agreement_hunt import draw_scenario

    scenario = load_scenario(data=draw_scenario(seed))
    try:
        ran = analyze(scenario).metrics
    except WansimInputError:
        return
    try:
        row = evaluate_grid(scenario, {}).iloc[0]
    except WansimInputError:
        return  # refused in one line: drift, lengths that differ, the hybrid
    for key in ("tokens_per_s", "throughput_tokens_per_s", "ttft_ms_mean", "lap_ms_mean"):
        assert row[key] == pytest.approx(ran[key], rel=1e-9), (seed, key)


@pytest.mark.parametrize("seed", AGREEING)
def test_a_one_point_grid_is_wansim_runs_answer_or_refused(seed):
    _one_point_agrees(seed)


@pytest.mark.slow
def test_a_one_point_grid_is_wansim_runs_answer_or_refused_over_the_hunt():
    for seed in range(300):
        _one_point_agrees(seed)


def test_a_shared_host_on_the_grid():
    """Four requests on one core: the grid's point is the shared host's fixed point, as
    wansim run answers it (it was the uncontended ring's, 8.55 tokens/s against 6.65)."""
    sets = ["workload.concurrency=4", "model.host_cores=1", "faults.events=[]"]
    frame = evaluate_grid(load_scenario(FAILOVER, sets), {"speculation.k": [2, 4]})
    for _, row in frame.iterrows():
        one = analyze(load_scenario(FAILOVER, [*sets, f"speculation.k={row['speculation.k']}"]))
        assert row["tokens_per_s"] == pytest.approx(one.metrics["tokens_per_s"], rel=1e-12)
        assert "shared host" in one.approximation["regime"]


def test_what_no_grid_answers_is_refused_point_by_point_too():
    """The per-round hybrid on a tcp ring (hunt seeds 243, 270) went down the point-by-point
    path, which answered it as a plain async ring (tokens/s 76.7 where wansim run says 48.1)."""
    for seed in (243, 270):
        from wansim.studies.agreement_hunt import draw_scenario

        scenario = load_scenario(data=draw_scenario(seed))
        with pytest.raises(ScenarioError, match=r"^schedule\.hybrid_confident_fraction: "):
            evaluate_grid(scenario, {})
