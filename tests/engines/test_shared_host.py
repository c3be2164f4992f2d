"""``model.host_cores``: stages sharing a host's cores, in the DES (exact processor sharing,
wansim.sim.host) and the analytical engine (the mean-value fixed point,
wansim.analytical.shared_host)."""

from __future__ import annotations

import copy

import pytest
import simpy

from wansim.analytical import analyze
from wansim.analytical.shared_host import scaled
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.sim import simulate
from wansim.sim.host import SharedHost


def _finish_times(cores: int, jobs: list[tuple[float, float]]) -> list[float]:
    env = simpy.Environment(0.0)
    host = SharedHost(env, cores)
    ends = [None] * len(jobs)

    def job(i: int, at: float, work: float):
        yield env.timeout(at)
        yield host.compute(work)
        ends[i] = env.now

    for i, (at, work) in enumerate(jobs):
        env.process(job(i, at, work))
    env.run()
    return ends


def test_two_jobs_on_one_core_by_hand():
    """A (10 ms at t=0) alone until 2 (8 left); from 2 both at rate 1/2: B (4 ms) ends at 10,
    when A has 4 left, alone again: A ends at 14 (= the total work: the core never idles)."""
    assert _finish_times(1, [(0.0, 10.0), (2.0, 4.0)]) == pytest.approx([14.0, 10.0], abs=1e-9)


def test_three_jobs_on_two_cores_by_hand():
    """Three 6 ms jobs at t=0 on 2 cores: each at rate 2/3, all end at 9; a fourth job of 3 ms
    at t=9 runs alone: ends at 12."""
    ends = _finish_times(2, [(0.0, 6.0), (0.0, 6.0), (0.0, 6.0), (9.0, 3.0)])
    assert ends == pytest.approx([9.0, 9.0, 9.0, 12.0], abs=1e-9)


def test_each_jobs_wait_by_hand():
    """The first case's jobs as stages 0 and 1: A took 14 ms for 10 of work (waited 4), B 8 ms
    (from 2 to 10) for 4 (waited 4); the 3-core case never waits."""
    env = simpy.Environment(0.0)
    host = SharedHost(env, 1, stages=3)

    def job(stage: int, at: float, work: float):
        yield env.timeout(at)
        yield host.compute(work, stage)

    env.process(job(0, 0.0, 10.0))
    env.process(job(1, 2.0, 4.0))
    env.run()
    assert host.wait_ms_per_job() == pytest.approx([4.0, 4.0, None], abs=1e-9)


def test_jobs_within_the_cores_never_slow():
    ends = _finish_times(2, [(0.0, 5.0), (1.0, 7.0), (6.0, 1.0)])
    assert ends == pytest.approx([5.0, 8.0, 7.0], abs=1e-9)


def _ring(**model) -> dict:
    """Two stages of 10 ms a pass, no network time to speak of, no drafting, 2 requests."""
    return {
        "stages": 2,
        "seed": 3,
        "model": {"compute": {"kind": "linear", "base_ms": 10.0, "per_token_ms": 0.0}, **model},
        "network": {"latency_ms": 0.0, "bandwidth_mbps": 1e6},
        "speculation": {"policy": "none"},
        "workload": {"requests": 2, "concurrency": 2, "output_tokens": 60, "prompt_tokens": 8},
    }


def test_des_two_passes_on_one_core_take_twice_as_long():
    """Hand-worked: with two requests in a 2-stage ring one pass computes at each stage at
    every instant (after the first prefill), so on one core each 10 ms pass takes 20 ms and a
    lap two passes: 40 ms, against 20 ms with a core per stage."""
    alone = simulate(load_scenario(data=_ring())).metrics
    shared = simulate(load_scenario(data=_ring(host_cores=1))).metrics
    assert alone["lap_ms_p50"] == pytest.approx(20.0, rel=1e-4)
    assert shared["lap_ms_p50"] == pytest.approx(40.0, rel=1e-4)
    assert simulate(load_scenario(data=_ring(host_cores=2))).metrics == alone
    # each pass waits 10 ms of its 20 (the prefills, one at a time at first, less)
    waits = simulate(load_scenario(data=_ring(host_cores=1))).details["host"]["wait_ms_per_job"]
    assert waits == pytest.approx([10.0, 10.0], rel=0.05)
    roomy = simulate(load_scenario(data=_ring(host_cores=2))).details["host"]
    assert roomy["wait_ms_per_job"] == pytest.approx([0.0, 0.0], abs=1e-9)
    assert roomy["peak_jobs"] == 2


def test_one_request_in_flight_is_unchanged_in_both_engines():
    data = _ring()
    data["workload"] = {"requests": 5, "concurrency": 1, "output_tokens": 40}
    with_host = copy.deepcopy(data)
    with_host["model"]["host_cores"] = 1
    for engine in (simulate, analyze):
        a = engine(load_scenario(data=data)).metrics
        b = engine(load_scenario(data=with_host)).metrics
        assert a == b


def test_analytical_two_passes_on_one_core():
    """The mean-value fixed point on the hand-worked ring: both slots compute all the time
    (utilisations 1), so the stretch is (1 + 1) / 1 = 2 and the lap 40 ms."""
    res = analyze(load_scenario(data=_ring(host_cores=1)))
    assert res.details["shared_host"]["stretch"] == pytest.approx(2.0, rel=1e-4)
    assert res.metrics["lap_ms_mean"] == pytest.approx(40.0, rel=1e-3)
    assert res.approximation["validated"] is False


def _heavy_first(heavy_ms: float, latency_ms: float, requests: int) -> dict:
    """Three stages on 2 cores, stage 0 ``heavy_ms`` a pass and the others 1 ms."""
    light = {"kind": "linear", "base_ms": 1.0, "per_token_ms": 0.0}
    return {
        "stages": 3,
        "seed": 3,
        "model": {
            "compute": light,
            "stage_compute": [{**light, "base_ms": heavy_ms}, light, light],
            "host_cores": 2,
        },
        "network": {"latency_ms": latency_ms, "bandwidth_mbps": 1e6},
        "speculation": {"policy": "none"},
        "workload": {
            "requests": 200,
            "concurrency": requests,
            "output_tokens": 60,
            "prompt_tokens": 8,
        },
    }


@pytest.mark.parametrize(
    ("heavy_ms", "latency_ms", "requests", "bound"),
    [(4.0, 0.5, 3, 0.05), (3.0, 0.5, 3, 0.075), (5.0, 1.0, 4, 0.04)],
)
def test_a_saturated_stage_is_stretched_by_the_others_alone(heavy_ms, latency_ms, requests, bound):
    """A stage that computes all the time sees the other passes compute at the other stages
    only: its stretch is its own (stage_stretches), not one stretch for every stage. Against
    the DES (exact processor sharing) on rings whose stage 0 is the bottleneck: -4.0%, -6.4%,
    -2.3% on tokens/s, where one stretch for every stage gave -11.6%, -13.8%, -9.9%."""
    sc = load_scenario(data=_heavy_first(heavy_ms, latency_ms, requests))
    a, d = analyze(sc), simulate(sc)
    stretch = a.details["shared_host"]["stage_stretch"]
    assert stretch[0] < stretch[1] == pytest.approx(stretch[2])
    assert a.details["shared_host"]["converged"]
    err = a.metrics["tokens_per_s"] / d.metrics["tokens_per_s"] - 1
    assert abs(err) <= bound, err


def test_per_stage_scaling_is_each_stages_own():
    """scaled() with a factor per stage: each stage's pass (compute, overhead, per sequence)
    times its own factor; the drafter (the default: at the last stage) times that stage's."""
    from wansim.stages.compute import stage_ms_each

    sc = load_scenario(data=_ring(overhead_ms=1.5, sequence_ms=0.25))
    each = scaled(sc, [1.5, 3.0])
    for seqs in (1, 3):
        base = [float(x) for x in stage_ms_each(sc, 5, sequences=seqs)]
        got = [float(x) for x in stage_ms_each(each, 5, sequences=seqs)]
        assert got == pytest.approx([1.5 * base[0], 3.0 * base[1]], rel=1e-12)
    assert sc.drafter.placement == "last_stage"
    assert each.drafter.draft_ms == 3.0 * sc.drafter.draft_ms
    assert each.model.host_cores is None


def test_scaled_scenario_costs_scale_exactly():
    sc = load_scenario(data=_ring(overhead_ms=1.5))
    from wansim.stages.compute import stage_ms_each

    twice = scaled(sc, 2.0)
    assert [float(x) for x in stage_ms_each(twice, 5)] == pytest.approx(
        [2 * float(x) for x in stage_ms_each(sc, 5)], rel=1e-12
    )
    assert twice.drafter.draft_ms == 2 * sc.drafter.draft_ms
    assert twice.model.host_cores is None


def test_bad_host_cores_is_one_line():
    with pytest.raises(ScenarioError, match=r"model\.host_cores"):
        load_scenario(data=_ring(host_cores=0))
