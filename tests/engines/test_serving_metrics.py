"""Serving metrics (TTFT/e2e percentiles, queueing delay, SLO goodput) and the DES's bootstrap
intervals beside every percentile, in both engines."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import wansim
from tests.conftest import REFERENCE
from wansim.analytical.serving import sum_quantiles
from wansim.config.scenario import load_scenario
from wansim.results.metric_names import CI_METRICS, METRICS
from wansim.sim.metrics import weighted_quantile

FAST = ["workload.requests=40", "workload.output_tokens=64"]


def _ref(*sets):
    return load_scenario(REFERENCE, [*FAST, *sets])


@given(
    st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=30),
    st.lists(st.integers(0, 4), min_size=30, max_size=30),
    st.sampled_from([0.01, 0.5, 0.99]),
)
def test_weighted_quantile_is_the_quantile_of_the_repeated_sample(values, counts, q):
    """Integer weights = repeated values: the inverted-CDF quantile of the repeated sample."""
    values = np.sort(np.asarray(values))
    counts = np.asarray(counts[: len(values)], dtype=float)
    if counts.sum() == 0:
        counts[0] = 1.0
    got = weighted_quantile(values, counts[None, :], q)[0]
    want = np.quantile(np.repeat(values, counts.astype(int)), q, method="inverted_cdf")
    assert got == want


def test_sum_quantiles_against_monte_carlo():
    """TTFT atoms + a normal mixture: quantiles of the sum vs 10^6 seeded draws."""
    rng = np.random.default_rng(5)
    atoms, mass = np.array([10.0, 20.0, 50.0]), np.array([0.5, 0.3, 0.2])
    w, mean, sd = np.array([0.7, 0.3]), np.array([100.0, 300.0]), np.array([10.0, 40.0])
    n = 1_000_000
    x = rng.choice(atoms, n, p=mass) + np.where(
        rng.random(n) < 0.7, rng.normal(100, 10, n), rng.normal(300, 40, n)
    )
    got = sum_quantiles(atoms, mass, w, mean, sd, [0.5, 0.99])
    # the MC quantiles' standard error at 10^6 draws is < 0.1 ms here; 1 ms is far from flaky
    np.testing.assert_allclose(got, np.quantile(x, [0.5, 0.99]), atol=1.0)


def test_des_serving_metrics_from_the_record():
    """Each new DES metric recomputed from the run's record by hand."""
    sc = _ref(
        "workload.arrival=poisson",
        "workload.rate_per_s=1.0",
        "workload.slo.ttft_ms=960",
        "workload.slo.tpot_ms=80",
    )
    res = wansim.simulate(sc)
    rec, m = res.details["record"], res.metrics
    ttft = rec.first_token_ms - rec.arrival_ms
    e2e = rec.finish_ms - rec.arrival_ms
    queue = rec.admitted_ms - rec.arrival_ms
    tpot = rec.decode_ms / rec.decode_tokens
    assert m["ttft_ms_p99"] == pytest.approx(np.quantile(ttft, 0.99))
    assert m["e2e_ms_p50"] == pytest.approx(np.quantile(e2e, 0.5))
    assert m["queue_ms_mean"] == pytest.approx(queue.mean())
    assert m["queue_ms_mean"] > 0  # a request arriving mid-run waits for the one slot
    ok = (ttft <= 960) & (tpot <= 80)
    assert 0 < ok.sum() < len(ok)
    assert m["slo_attainment"] == pytest.approx(ok.mean())
    assert m["goodput_requests_per_s"] == pytest.approx(1e3 * ok.sum() / rec.makespan_ms)


def test_every_des_percentile_has_a_deterministic_interval_around_it():
    sc = _ref("workload.concurrency=4")
    a, b = wansim.simulate(sc), wansim.simulate(sc)
    for name in CI_METRICS:
        assert name in a.metrics, name
        assert a.metrics[name] == b.metrics[name]  # seeded: same interval
    for name in ("ttft_ms_p50", "e2e_ms_p50", "tpot_ms_p50", "lap_ms_p50"):
        low, high = a.metrics[f"{name}_ci95"]
        assert 0 <= low <= a.metrics[name] <= high, name


def test_one_request_intervals_are_null_with_a_reason():
    res = wansim.simulate(load_scenario(REFERENCE, ["workload.requests=1"]))
    out = res.to_json()
    assert out["metrics"]["ttft_ms_p99_ci95"] is None
    assert "fewer than two measured requests" in out["undefined"]["ttft_ms_p99_ci95"]


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["workload.concurrency=4"],
        ["workload.concurrency=4", "schedule.batching=continuous"],
        ["network.jitter.kind=none", "network.jitter.std_ms=0"],
    ],
)
def test_engines_agree_on_ttft_and_e2e(sets):
    """TTFT p50 within 2% (one request alone: the prefill; under load a shift by the mean
    wait, so 15% for batching) and e2e p50 within 10% (the decode time's CLT mixture)."""
    sc = _ref(*sets)
    des, ana = wansim.simulate(sc).metrics, wansim.analyze(sc).metrics
    ttft_tol = 0.15 if "schedule.batching=continuous" in sets else 0.02
    assert ana["ttft_ms_p50"] == pytest.approx(des["ttft_ms_p50"], rel=ttft_tol)
    assert ana["e2e_ms_p50"] == pytest.approx(des["e2e_ms_p50"], rel=0.10)
    assert ana["goodput_requests_per_s"] == pytest.approx(des["goodput_requests_per_s"], rel=0.1)
    for name in METRICS:
        if name != "tokens_per_s_ci95" and isinstance(ana[name], float):
            assert np.isfinite(ana[name]) and ana[name] >= 0, name


def test_analytical_ttft_without_jitter_is_the_prefill():
    sc = _ref("network.jitter.kind=none", "network.jitter.std_ms=0")
    m = wansim.analyze(sc).metrics
    assert m["ttft_ms_p50"] == pytest.approx(m["ttft_ms_mean"])
    assert m["ttft_ms_p99"] == pytest.approx(m["ttft_ms_mean"])
    # the DES measures the same prefill, every request alike
    des = wansim.simulate(sc).metrics
    assert des["ttft_ms_p99"] == pytest.approx(m["ttft_ms_mean"], rel=1e-9)


def test_analytical_slo_attainment_tracks_the_des():
    """A TPOT bound at the DES median: about half the requests meet it in both engines."""
    sc = _ref("workload.requests=200", "workload.output_tokens=32")
    median = wansim.simulate(sc).metrics["tpot_ms_p50"]
    sc = _ref(
        "workload.requests=200", "workload.output_tokens=32", f"workload.slo.tpot_ms={median}"
    )
    des, ana = wansim.simulate(sc).metrics, wansim.analyze(sc).metrics
    assert 0.4 <= des["slo_attainment"] <= 0.6
    assert ana["slo_attainment"] == pytest.approx(des["slo_attainment"], abs=0.1)


def test_bounded_sides_hand_worked():
    """A side is bounded at 95% only where an order statistic of the sample is: q^n <= 2.5%
    above, (1 - q)^n < 2.5% below. p99: 0.99^367 = 2.502%, 0.99^368 = 2.477%."""
    from wansim.sim.metrics import bounded_sides

    assert bounded_sides(1.0, 2.0, 0.99, 32, 0.025) == [1.0, None]
    assert bounded_sides(1.0, 2.0, 0.99, 367, 0.025) == [1.0, None]
    assert bounded_sides(1.0, 2.0, 0.99, 368, 0.025) == [1.0, 2.0]
    assert bounded_sides(1.0, 2.0, 0.5, 5, 0.025) == [None, None]  # 0.5^5 = 3.1%
    assert bounded_sides(1.0, 2.0, 0.5, 6, 0.025) == [1.0, 2.0]  # 0.5^6 = 1.6%


def test_p99_interval_of_few_requests_covers_the_true_p99():
    """Monte Carlo: 32 independent exponential requests, true p99 ln 100. The resampled p99
    never passes the sample's maximum, which lies below the true p99 with probability
    0.99^32 = 72%: the bootstrap alone covers it about a quarter of the time. With the upper
    side unbounded (None) the interval covers it at least 90% of the time (its lower side:
    the bootstrap's, near the third-largest value)."""
    from wansim.sim.metrics import percentile_intervals

    true_p99 = math.log(100.0)
    rng = np.random.default_rng(20261204)
    covered = bootstrap_covered = 0
    trials = 200
    order = np.arange(32)
    for seed in range(trials):
        x = rng.exponential(1.0, 32)
        out = percentile_intervals({"x": x}, {}, order, 1, seed)
        low, high = out["x_p99_ci95"]
        assert high is None
        covered += (low is None or low <= true_p99) and (high is None or true_p99 <= high)
        bootstrap_covered += low <= true_p99 <= x.max()
    assert covered / trials >= 0.90
    assert bootstrap_covered / trials < 0.40
