"""Jitter distributions and hop delays: closed-form moments against Monte Carlo samples."""

from __future__ import annotations

import numpy as np
import pytest

from wansim.config.network import Jitter
from wansim.links.expected_delay import expected_losses, hop_mean_ms, jitter_dist, sample_losses

CASES = [
    Jitter(kind="normal", std_ms=3.0),
    Jitter(kind="normal", std_ms=3.0, mean_ms=1.0),
    Jitter(kind="lognormal", std_ms=3.0),
    Jitter(kind="lognormal", std_ms=2.0, mean_ms=5.0),
    Jitter(kind="pareto", std_ms=3.0, shape=4.0),
    Jitter(kind="empirical", samples_ms=(-3.0, 0.0, 1.0, 7.5)),
]


@pytest.mark.parametrize("spec", CASES, ids=lambda j: j.kind)
@pytest.mark.parametrize("latency", [0.0, 2.0, 25.0])
def test_mean_propagation_matches_sampling(spec, latency):
    dist = jitter_dist(spec)
    draws = np.maximum(0.0, latency + dist.sample(np.random.default_rng(1), 400_000))
    se = draws.std() / np.sqrt(len(draws))
    assert abs(dist.mean_propagation_ms(latency) - draws.mean()) < 5 * se + 1e-9


@pytest.mark.parametrize("spec", CASES[:5], ids=lambda j: j.kind)
def test_stated_std_is_the_std(spec):
    draws = jitter_dist(spec).sample(np.random.default_rng(2), 400_000)
    assert draws.std() == pytest.approx(spec.std_ms, rel=0.05 if spec.kind == "pareto" else 0.01)


@pytest.mark.parametrize("spec", CASES, ids=lambda j: j.kind)
def test_cdf_agrees_with_samples(spec):
    dist = jitter_dist(spec)
    draws = dist.sample(np.random.default_rng(3), 100_000)
    for x in np.quantile(draws, [0.1, 0.5, 0.9]):
        assert dist.cdf(x) == pytest.approx((draws <= x).mean(), abs=0.01)


def test_losses_are_geometric():
    g = sample_losses(np.random.default_rng(4), 0.2, 200_000)
    assert g.mean() == pytest.approx(expected_losses(0.2), rel=0.02)
    assert (g == 0).mean() == pytest.approx(0.8, abs=0.005)


def test_hop_mean_hand_worked():
    # 125,000 B at 1000 Mbit/s = 1 ms serialisation; latency 10; no jitter, no loss
    assert hop_mean_ms(10, 1000, Jitter(), 0.0, 200.0, 125_000) == pytest.approx(11.0)
    # loss 0.5: one loss expected: 2 ms on the wire + 200 ms timeout + 10 ms
    assert hop_mean_ms(10, 1000, Jitter(), 0.5, 200.0, 125_000) == pytest.approx(212.0)
