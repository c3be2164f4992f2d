"""Per-prompt difficulty: a logit-normal scale on every conditional acceptance rate.

Model. Request r has a latent difficulty Z_r ~ N(0, 1); its conditional rate at position i is

    p_i(Z) = sigmoid(logit(q_i) + sigma * Z)

(always a valid probability; sigma = 0 gives every request the rates q). Within a request the
steps are independent given Z (sampling noise). A profile's per-position rates, histogram and
dispersion are *pooled over steps*: a request decoding M tokens contributes ~M / tau(Z) steps,
so the pooled survival is the step-weighted mixture

    P_k = E[w(Z) S_k(Z)] / E[w(Z)],   S_k(Z) = prod_{i<=k} p_i(Z),   w(Z) = 1 / tau(Z).

``dispersion`` is the between-prompt share of the pooled per-step variance of A (law of total
variance, step-weighted): Var_w(E[A|Z]) / Var_w(A).

Fitting: given pooled rates and a dispersion, sigma is found by root-finding on the dispersion,
and for each sigma the q_i are solved position by position so that the pooled survival matches
(the step weights w depend on q, so this is iterated to a fixed point). Expectations over Z use
Gauss-Hermite quadrature.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.special import expit, logit

QUADRATURE_NODES = 40
SIGMA_MAX = 8.0


@lru_cache(maxsize=8)
def quadrature(n: int = QUADRATURE_NODES) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights (summing to 1) for E[f(Z)], Z ~ N(0, 1)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(n)
    return nodes, weights / weights.sum()


def node_rates(q: np.ndarray, sigma: float, z: np.ndarray) -> np.ndarray:
    """p_i(Z) for each node: shape (len(z), len(q))."""
    q = np.clip(np.asarray(q, dtype=float), 1e-12, 1 - 1e-12)
    return expit(logit(q)[None, :] + sigma * np.asarray(z)[:, None])


def _step_weights(weights: np.ndarray, surv: np.ndarray) -> np.ndarray:
    tau = 1.0 + surv.sum(axis=1)
    w = weights / tau
    return w / w.sum()


def fit_rates(pooled: np.ndarray, sigma: float, iterations: int = 60) -> np.ndarray:
    """q such that the step-weighted pooled survival under sigma equals that of ``pooled``."""
    pooled = np.clip(np.asarray(pooled, dtype=float), 1e-9, 1 - 1e-9)
    if sigma == 0:
        return pooled.copy()
    z, weights = quadrature()
    target = np.cumprod(pooled)
    q = pooled.copy()
    for _ in range(iterations):
        surv = np.cumprod(node_rates(q, sigma, z), axis=1)
        omega = _step_weights(weights, surv)
        q_new = q.copy()
        prev = np.ones_like(z)
        for k in range(len(q)):

            def gap(
                x: float, k: int = k, prev: np.ndarray = prev, omega: np.ndarray = omega
            ) -> float:
                return float(omega @ (prev * expit(x + sigma * z))) - target[k]

            x = _root(gap)
            q_new[k] = expit(x)
            prev = prev * expit(x + sigma * z)
        done = np.max(np.abs(q_new - q)) < 1e-12
        q = q_new
        if done:
            break
    return q


def next_rate(q: tuple[float, ...], sigma: float, conditional: float) -> float:
    """q_(K+1) (median difficulty) whose step-weighted pooled conditional rate after the K
    rates ``q``, P(A >= K + 1 | A >= K) over requests running blocks of K (their step weights),
    equals ``conditional``: E[w S_K(Z) p(Z)] = conditional E[w S_K(Z)]. sigma = 0: the
    conditional itself. The rates q_1..q_K and sigma are left as fitted."""
    c = min(max(float(conditional), 1e-9), 1 - 1e-9)
    if sigma == 0:
        return c
    z, weights = quadrature()
    surv = np.cumprod(node_rates(np.asarray(q, dtype=float), sigma, z), axis=1)
    reach = _step_weights(weights, surv) * surv[:, -1]

    def gap(x: float) -> float:
        return float(reach @ expit(x + sigma * z)) - c * float(reach.sum())

    return float(expit(_root(gap)))


def _root(gap) -> float:
    """Root of an increasing ``gap`` in logit space; the bracket widens until it holds (deep
    positions under a wide difficulty spread need logits far below -40). A gap still positive
    at the widest bracket (a target below float resolution) returns that lower end."""
    lo, hi = -40.0, 40.0
    while gap(lo) > 0 and lo > -5000.0:
        lo *= 2
    while gap(hi) < 0 and hi < 5000.0:
        hi *= 2
    if gap(lo) > 0:
        return lo
    from wansim.numerics.brentq import (
        brentq,
    )  # scipy.optimize.brentq to the bit, without its import

    return brentq(gap, lo, hi, xtol=1e-13)


def between_fraction(q: np.ndarray, sigma: float) -> float:
    """Step-weighted between-prompt share of Var(A) under the model."""
    if sigma == 0:
        return 0.0
    z, weights = quadrature()
    surv = np.cumprod(node_rates(q, sigma, z), axis=1)
    omega = _step_weights(weights, surv)
    k = surv.shape[1]
    pos = np.arange(1, k + 1)
    mean_a = surv.sum(axis=1)  # E[A|Z] = sum_k S_k
    ex2 = 1.0 + (surv * (2 * pos + 1)).sum(axis=1)  # E[(A+1)^2 | Z]
    var_a = ex2 - (1.0 + mean_a) ** 2
    grand = omega @ mean_a
    between = omega @ (mean_a - grand) ** 2
    within = omega @ var_a
    total = between + within
    return float(between / total) if total > 0 else 0.0


@lru_cache(maxsize=256)
def fit(pooled: tuple[float, ...], dispersion: float) -> tuple[tuple[float, ...], float]:
    """(q, sigma) reproducing pooled rates and dispersion. Raises ValueError if unreachable.
    The shipped profiles' fits are read from :mod:`wansim.acceptance.fit_table` (the same
    values, computed once); any other input is fitted here."""
    from wansim.acceptance import fit_table

    stored = fit_table.lookup(pooled, dispersion)
    if stored is not None:
        rates, sigma = stored
        return tuple(np.float64(x) for x in rates), sigma
    return fit_uncached(pooled, dispersion)


def fit_uncached(pooled: tuple[float, ...], dispersion: float) -> tuple[tuple[float, ...], float]:
    """:func:`fit` computed (root-finding on sigma, each sigma's rates solved position by
    position)."""
    pooled_arr = np.asarray(pooled, dtype=float)
    if dispersion <= 0:
        return tuple(pooled_arr), 0.0

    def gap(sigma: float) -> float:
        return between_fraction(fit_rates(pooled_arr, sigma), sigma) - dispersion

    top = gap(SIGMA_MAX)
    if top < 0:
        reachable = top + dispersion
        raise ValueError(
            f"dispersion {dispersion:g} is beyond this model's reach for these rates "
            f"(at most {reachable:.3f})"
        )
    from wansim.numerics.brentq import (
        brentq,
    )  # scipy.optimize.brentq to the bit, without its import

    sigma = brentq(gap, 1e-6, SIGMA_MAX, xtol=1e-8)
    return tuple(fit_rates(pooled_arr, sigma)), float(sigma)
