"""The one Student-t interval (wansim/numerics/intervals.py) against scipy and hand-worked values, and
the callers that use it (the DES's tokens/s interval, the calibration's real-run interval)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from wansim.numerics.intervals import t_half_width, t_interval


def test_hand_worked_case():
    # values 1..5: mean 3, sd sqrt(2.5), t_{0.975, 4} = 2.7764451051977987 (tables: 2.776)
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)
    assert t_half_width([1, 2, 3, 4, 5]) == pytest.approx(half, rel=1e-12)
    assert t_interval([1, 2, 3, 4, 5]) == pytest.approx((3 - half, 3 + half), rel=1e-12)
    assert t_half_width([1, 2, 3, 4, 5]) == pytest.approx(1.9632, abs=5e-5)


@given(
    st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=60),
    st.sampled_from([0.5, 0.9, 0.95, 0.99]),
)
def test_equals_scipy_t_interval(values, level):
    x = np.array(values)
    if x.std() == 0:
        lo, hi = x.mean(), x.mean()
    else:
        lo, hi = stats.t.interval(level, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    got = t_interval(x, level)
    assert got == pytest.approx((lo, hi), rel=1e-9, abs=1e-9)


def test_centre_is_the_callers_and_fewer_than_two_values_are_undefined():
    half = t_half_width([2.0, 4.0], 0.9)
    assert half == pytest.approx(stats.t.ppf(0.95, 1) * math.sqrt(2) / math.sqrt(2))
    assert t_interval([2.0, 4.0], 0.9, centre=10.0) == pytest.approx((10 - half, 10 + half))
    assert all(math.isnan(v) for v in t_interval([1.0]))
    assert math.isnan(t_half_width([]))


def test_the_des_and_the_calibration_use_it():
    from wansim.calibrate import measure
    from wansim.sim import metrics

    assert metrics.t_interval is t_interval
    assert measure.t_interval is t_interval
    rng = np.random.default_rng(3)
    ordered = rng.exponential(10.0, 37)
    b = min(20, 37 // 5)
    means = [c.mean() for c in np.array_split(ordered, b)]
    half = stats.t.ppf(0.975, b - 1) * np.std(means, ddof=1) / math.sqrt(b)
    got = metrics.batch_means_interval(ordered, 0.95)
    assert got == pytest.approx((ordered.mean() - half, ordered.mean() + half), rel=1e-12)
