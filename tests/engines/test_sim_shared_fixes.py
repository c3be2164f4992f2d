"""Fixes the DES agreement work made in shared modules (acceptance), each pinned by a test.

- ``closed_form.passes_moments``: exact E[N(M)] and Var N(M) for the M at hand. The renewal
  asymptotics the analytical engine used before are the average over M mod span: for a lattice
  X (a drafter always accepted) they were 3.7% off at M = 40, K = 3 -- a gap the DES exposed.
- ``heterogeneity.fit_rates``: the logit bracket widens for deep positions under a wide
  difficulty spread (``alpha: 0.5, dispersion: 0.1`` used to fail with a bracketing error).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wansim.acceptance import closed_form as cf
from wansim.acceptance import heterogeneity
from wansim.acceptance.model import acceptance_model
from wansim.config.drafter import AcceptanceSpec


def dynamic_programming(p: np.ndarray, m: int) -> tuple[float, float]:
    """E[N(m)] and Var N(m) by the plain recursion over tokens still needed."""
    pmf = cf.outcome_pmf(p)  # P(A = a), X = a + 1
    e = np.zeros(m + 1)
    s = np.zeros(m + 1)
    for need in range(1, m + 1):
        rest = [max(0, need - a - 1) for a in range(len(pmf))]
        e[need] = 1 + sum(pmf[a] * e[r] for a, r in enumerate(rest))
        s[need] = sum(pmf[a] * (1 + 2 * e[r] + s[r]) for a, r in enumerate(rest))
    return float(e[m]), float(s[m] - e[m] ** 2)


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=9).map(np.array), st.integers(1, 120))
def test_passes_moments_match_dynamic_programming(p, m):
    mean, var = cf.passes_moments(cf.survival(p)[None, :], m)
    e, v = dynamic_programming(p, m)
    assert mean[0] == pytest.approx(e, rel=1e-9, abs=1e-9)
    assert var[0] == pytest.approx(v, rel=1e-6, abs=1e-7)


def test_passes_moments_lattice_is_exact_where_the_asymptotics_are_not():
    surv = cf.survival(np.ones(3))[None, :]  # X = 4 always: N(40) = 10 exactly
    mean, var = cf.passes_moments(surv, 40)
    assert mean[0] == pytest.approx(10.0, abs=1e-12) and var[0] == pytest.approx(0.0, abs=1e-9)
    t, ex2 = cf.moments(surv, np.array([3]))
    assert cf.expected_passes(40, t, ex2)[0] == pytest.approx(10.375)  # the old answer


def test_passes_moments_monte_carlo_and_asymptotic_tail():
    rng = np.random.default_rng(3)
    p = np.array([0.9, 0.8, 0.7, 0.6])
    surv = cf.survival(p)
    u = rng.random((20_000, 120))
    a = (surv[None, None, :] > u[:, :, None]).sum(axis=2)
    n = (np.cumsum(a + 1, axis=1) < 150).sum(axis=1) + 1
    mean, var = cf.passes_moments(surv[None, :], 150)
    assert mean[0] == pytest.approx(n.mean(), rel=5e-3)
    assert var[0] == pytest.approx(n.var(), rel=0.05)
    # beyond the exact range the renewal asymptotics take over
    big = cf.EXACT_PASSES_MAX_TOKENS + 1
    t, ex2 = cf.moments(surv[None, :], np.array([4]))
    assert cf.passes_moments(surv[None, :], big)[0][0] == cf.expected_passes(big, t, ex2)[0]


def test_difficulty_fit_reaches_deep_positions_under_a_wide_spread():
    q, sigma = heterogeneity.fit(tuple([0.5] * 64), 0.1)
    assert 0 < sigma < heterogeneity.SIGMA_MAX
    assert heterogeneity.between_fraction(np.asarray(q), sigma) == pytest.approx(0.1, abs=1e-6)
    model = acceptance_model(AcceptanceSpec(alpha=0.5, dispersion=0.1))
    assert model.pooled_rates(64)[:20] == pytest.approx(np.full(20, 0.5), abs=1e-6)
