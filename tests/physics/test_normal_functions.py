"""``wansim.numerics.normal_functions`` (scipy.special) against scipy.stats, to the bit."""

from __future__ import annotations

import numpy as np
from scipy import stats

from wansim.numerics import normal_functions as nf


def test_the_same_values_as_scipy_stats():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 5, 5000), [-1e3, -1.0, 0.0, 1e-300, 7.0, 1e3]])
    p = np.concatenate([rng.uniform(0, 1, 5000), [0.0, 1e-12, 0.5, 1 - 1e-12, 1.0]])
    df = rng.integers(1, 400, len(p))
    same = np.testing.assert_array_equal
    same(nf.norm_cdf(x, 1.3, 2.7), stats.norm.cdf(x, 1.3, 2.7))
    same(nf.norm_cdf(x), stats.norm.cdf(x))
    same(nf.norm_ppf(p, 1.3, 2.7), stats.norm.ppf(p, 1.3, 2.7))
    same(nf.norm_pdf(x), stats.norm.pdf(x))
    same(nf.lognorm_cdf(x, 0.4, np.exp(1.1)), stats.lognorm.cdf(x, 0.4, scale=np.exp(1.1)))
    same(nf.lognorm_ppf(p, 0.4, np.exp(1.1)), stats.lognorm.ppf(p, 0.4, scale=np.exp(1.1)))
    same(nf.t_ppf(p, df), stats.t.ppf(p, df))
    assert float(nf.lognorm_cdf(2.5, 0.4, 2.0)) == float(stats.lognorm.cdf(2.5, 0.4, scale=2.0))
    assert float(nf.t_ppf(0.975, 4)) == float(stats.t.ppf(0.975, 4))
