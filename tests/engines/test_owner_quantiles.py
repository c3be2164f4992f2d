"""``owner_quantiles`` (the bootstrap's percentile per resample, by blocks) against
``weighted_quantile`` on the full (resamples x values) weight matrix: the same values exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wansim.sim import metrics
from wansim.sim.metrics import owner_quantiles, resample_counts, weighted_quantile


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 600),
    st.integers(1, 40),
    st.integers(1, 30),
    st.integers(0, 2**16),
    st.sampled_from([1, 7, 100, 4_000_000]),
    st.sampled_from([1, 50, 4_000_000]),
    st.sampled_from([np.float64, np.float32]),
)
def test_the_same_quantile_as_the_full_weight_matrix(
    n_values, owners, resamples, seed, table, chunk, dtype
):
    rng = np.random.default_rng(seed)
    values = np.sort(rng.choice([0.0, 1.5, 2.0, 7.25], n_values) + rng.random(n_values))
    owner = rng.integers(0, owners, n_values)
    counts = rng.integers(0, 4, (resamples, owners)).astype(float)
    counts[0] = 0.0  # a resample that picked none of these owners
    reference = counts.copy()
    counts = counts.astype(dtype)  # resample_counts keeps them in float32 (exact)
    qs = (0.5, 0.99, 0.0, 1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics, "BLOCK_TABLE_ENTRIES", table)
        mp.setattr(metrics, "CHUNK_ENTRIES", chunk)
        got = owner_quantiles(values, owner, counts, qs)
    for q, g in zip(qs, got, strict=True):
        assert np.array_equal(g, weighted_quantile(values, reference[:, owner], q)), q


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.integers(1, 9), st.integers(0, 2**16), st.sampled_from([1, 40]))
def test_resample_counts_are_one_draw_of_all_starts_counted_one_by_one(n, block, seed, chunk):
    """Drawn a chunk of resamples at a time, the starts are those of one draw of all rows."""
    order = np.random.default_rng(seed).permutation(n + 5)[:n]
    block = min(block, n)
    starts = np.random.default_rng([seed, 15]).integers(0, n - block + 1, size=(30, -(-n // block)))
    picks = (starts[:, :, None] + np.arange(block)).reshape(30, -1)[:, :n]
    want = np.zeros((30, n + 5), dtype=np.float32)
    np.add.at(want, (np.repeat(np.arange(30), n), order[picks].ravel()), 1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics, "CHUNK_ENTRIES", chunk)
        got = resample_counts(order, np.random.default_rng([seed, 15]), 30, block, n + 5)
    assert got.dtype == want.dtype and np.array_equal(got, want)
