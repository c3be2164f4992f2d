"""A request's mean decode rate E[M / T], with its retransmissions counted exactly.

``tokens_per_s`` is the mean over requests of M / T (T the request's decode time). The second
order (delta) expansion

    E[M / T] ~ M / E[T] (1 + Var T / E[T]^2)

holds while T is roughly normal. Retransmissions break it when they are rare and long: a
request that sees no loss runs at the lossless rate, one that sees a loss of RTO c >> its other
time runs many times slower, and the expansion then overshoots (it can exceed the lossless
rate). So T is conditioned on K, the request's number of lost transmissions:

    E[M / T] = sum_k P(K = k) E[M / T | K = k],
    E[M / T | k] ~ M / mu_k (1 + v_k / mu_k^2)      (the delta expansion, now for what is left)

with K negative binomial of the given mean and variance (exact for a fixed number of messages on
hops of one loss rate: a sum of geometric counts; Poisson when the variance equals the mean),
and T | k from linear conditioning on K:

    mu_k = E[T] + beta (k - E[K]),              beta = Cov(T, K) / Var K
    v_k  = Var T - Cov(T, K)^2 / Var K + jump_var (k - E[K])

(``jump_var``: the variance of one retransmission's delay that the count does not explain, e.g.
hops of different RTOs). Exact for one hop, a fixed pass count and no jitter; as E[K] grows K
concentrates and the sum becomes the delta expansion of the whole T. Points whose K would need
more than ``K_MAX`` terms (tail mass above ``TAIL``) take that expansion directly.
"""

from __future__ import annotations

import numpy as np
from scipy import special

K_MAX = 400  # most terms summed; beyond them K is concentrated and the expansion holds
TAIL = 1e-9  # probability mass of K a sum may leave out
CHUNK_CELLS = 2_000_000  # points x terms evaluated at once (memory)


def delta_rate(m, t_mean, t_var) -> np.ndarray:
    """M / E[T] (1 + Var T / E[T]^2): the second-order mean of M / T."""
    t_mean = np.asarray(t_mean, dtype=float)
    return np.asarray(m) / t_mean * (1.0 + np.asarray(t_var) / t_mean**2)


def loss_count_pmf(k: np.ndarray, mean, var) -> np.ndarray:
    """P(K = k) for K negative binomial with ``mean`` and ``var`` (>= mean; Poisson at equality).

    NB(r, p): r = mean^2 / (var - mean), p = mean / var.
    """
    mean = np.asarray(mean, dtype=float)
    extra = np.maximum(np.asarray(var, dtype=float) - mean, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        poisson = extra <= 1e-12 * np.maximum(mean, 1e-300)
        r = np.where(poisson, 1.0, mean**2 / np.where(poisson, 1.0, extra))
        p = np.where(poisson, 0.5, mean / (mean + extra))
        log_nb = (
            special.gammaln(k + r)
            - special.gammaln(r)
            - special.gammaln(k + 1.0)
            + r * np.log(p)
            + k * np.log1p(-p)
        )
        log_poisson = k * np.log(mean) - mean - special.gammaln(k + 1.0)
    pmf = np.exp(np.where(poisson, log_poisson, log_nb))
    return np.where(mean > 0, np.nan_to_num(pmf), (k == 0).astype(float))


def mean_rate(m, t_mean, t_var, k_mean, k_var, cov_tk, jump_var) -> np.ndarray:
    """E[M / T] (module docstring); every argument broadcasts (arrays of points and nodes).

    ``t_mean``, ``t_var``: mean and variance of T (retransmissions included); ``k_mean``,
    ``k_var``: of K, the request's lost transmissions; ``cov_tk`` = Cov(T, K).
    """
    args = (m, t_mean, t_var, k_mean, k_var, cov_tk, jump_var)
    shape = np.broadcast_shapes(*(np.shape(x) for x in args))
    m, t_mean, t_var, k_mean, k_var, cov_tk, jump_var = (
        np.broadcast_to(np.asarray(x, dtype=float), shape) for x in args
    )
    out = delta_rate(m, t_mean, t_var)
    lossy = k_mean > 0
    if not lossy.any():
        return out
    k_var = np.maximum(k_var, k_mean)
    top = float(np.max(np.where(lossy, k_mean + 12.0 * np.sqrt(k_var) + 12.0, 0.0)))
    ks = np.arange(min(int(np.ceil(top)), K_MAX) + 1, dtype=float)
    idx = np.flatnonzero(lossy)
    flat = {
        name: x.reshape(-1)
        for name, x in dict(
            m=m, mu=t_mean, var=t_var, km=k_mean, kv=k_var, cov=cov_tk, jump=jump_var
        ).items()
    }
    result = out.reshape(-1).copy()
    k = ks[:, None]
    chunk = max(1, CHUNK_CELLS // len(ks))
    for lo in range(0, len(idx), chunk):
        at = idx[lo : lo + chunk]
        mu, km, kv = flat["mu"][at], flat["km"][at], flat["kv"][at]
        beta = flat["cov"][at] / kv
        resid = np.maximum(flat["var"][at] - flat["cov"][at] * beta, 0.0)
        pmf = loss_count_pmf(k, km, kv)
        mu_k = np.maximum(mu + beta * (k - km), 1e-12 * mu)
        v_k = np.maximum(resid + flat["jump"][at] * (k - km), 0.0)
        summed = (pmf * flat["m"][at] / mu_k * (1.0 + v_k / mu_k**2)).sum(axis=0)
        covered = pmf.sum(axis=0) >= 1.0 - TAIL
        result[at] = np.where(covered, summed, result[at])
    out = result.reshape(shape)
    return out
