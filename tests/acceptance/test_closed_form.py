"""tau(K), P(A=a), implied tau and the renewal pass count against independent computations."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from wansim.acceptance import closed_form as cf

rates = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8).map(np.array)


def brute_force_pmf(p: np.ndarray) -> np.ndarray:
    """Enumerate every accept/reject pattern of K independent-conditional draws."""
    k = len(p)
    pmf = np.zeros(k + 1)
    for pattern in itertools.product([0, 1], repeat=k):
        prob = np.prod([p[i] if bit else 1 - p[i] for i, bit in enumerate(pattern)])
        accepted = next((i for i, bit in enumerate(pattern) if not bit), k)  # leading accepts
        pmf[accepted] += prob
    return pmf


@given(rates)
def test_outcome_pmf_matches_enumeration(p):
    np.testing.assert_allclose(cf.outcome_pmf(p), brute_force_pmf(p), atol=1e-12)


@given(rates)
def test_tau_is_mean_of_accepted_plus_one(p):
    pmf = brute_force_pmf(p)
    assert np.isclose(cf.tau(p), np.arange(len(pmf)) @ pmf + 1, atol=1e-12)
    assert 1.0 <= cf.tau(p) <= len(p) + 1


@given(rates)
def test_second_moment(p):
    pmf = brute_force_pmf(p)
    x = np.arange(len(pmf)) + 1
    t, ex2 = cf.moments(cf.survival(p), np.array(len(p)))
    assert np.isclose(t, x @ pmf) and np.isclose(ex2, (x**2) @ pmf)


@given(rates)
def test_implied_tau_uses_leading_positions(p):
    implied = cf.implied_tau(p)
    for k in range(1, len(p) + 1):
        assert np.isclose(implied[k - 1], cf.tau(p[:k]))
    assert np.all(np.diff(implied) >= -1e-12)  # a longer block never commits fewer


@given(st.floats(0.0, 0.999), st.integers(0, 20))
def test_constant_rate_closed_form(alpha, k):
    expected = cf.tau(np.full(k, alpha)) if k else 1.0
    assert np.isclose(cf.tau_constant(alpha, k), expected)


def test_review_constant_rate_figures():
    # Literature review, Pluralis, compiled August–October 2026, Part VII: p ~ 0.86 -> 5.0, 0.87 -> 5.17, 0.71 -> 3.2 at K = 7
    assert abs(cf.tau_constant(0.86, 7) - 5.0) < 0.05
    assert abs(cf.tau_constant(0.87, 7) - 5.17) < 0.05
    assert abs(cf.tau_constant(0.71, 7) - 3.2) < 0.05


def exact_expected_passes(p: np.ndarray, m: int) -> float:
    """E[N(m)] by dynamic programming over tokens still needed."""
    pmf = cf.outcome_pmf(p)
    e = np.zeros(m + 1)
    for need in range(1, m + 1):
        e[need] = 1 + sum(pmf[a] * e[max(0, need - a - 1)] for a in range(len(pmf)))
    return float(e[m])


@given(st.lists(st.floats(0.05, 0.95), min_size=1, max_size=7).map(np.array), st.integers(40, 300))
def test_renewal_pass_count_matches_dynamic_programming(p, m):
    t, ex2 = cf.moments(cf.survival(p), np.array(len(p)))
    approx = cf.expected_passes(m, t, ex2)
    exact = exact_expected_passes(p, m)
    assert abs(approx - exact) / exact < 2e-3


def test_renewal_exact_without_speculation():
    assert cf.expected_passes(100, 1.0, 1.0) == 100


def test_all_pole_filter_is_lfilter_to_the_bit():
    """The numpy recurrence (every row at once, no scipy.signal import) against lfilter, on
    random pass-size distributions of every depth, for both of passes_moments' inputs."""
    from scipy.signal import lfilter

    from wansim.acceptance.closed_form import all_pole_filter

    rng = np.random.default_rng(7)
    for _ in range(200):
        depth, rows, m = rng.integers(0, 12), rng.integers(1, 5), rng.integers(1, 400)
        surv = np.sort(rng.uniform(0, 1, (rows, depth)), axis=1)[:, ::-1]
        edges = np.concatenate([np.ones((rows, 1)), surv, np.zeros((rows, 1))], axis=1)
        a = np.concatenate([np.ones((rows, 1)), np.diff(edges, axis=1)], axis=1)
        x = np.ones((rows, m))
        e = all_pole_filter(a, x)
        s2 = all_pole_filter(a, 2.0 * e - 1.0)
        for r in range(rows):
            ref = lfilter([1.0], a[r], x[r])
            assert np.array_equal(e[r], ref)
            assert np.array_equal(s2[r], lfilter([1.0], a[r], 2.0 * ref - 1.0))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 12),  # depth (0: no drafts)
            st.integers(1, 4),  # rows (difficulty nodes)
            st.sampled_from([1, 2, 7, 40, 255, 5000, 200_000]),  # M: exact, lfilter, asymptotic
            st.integers(0, 2**32 - 1),  # seed of the survival values
        ),
        min_size=1,
        max_size=8,
    )
)
def test_passes_moments_many_is_each_table_alone_to_the_bit(tables):
    """Tables of different depths sharing one padded filter (and those that cannot) give what
    passes_moments gives each alone, bit for bit: a 1-row grid and a 64-row grid agree."""
    survs, ms = [], []
    for depth, rows, m, seed in tables:
        rng = np.random.default_rng(seed)
        survs.append(np.sort(rng.uniform(0, 1, (rows, depth)), axis=1)[:, ::-1])
        ms.append(m)
    many = cf.passes_moments_many(survs, ms)
    for surv, m, (mean, var) in zip(survs, ms, many, strict=True):
        ref_mean, ref_var = cf.passes_moments(surv, m)
        assert mean.shape == ref_mean.shape and mean.flags.c_contiguous
        assert np.array_equal(mean, ref_mean) and np.array_equal(var, ref_var)
