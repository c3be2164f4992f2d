"""``tokens_per_s_ci95`` for one long request (or a few): batch means over the run's laps
(wansim.sim.metrics), checked against a hand computation from the verify log and by its
coverage over independent seeds; never NaN when defined, never below zero."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from wansim.config.scenario import load_scenario
from wansim.sim import simulate
from wansim.sim.metrics import (
    MIN_REQUESTS_FOR_REQUEST_CI,
    REQUEST_CI,
    UNDEFINED_CI,
    request_rates,
    t_interval,
)

ONE = {
    "stages": 3,
    "model": {"hidden_size": 256, "compute": {"kind": "linear", "base_ms": 1.0}},
    "network": {"latency_ms": 10, "jitter": {"kind": "normal", "std_ms": 2}},
    "drafter": {"draft_ms": 1.0, "acceptance": {"alpha": 0.7}},
    "speculation": {"policy": "chain", "k": 4},
    "workload": {"requests": 1, "prompt_tokens": 8, "output_tokens": 401},
}


def one(seed: int = 0, **overrides):
    return load_scenario(data={**ONE, "seed": seed}, overrides=overrides)


def test_single_request_interval_equals_a_hand_computation_from_the_verify_log():
    r = simulate(one(), timeline=True)
    log = np.array(r.details["timeline"].verify_log)  # rid, step, t, n, A, remaining, committed
    times, committed = log[:, 2], log[:, 6]
    laps = np.diff(np.concatenate([[r.details["record"].first_token_ms[0]], times]))
    b = min(20, len(laps) // 5)
    # b contiguous batches, the first len % b one lap longer
    sizes = [len(laps) // b + (i < len(laps) % b) for i in range(b)]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    rates = [1e3 * committed[a:z].sum() / laps[a:z].sum() for a, z in itertools.pairwise(bounds)]
    centre = 1e3 * committed.sum() / laps.sum()
    half = stats.t.ppf(0.975, b - 1) * np.std(rates, ddof=1) / np.sqrt(b)
    assert r.details["ci_method"] == "batch means over laps"
    assert r.metrics["tokens_per_s"] == pytest.approx(centre, rel=1e-12)
    assert r.metrics["tokens_per_s_ci95"] == pytest.approx([centre - half, centre + half])


def test_single_request_interval_covers_the_mean_rate_about_95_percent():
    """200 independent single-request runs: the share of intervals holding the Monte Carlo
    mean of the point estimates. A 95% interval gives 190 +- 3 (binomial sd); the bounds below
    are > 4 sd away (0.88), and the width must match the estimates' real spread."""
    runs = [simulate(one(seed)).metrics for seed in range(200)]
    point = np.array([m["tokens_per_s"] for m in runs])
    ci = np.array([m["tokens_per_s_ci95"] for m in runs])
    truth = point.mean()
    coverage = np.mean((ci[:, 0] <= truth) & (truth <= ci[:, 1]))
    assert 0.88 <= coverage <= 1.0, coverage
    half = (ci[:, 1] - ci[:, 0]) / 2
    assert 1.5 < half.mean() / point.std(ddof=1) < 3.0
    assert (ci[:, 0] > 0).all()


def test_few_requests_use_laps_many_use_requests():
    few = simulate(one(**{"workload.requests": MIN_REQUESTS_FOR_REQUEST_CI - 1}))
    many = simulate(one(**{"workload.requests": MIN_REQUESTS_FOR_REQUEST_CI}))
    two = simulate(one(**{"workload.requests": 5, "workload.concurrency": 2}))
    assert few.details["ci_method"] == "batch means over laps"
    assert many.details["ci_method"] == REQUEST_CI
    assert two.details["ci_method"] == "batch means over laps"
    for r in (few, many, two):
        lo, hi = r.metrics["tokens_per_s_ci95"]
        assert 0 <= lo <= r.metrics["tokens_per_s"] <= hi


def test_one_lap_is_undefined_with_its_reason():
    r = simulate(one(**{"workload.output_tokens": 2}))
    assert r.metrics["tokens_per_s_ci95"] is None
    assert r.details["ci_method"] == UNDEFINED_CI
    assert r.undefined()["tokens_per_s_ci95"] == UNDEFINED_CI


def test_lower_bound_never_negative():
    """Two short requests under heavy-tailed jitter: a t-interval over the two request rates
    (the old method) goes below zero for some seeds; the reported bound never does."""
    old_negative = 0
    for seed in range(20):
        sc = one(
            seed,
            **{
                "workload.requests": 2,
                "workload.output_tokens": 12,
                "network.jitter": {"kind": "pareto", "std_ms": 40, "shape": 2.1},
            },
        )
        r = simulate(sc)
        lo, hi = r.metrics["tokens_per_s_ci95"]
        assert 0 <= lo <= hi
        old_negative += t_interval(request_rates(r.details["record"]), 0.95)[0] < 0
    assert old_negative > 0
