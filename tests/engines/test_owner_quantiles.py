"""``owner_quantiles`` (the bootstrap's percentile per resample, by blocks) against
``weighted_quantile`` on the full (resamples x values) weight matrix: the same values exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wansim.sim import metrics
from wansim.sim.metrics import owner_quantiles, weighted_quantile


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 600),
    st.integers(1, 40),
    st.integers(1, 30),
    st.integers(0, 2**16),
    st.sampled_from([1, 7, 100, 4_000_000]),
)
def test_the_same_quantile_as_the_full_weight_matrix(n_values, owners, resamples, seed, table):
    rng = np.random.default_rng(seed)
    values = np.sort(rng.choice([0.0, 1.5, 2.0, 7.25], n_values) + rng.random(n_values))
    owner = rng.integers(0, owners, n_values)
    counts = rng.integers(0, 4, (resamples, owners)).astype(float)
    counts[0] = 0.0  # a resample that picked none of these owners
    qs = (0.5, 0.99, 0.0, 1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics, "BLOCK_TABLE_ENTRIES", table)
        got = owner_quantiles(values, owner, counts, qs)
    for q, g in zip(qs, got, strict=True):
        assert np.array_equal(g, weighted_quantile(values, counts[:, owner], q)), q
