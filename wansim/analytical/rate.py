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
and each loss adding a delay of mean c and variance v to what the request takes without them:

    mu_k = E[B] + c k,      v_k = Var B + v k          (B: the decode time without losses)

Exact for one hop, a fixed pass count and no jitter; as E[K] grows K concentrates and the sum
becomes the delta expansion of the whole T. Points whose K would need more than ``K_MAX`` terms
(tail mass above ``TAIL``) take that expansion directly.
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


def mean_rate(m, base_mean, base_var, k_mean, k_var, jump_ms, jump_var) -> np.ndarray:
    """E[M / T] for T = B + (K losses of c = ``jump_ms`` each, spread ``jump_var``) (module
    docstring); every argument broadcasts (arrays of points and nodes).

    ``base_mean``, ``base_var``: of B, the time without losses; ``k_mean``, ``k_var``: of K.
    """
    args = (m, base_mean, base_var, k_mean, k_var, jump_ms, jump_var)
    shape = np.broadcast_shapes(*(np.shape(x) for x in args))
    m, base_mean, base_var, k_mean, k_var, jump_ms, jump_var = (
        np.broadcast_to(np.asarray(x, dtype=float), shape) for x in args
    )
    k_var = np.maximum(k_var, k_mean)
    out = delta_rate(
        m, base_mean + jump_ms * k_mean, base_var + jump_ms**2 * k_var + jump_var * k_mean
    )
    lossy = np.flatnonzero(k_mean > 0)
    if not lossy.size:
        return out
    top = float(np.max(k_mean.reshape(-1)[lossy] + 12.0 * np.sqrt(k_var.reshape(-1)[lossy])))
    k = np.arange(min(int(np.ceil(top + 12.0)), K_MAX) + 1, dtype=float)[:, None]
    flat = [x.reshape(-1) for x in (m, base_mean, base_var, k_mean, k_var, jump_ms, jump_var)]
    result = out.reshape(-1).copy()
    chunk = max(1, CHUNK_CELLS // len(k))
    for lo in range(0, len(lossy), chunk):
        at = lossy[lo : lo + chunk]
        m_, b_mean, b_var, km, kv, c, v = (x[at] for x in flat)
        pmf = loss_count_pmf(k, km, kv)
        mu_k = b_mean + c * k
        summed = (pmf * delta_rate(m_, mu_k, b_var + v * k)).sum(axis=0)
        covered = pmf.sum(axis=0) >= 1.0 - TAIL
        result[at] = np.where(covered, summed, result[at])
    return result.reshape(shape)
