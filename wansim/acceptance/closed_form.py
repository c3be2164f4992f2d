"""Closed forms for a chain of K drafts with per-position conditional acceptance p_1..p_K.

p_i = P(draft i accepted | drafts 1..i-1 accepted). With S_k = prod_{i<=k} p_i (S_0 = 1):

  tau(K)   = E[A + 1] = 1 + sum_{k=1..K} S_k                   (tokens committed per pass)
  P(A = a) = S_a (1 - p_{a+1}) for a < K,   P(A = K) = S_K
  E[X^2]   = 1 + sum_{k=1..K} (2k + 1) S_k   with X = A + 1     (since P(X >= j) = S_{j-1})

"Implied tau at a shorter block k <= K" keeps the first k conditional rates (the drafter's
conditional rates at positions 1..k do not depend on how many positions follow).

Expected verify passes to commit M tokens (a lattice renewal process with step X >= 1):

  E[N(M)] ~= (M - 1 + E[X(X+1)] / (2 tau)) / tau

the stationary forward-recurrence (overshoot) correction; exact as M grows (the error decays
geometrically in M) and exact for X == 1. All functions broadcast over leading axes.
"""

from __future__ import annotations

import numpy as np


def survival(p: np.ndarray) -> np.ndarray:
    """S_k = prod_{i<=k} p_i along the last axis (S_1..S_K)."""
    return np.cumprod(np.asarray(p, dtype=float), axis=-1)


def tau(p: np.ndarray) -> np.ndarray:
    """Expected tokens committed per verify pass for a chain of len(p) drafts."""
    return 1.0 + survival(p).sum(axis=-1)


def tau_constant(alpha: np.ndarray, k: np.ndarray) -> np.ndarray:
    """tau for constant p = alpha: (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023)."""
    alpha = np.asarray(alpha, dtype=float)
    k = np.asarray(k)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return np.where(alpha == 1.0, k + 1.0, out)


def outcome_pmf(p: np.ndarray) -> np.ndarray:
    """P(A = a) for a = 0..K (last axis has K + 1 entries)."""
    s = survival(p)
    ones = np.ones((*s.shape[:-1], 1))
    zeros = np.zeros((*s.shape[:-1], 1))
    s0 = np.concatenate([ones, s], axis=-1)  # S_0..S_K
    s1 = np.concatenate([s, zeros], axis=-1)  # S_1..S_{K+1} (= 0)
    return s0 - s1


def implied_tau(p: np.ndarray, ks: np.ndarray | None = None) -> np.ndarray:
    """tau at shorter blocks: entry k-1 is tau(k) using positions 1..k (k = 1..K by default)."""
    s = survival(p)
    taus = 1.0 + np.cumsum(s, axis=-1)
    if ks is None:
        return taus
    return np.take(taus, np.asarray(ks) - 1, axis=-1)


def moments(surv: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tau, E[X^2]) for blocks of ``k`` drafts given survival S_1..S_Kmax on the last axis.

    ``k`` broadcasts against the leading axes of ``surv``; k = 0 gives (1, 1).
    """
    surv = np.asarray(surv, dtype=float)
    kmax = surv.shape[-1]
    pos = np.arange(1, kmax + 1)
    k = np.asarray(k)
    mask = pos <= k[..., None]
    masked = np.where(mask, surv, 0.0)
    t = 1.0 + masked.sum(axis=-1)
    ex2 = 1.0 + (masked * (2 * pos + 1)).sum(axis=-1)
    return t, ex2


def expected_passes(m_tokens: np.ndarray, tau_: np.ndarray, ex2: np.ndarray) -> np.ndarray:
    """Expected verify passes to commit ``m_tokens`` (renewal overshoot correction, see module)."""
    m = np.asarray(m_tokens, dtype=float)
    tau_ = np.asarray(tau_, dtype=float)
    return (m - 1.0 + (ex2 + tau_) / (2.0 * tau_)) / tau_


def variance_passes(m_tokens: np.ndarray, tau_: np.ndarray, ex2: np.ndarray) -> np.ndarray:
    """Var N(M) ~= M var(X) / tau^3 (renewal central limit theorem)."""
    m = np.asarray(m_tokens, dtype=float)
    var_x = np.maximum(ex2 - tau_**2, 0.0)
    return m * var_x / tau_**3
