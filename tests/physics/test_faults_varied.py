"""Faults with requests that differ (length distributions, mixes) in the analytical engine
(:func:`wansim.analytical.faults.fault_run_mixed`): a failure finds a kind of request in
proportion to the ring time its requests take, each kind races the rate clock with its own
length, and each kind's rate takes its own hits. Checked by brute force (which request a
failure finds), by consistency with the one-kind model, and against the DES's mean over seeds
on the 8-stage failover ring of ``scenarios/ring-stage-failover.yaml``."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.physics.faults_agreement import agrees_with_des_mean
from wansim.analytical.faults import fault_run, fault_run_mixed
from wansim.config.scenario import load_scenario

RING = ROOT / "scenarios" / "ring-stage-failover.yaml"
RATED = ["faults.events=[{stage: 2, rate_per_hour: 60}]", "faults.detection_s=2"]


def _means(prefill_ms: float, passes: float, lap_ms: float) -> dict:
    return {
        "prefill_ms": prefill_ms,
        "passes_per_request": passes,
        "lap_ms_mean": lap_ms,
        "lap_ms_var": 4.0,
        "tokens_per_s": 10.0,
        "ttft_ms_mean": prefill_ms,
    }


def test_a_failure_finds_a_kind_by_its_ring_time_brute_force():
    """Two kinds half and half, 1 s and 3 s long: requests run back to back in random order
    and failures fall uniformly in time; by brute force 3/4 of them find a long one. The
    model's share of hits (and its added ring time: the time-weighted mean) says the same."""
    rng = np.random.default_rng(7)
    lengths = rng.permutation(np.repeat([1.0, 3.0], 20_000))
    ends = np.cumsum(lengths)
    at = rng.uniform(0, ends[-1], 50_000)
    found = lengths[np.searchsorted(ends, at)]
    assert np.mean(found == 3.0) == pytest.approx(0.75, abs=0.01)

    sc = load_scenario(RING, [*RATED, "workload.requests=40"])
    short, long_ = _means(200.0, 40.0, 20.0), _means(200.0, 140.0, 20.0)  # 1 s and 3 s
    mixed = fault_run_mixed(sc, [(1.0, sc, short), (1.0, sc, long_)])
    assert mixed.details["hit_share_by_kind"] == pytest.approx([0.25, 0.75])
    one = [fault_run(sc, m).details["added_ring_ms_per_failover"] for m in (short, long_)]
    assert mixed.details["added_ring_ms_per_failover"] == pytest.approx(
        0.25 * one[0] + 0.75 * one[1]
    )


@pytest.mark.parametrize("recovery", ["failover", "fail"])
def test_one_kind_split_in_two_is_the_one_kind_model(recovery):
    sc = load_scenario(RING, [*RATED, "workload.requests=40", f"faults.recovery={recovery}"])
    means = _means(300.0, 60.0, 25.0)
    one = fault_run(sc, means, 2)
    split = fault_run_mixed(sc, [(0.3, sc, means), (0.7, sc, means)], 2)
    for key, value in one.metrics.items():
        assert split.metrics[key] == pytest.approx(value, rel=1e-12), key


CASES = {
    "lognormal lengths, failover": [
        "workload.lengths={kind: lognormal, output_cv: 0.5, prompt_cv: 0.3}",
        "workload.requests=48",
        *RATED,
    ],
    "lognormal lengths (cv 1), fail": [
        "workload.lengths={kind: lognormal, output_cv: 1.0}",
        "workload.requests=48",
        "faults.recovery=fail",
        *RATED,
    ],
    "a math/chat mix, 4 users, failover": [
        "drafter.acceptance={profile: traces/reference/dspark-v4pro.yaml}",
        "workload.mix=[{workload: math, share: 1}, {workload: chat, share: 1}]",
        "workload.concurrency=4",
        "workload.requests=64",
        *RATED,
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_faults_with_requests_that_differ_agree_with_the_des(case):
    """Against the DES's mean over seeds 0-3 (measured: tokens/s +0.2%, +0.0%, -2.6%;
    throughput +0.3%, +6.5%, +1.2%; goodput +0.3%, +3.4%, +1.2%; availability within 0.004;
    the seeds' spread of goodput up to 11% with ``fail``): tokens/s within 5%, throughput and
    goodput within 8%, availability within 0.01; never vouched for."""
    ana = agrees_with_des_mean(load_scenario(RING, CASES[case]), case, 4, 0.05, 0.08, 0.01)
    appr = ana.approximation
    assert not appr["validated"] and appr["regime"].endswith("+ faults"), appr


DRIFTING = {
    "lognormal lengths, one request, drift over 15 min, failover": [
        "workload.lengths={kind: lognormal, output_cv: 0.5}",
        "workload.requests=60",
        "network.drift.over_ms=900000",
        *RATED,
    ],
    "lognormal lengths, 4 users, drift over 5 min, failover": [
        "workload.lengths={kind: lognormal, output_cv: 0.5}",
        "workload.concurrency=4",
        "workload.requests=80",
        "network.drift.over_ms=300000",
        *RATED,
    ],
}


@pytest.mark.parametrize("case", list(DRIFTING))
def test_faults_with_requests_that_differ_on_drifting_links_agree_with_the_des(case):
    """On a ring drifting 1.3x: the run without faults over its pieces (each the expectation
    over the nodes), each kind's means moved as the run-averaged ring moves the workload's,
    then the faults over the kinds. Against the DES's mean over seeds 0-3 (measured: tokens/s
    +1.7% and -0.2%, throughput +1.8% and +4.4%, availability within 0.005): tokens/s within
    5%, throughput and goodput within 8%, availability within 0.01; never vouched for."""
    sc = load_scenario(ROOT / "scenarios" / "ring-drift-1.3x.yaml", DRIFTING[case])
    appr = agrees_with_des_mean(sc, case, 4, 0.05, 0.08, 0.01).approximation
    assert not appr["validated"] and "time-varying links" in appr["regime"]
    assert appr["regime"].endswith("+ faults") and "workload nodes" in appr["regime"]
