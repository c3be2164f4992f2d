"""Open arrivals with failures at rates and fail-over (:func:`wansim.analytical.open_arrivals.
_open_faults`): the closed model at each number in service carries the faults (each request in
service is hit by every failure during its residence), the ring is down lambda D / (1 + lambda D)
of the time (its failure clock runs while it is up, busy or idle), every request finishes, and
an arrival during an outage waits the rest of it. Failures at fixed times: the outage, the queue
it leaves and its drain on that open run (:func:`wansim.analytical.open_arrivals.
_fixed_time_faults`). ``recovery: fail`` at rates: the queue's server completes departures,
finished or failed (the closed run's requests over its up time); at fixed times the requests
in service fail and leave, the outage and its queue as with fail-over. No combination of open
arrivals and faults is refused."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.engines.test_open_arrivals import RING
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.results.strict_json import dumps
from wansim.sim import simulate

FAILOVER = {"detection_s": 2.0, "events": [{"stage": 2, "rate_per_hour": 60}]}


def scenario(slots: int, rate: float, faults: dict = FAILOVER):
    data = {**RING, "faults": faults}
    data["workload"] = {**RING["workload"], "concurrency": slots, "rate_per_s": rate}
    data["workload"]["requests"] = 200
    return load_scenario(data=data)


def agrees_on_average(sc, seeds: int, rates_rel: float, availability_abs: float, ttft_rel: float):
    """The analytical answer against the DES's mean over seeds 0..seeds-1: tokens/s within 9%
    (every case), throughput and goodput, availability and the mean TTFT within the case's
    bounds; not validated. Returns (the analytical result, the DES runs' metrics)."""
    ana = analyze(sc)
    a = ana.metrics
    runs = [simulate(dataclasses.replace(sc, seed=seed)).metrics for seed in range(seeds)]

    def des(key):
        return float(np.mean([r[key] for r in runs]))

    assert a["tokens_per_s"] == pytest.approx(des("tokens_per_s"), rel=0.09)
    for key in ("throughput_tokens_per_s", "goodput_tokens_per_s"):
        assert a[key] == pytest.approx(des(key), rel=rates_rel), key
    assert a["availability"] == pytest.approx(des("availability"), abs=availability_abs)
    assert a["ttft_ms_mean"] == pytest.approx(des("ttft_ms_mean"), rel=ttft_rel)
    assert not ana.approximation["validated"]
    return ana, runs


def failed_within_spread(expected: float, runs) -> bool:
    """The DES's failed requests a run: within 3 standard errors of their mean and 25%."""
    failed = np.array([r["failed_requests"] for r in runs], dtype=float)
    se = float(failed.std(ddof=1)) / np.sqrt(len(failed))
    return abs(expected - failed.mean()) <= 3.0 * se + 0.25 * failed.mean()


@pytest.mark.parametrize(("slots", "rate"), [(1, 0.16), (4, 3.0)])
def test_open_arrivals_with_failover_against_the_des(slots, rate):
    """Against the DES's mean over seeds 0-2 (200 requests; a failure a minute, 2 s down).
    Measured: tokens/s -1.1% and -7.1% (without faults -0.6% and the closed model's -5% at 4
    slots), throughput and goodput +3.1% and -3.4%, availability +0.001 and +0.008, mean TTFT
    +7.8% and +15% (the open model's own bias without faults: +20% at one slot, half load)."""
    ana, runs = agrees_on_average(scenario(slots, rate), 3, 0.05, 0.012, 0.2)
    a = ana.metrics
    assert a["failed_requests"] == 0.0 and all(r["failed_requests"] == 0.0 for r in runs)
    out = json.loads(dumps(ana.to_json()))
    assert out["metrics"]["goodput_tokens_per_s"] == pytest.approx(a["throughput_tokens_per_s"])


def test_the_faults_cost_what_they_should():
    """Hand-worked on the model: the same queue without faults, then availability
    1 / (1 + lambda D) = 1 / (1 + 2 / 60) and an arrival's extra wait D / 2 in that share."""
    calm = analyze(scenario(1, 0.16, {})).metrics
    faulty = analyze(scenario(1, 0.16)).metrics
    share = (2.0 / 60.0) / (1.0 + 2.0 / 60.0)
    assert faulty["availability"] == pytest.approx(1.0 - share, rel=1e-12)
    assert faulty["tokens_per_s"] < calm["tokens_per_s"]
    assert faulty["ttft_ms_mean"] > calm["ttft_ms_mean"] + share * 1000.0 - 1e-9
    assert faulty["bubble_fraction"] > calm["bubble_fraction"]


FIXED = [
    # one slot at half load, two 2 s outages; four slots overloaded, two 2 s outages; four
    # slots at 3/4 load, one 5 s outage
    (
        1,
        0.16,
        {"detection_s": 2.0, "events": [{"stage": 2, "at_s": 100}, {"stage": 1, "at_s": 600}]},
    ),
    (4, 3.0, {"detection_s": 2.0, "events": [{"stage": 2, "at_s": 10}, {"stage": 1, "at_s": 40}]}),
    (4, 1.5, {"detection_s": 5.0, "events": [{"stage": 2, "at_s": 20}]}),
]


@pytest.mark.parametrize(
    ("slots", "rate", "faults"), FIXED, ids=["1 slot", "overloaded", "3/4 load"]
)
def test_fixed_time_failovers_against_the_des(slots, rate, faults):
    """Against the DES's mean over seeds 0-3 (200 requests). Measured, error with faults
    (without them): tokens/s -0.4% (-0.5%), -7.3% (-7.6%), -6.3% (-6.5%); throughput +2.0%
    (+2.0%), -5.4% (-5.8%), +1.6% (+1.6%); availability within 0.003; mean TTFT +14.7% (+16.5%),
    +16.7% (+22.3%), +17.6% (+52.6%). What the outages add to the mean TTFT: +2.6%, +25.7%,
    +126% in the DES, about +0%, +20%, +74% in the model (the fluid drain of the queue an
    outage leaves understates the stochastic queue's slower relaxation at 3/4 load)."""
    sc = scenario(slots, rate, faults)
    ana, runs = agrees_on_average(sc, 4, 0.07, 0.006, 0.25)
    a = ana.metrics
    calm = analyze(scenario(slots, rate, {})).metrics
    assert a["availability"] < 1.0 and a["ttft_ms_mean"] >= calm["ttft_ms_mean"]
    assert a["failed_requests"] == 0.0 and all(r["failed_requests"] == 0.0 for r in runs)
    assert "fixed times" in ana.approximation["why"]


def test_a_fixed_failure_after_the_run_changes_nothing():
    late = {"detection_s": 2.0, "events": [{"stage": 2, "at_s": 1e6}]}
    calm = analyze(scenario(4, 1.5, {})).metrics
    ana = analyze(scenario(4, 1.5, late)).metrics
    for key in ("tokens_per_s", "throughput_tokens_per_s", "ttft_ms_mean"):
        assert ana[key] == pytest.approx(calm[key], rel=1e-12), key
    assert ana["availability"] == 1.0


def test_an_outage_at_a_fixed_time_hand_worked():
    """One slot, the model's own numbers: the outage's share of the run is D / makespan, and
    the waits it adds are at least the arrivals of the outage waiting its rest,
    lambda D^2 / 2 over the R requests."""
    faults = {"detection_s": 5.0, "events": [{"stage": 2, "at_s": 100}]}
    calm = analyze(scenario(1, 0.16, {})).metrics
    ana = analyze(scenario(1, 0.16, faults))
    a = ana.metrics
    makespan = 1e3 * 200 * RING["workload"]["output_tokens"] / a["throughput_tokens_per_s"]
    assert a["availability"] == pytest.approx(1.0 - 5000.0 / makespan, rel=1e-9)
    assert a["ttft_ms_mean"] - calm["ttft_ms_mean"] >= 0.16e-3 * 5000.0**2 / 2.0 / 200 - 1e-9


FAIL = {"recovery": "fail", "detection_s": 2.0, "events": [{"stage": 2, "rate_per_hour": 60}]}


@pytest.mark.parametrize(("slots", "rate"), [(1, 0.16), (4, 1.5), (4, 3.0)])
def test_failures_at_rates_that_fail_requests_against_the_des(slots, rate):
    """recovery: fail: a failed request leaves its slot at the failure, so the queue's server
    completes departures (finished or failed) at the closed run's requests over its up time.
    Against the DES's mean over seeds 0-3 (200 requests, a failure a minute, 2 s down).
    Measured: tokens/s -0.6%, -6.6%, -7.7% (the open model's own -0.5%, -6.5%, -7.6%),
    throughput +2.3%, +2.1%, -3.1%, goodput +1.5%, +2.2%, -2.9%, availability within 0.009,
    TTFT +20%, +42%, +11% (the open model's own +16%, +53%, +22%), failed requests 6.0 vs 5.0,
    6.5 vs 7.5, 6.6 vs 8.0 (a handful a run: the DES's own spread). Counting only finished
    requests as departures (the queue not seeing the slots failures free) gave +86% on TTFT."""
    sc = scenario(slots, rate, FAIL)
    ana, runs = agrees_on_average(sc, 4, 0.05, 0.012, 0.5)
    a = ana.metrics
    assert a["goodput_tokens_per_s"] < a["throughput_tokens_per_s"]
    assert failed_within_spread(a["failed_requests"], runs)
    assert not ana.approximation["validated"]


@pytest.mark.parametrize(
    ("slots", "rate", "faults"), FIXED, ids=["1 slot", "overloaded", "3/4 load"]
)
def test_fixed_time_failures_that_fail_requests_against_the_des(slots, rate, faults):
    """recovery: fail at fixed times: the requests in service fail and leave, the outage and
    its queue as with fail-over. Against the DES's mean over seeds 0-3. Measured: tokens/s
    -0.6%, -7.7%, -6.5%; throughput +2.1%, -7.3%, +1.7%; goodput +2.4%, -7.6%, +1.8%;
    availability within 0.004; TTFT +17%, +28%, +39% (the open model's own +16%, +22%, +53%);
    failed requests 0.58 vs 1.25 (one slot at a third busy: the DES's 5 of 8 outages found a
    request, a 10% event), 8 vs 8, 2.9 vs 3.25."""
    sc = scenario(slots, rate, {**faults, "recovery": "fail"})
    ana, runs = agrees_on_average(sc, 4, 0.09, 0.006, 0.5)
    a = ana.metrics
    assert failed_within_spread(a["failed_requests"], runs)
    assert a["failed_requests"] > 0 and a["goodput_tokens_per_s"] < a["throughput_tokens_per_s"]
