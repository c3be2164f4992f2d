"""Closed forms for a chain of K drafts with per-position conditional acceptance p_1..p_K.

p_i = P(draft i accepted | drafts 1..i-1 accepted). With S_k = prod_{i<=k} p_i (S_0 = 1):

  tau(K)   = E[A + 1] = 1 + sum_{k=1..K} S_k                   (tokens committed per pass)
  P(A = a) = S_a (1 - p_{a+1}) for a < K,   P(A = K) = S_K
  E[X^2]   = 1 + sum_{k=1..K} (2k + 1) S_k   with X = A + 1     (since P(X >= j) = S_{j-1})

"Implied tau at a shorter block k <= K" keeps the first k conditional rates (the drafter's
conditional rates at positions 1..k do not depend on how many positions follow).

Expected verify passes to commit M tokens (a lattice renewal process with step X >= 1):

  E[N(M)] ~= (M - 1 + E[X(X+1)] / (2 tau)) / tau

the stationary forward-recurrence (overshoot) correction; exact for X == 1 and, as M grows, for
aperiodic X (the error decays geometrically in M, slowly when X is nearly deterministic; for a
lattice X such as a drafter that is always accepted it oscillates with M mod span, e.g. 4% at
M = 40, K = 3). :func:`passes_moments` gives E[N(M)] and Var N(M) exactly for the M at hand
(recurrences, up to ``EXACT_PASSES_MAX_TOKENS``). All functions broadcast over leading axes.
"""

from __future__ import annotations

import numpy as np

EXACT_PASSES_MAX_TOKENS = 100_000


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


NUMPY_FILTER_MAX_STEPS = 4096  # beyond: scipy's lfilter (scipy.signal costs ~0.7 s to import)


def all_pole_filter(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``scipy.signal.lfilter([1.0], a_r, x_r)`` for every row r of ``a`` (R, L), a[:, 0] = 1,
    and ``x`` (R, n): y[t] = x[t] - sum_k a[k] y[t - k]. Up to ``NUMPY_FILTER_MAX_STEPS`` steps
    all rows advance together in numpy with lfilter's own operation order (direct form II
    transposed: y = z_0 + x; z_k = z_(k+1) - y a_(k+1)), so the values are lfilter's to the bit
    (tests/acceptance/test_closed_form.py); longer inputs go to lfilter row by row."""
    a = np.asarray(a, dtype=float)
    x = np.asarray(x, dtype=float)
    if x.shape[-1] > NUMPY_FILTER_MAX_STEPS:
        from scipy.signal import lfilter

        return np.array([lfilter([1.0], a_r, x_r) for a_r, x_r in zip(a, x, strict=True)])
    rows, order = a.shape
    # state and output stored time/coefficient-major (rows contiguous): the same elementwise
    # operations, written into preallocated arrays
    a_t = np.ascontiguousarray(a.T)
    a_mid, a_last = a_t[1:-1], a_t[-1]
    x_t = np.ascontiguousarray(x.T)
    z = np.zeros((order - 1, rows))
    y = np.empty((x.shape[-1], rows))
    scratch = np.empty((max(order - 2, 0), rows))
    for t in range(x.shape[-1]):
        yt = y[t]
        np.add(z[0], x_t[t], out=yt)
        if order > 2:
            np.multiply(yt, a_mid, out=scratch)
            np.subtract(z[1:], scratch, out=z[:-1])
        np.multiply(yt, a_last, out=z[-1])
        np.subtract(0.0, z[-1], out=z[-1])
    return np.ascontiguousarray(y.T)


def passes_moments(surv: np.ndarray, m_tokens: float) -> tuple[np.ndarray, np.ndarray]:
    """(E[N(M)], Var N(M)) per row of survival S_1..S_D (leading axes, e.g. difficulty nodes).

    Exact for M <= EXACT_PASSES_MAX_TOKENS: with X = A + 1 tokens committed per pass (the last
    pass truncated), e(m) = E[N(m)] and s(m) = E[N(m)^2] obey

        e(m) = 1 + sum_x P(X = x) e(m - x),      s(m) = 2 e(m) - 1 + sum_x P(X = x) s(m - x)

    with e = s = 0 for m <= 0 (run as all-pole filters, every row at once). Beyond that M, the
    renewal asymptotics :func:`expected_passes` and :func:`variance_passes`.
    """
    surv = np.asarray(surv, dtype=float)
    lead = surv.shape[:-1]
    depth = surv.shape[-1]
    tau_, ex2 = moments(surv, np.full(lead, depth))
    m = round(float(m_tokens))
    if m > EXACT_PASSES_MAX_TOKENS or depth == 0:
        return expected_passes(m, tau_, ex2), variance_passes(m, tau_, ex2)
    rows = np.ascontiguousarray(surv.reshape(-1, depth))
    key = _memo_key(rows, m)
    got = _EXACT_MEMO.get(key) if key is not None else None
    if got is None:
        ones = np.ones((len(rows), 1))
        pmf_x = -np.diff(np.concatenate([ones, rows, 0.0 * ones], axis=1), axis=1)  # P(X = 1..D+1)
        a = np.concatenate([ones, -pmf_x], axis=1)
        e = all_pole_filter(a, np.ones((len(rows), m)))
        s2 = all_pole_filter(a, 2.0 * e - 1.0)
        mean = e[:, -1].copy()  # contiguous, as callers' reductions expect (summation order)
        got = _remember(key, mean, np.maximum(s2[:, -1] - mean**2, 0.0))
    mean, var = got
    return mean.copy().reshape(lead), var.copy().reshape(lead)


# (rows' shape, rows' bytes, M) -> (mean, var) of the exact recurrences: one scenario asks for
# the same tables again (a drifting ring's pieces, the workload's nodes, the engines' parts),
# and each costs M numpy steps; answers are returned as copies (the values to the bit)
_EXACT_MEMO: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
EXACT_MEMO_ENTRIES = 512
EXACT_MEMO_MAX_VALUES = 4096  # larger tables (a vectorised grid's) are not kept


def _memo_key(rows: np.ndarray, m: int) -> tuple | None:
    return (rows.shape, rows.tobytes(), m) if rows.size <= EXACT_MEMO_MAX_VALUES else None


def _remember(key, mean: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if key is None:
        return mean, var
    if len(_EXACT_MEMO) >= EXACT_MEMO_ENTRIES:
        _EXACT_MEMO.pop(next(iter(_EXACT_MEMO)))  # the oldest
    _EXACT_MEMO[key] = (mean, var)
    return mean, var


def passes_moments_many(
    survs: list[np.ndarray], m_tokens: list[float]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`passes_moments` of each (survival table, M) pair, the same values to the bit.

    The exact recurrences of every table with the same M (up to ``NUMPY_FILTER_MAX_STEPS``) run
    as one :func:`all_pole_filter` over all their rows: a table of depth D padded with zero
    survival to the group's depth has zero filter coefficients beyond D + 1, whose state stays
    exactly 0.0 (0.0 - y * 0.0 is 0.0 for any finite y), so each row's operations and roundings
    are its own table's (elementwise, no reduction across rows). The rest run one by one."""
    out: list = [None] * len(survs)
    groups: dict[int, list[int]] = {}
    for i, (surv, m_tok) in enumerate(zip(survs, m_tokens, strict=True)):
        surv = np.asarray(surv, dtype=float)
        m = round(float(m_tok))
        exact = 0 < m <= min(EXACT_PASSES_MAX_TOKENS, NUMPY_FILTER_MAX_STEPS)
        if exact and surv.ndim == 2 and surv.shape[1] > 0:
            groups.setdefault(m, []).append(i)
        else:
            out[i] = passes_moments(surv, m_tok)
    for m, members in groups.items():
        # identical tables (e.g. grid points differing only in activation width) once
        first: dict[tuple, int] = {}
        for i in members:
            surv = np.asarray(survs[i], dtype=float)
            first.setdefault((surv.shape, surv.tobytes()), i)
        unique = list(dict.fromkeys(first.values()))
        done = {}
        for i in unique:  # tables answered before
            key = _memo_key(np.ascontiguousarray(np.asarray(survs[i], dtype=float)), m)
            got = _EXACT_MEMO.get(key) if key is not None else None
            if got is not None:
                done[i] = got
        unique = [i for i in unique if i not in done]
        tables = [np.asarray(survs[i], dtype=float) for i in unique]
        if tables:
            depth = max(t.shape[1] for t in tables)
            rows = np.zeros((sum(len(t) for t in tables), depth))
            at = 0
            for t in tables:
                rows[at : at + len(t), : t.shape[1]] = t
                at += len(t)
            ones = np.ones((len(rows), 1))
            pmf_x = -np.diff(np.concatenate([ones, rows, 0.0 * ones], axis=1), axis=1)
            a = np.concatenate([ones, -pmf_x], axis=1)
            e = all_pole_filter(a, np.ones((len(rows), m)))
            s2 = all_pole_filter(a, 2.0 * e - 1.0)
        at = 0
        for i, t in zip(unique, tables, strict=True):
            mean = e[at : at + len(t), -1].copy()  # contiguous, as passes_moments returns it
            var = np.maximum(s2[at : at + len(t), -1] - mean**2, 0.0)
            done[i] = _remember(_memo_key(np.ascontiguousarray(t), m), mean, var)
            at += len(t)
        for i in members:
            surv = np.asarray(survs[i], dtype=float)
            mean, var = done[first[(surv.shape, surv.tobytes())]]
            out[i] = (mean.copy(), var.copy())
    return out


EXACT_INVERSE_MAX_TOKENS = (
    64  # beyond it the delta expansion is within 0.1% (k <= 7, alpha 0.3-0.9)
)


def inverse_pass_moments(surv: np.ndarray, m_tokens: float):
    """(E[1 / N(M)], E[1 / N(M)^2]) per row of survival S_1..S_D, exactly, or None when M
    exceeds ``EXACT_INVERSE_MAX_TOKENS`` (then the delta expansion around E[N] serves).

    A request's decode rate is M / (N lap): for short outputs E[1/N] differs from
    (1 + Var N / E[N]^2) / E[N] by several percent (4 tokens: -4.7%). The distribution of N
    by dynamic programming over the tokens committed so far: each pass commits X tokens,
    P(X = x) for x = 1..D+1, and N is the first pass that reaches M."""
    surv = np.asarray(surv, dtype=float)
    m = round(float(m_tokens))
    if m > EXACT_INVERSE_MAX_TOKENS:
        return None
    lead = surv.shape[:-1]
    depth = surv.shape[-1]
    rows = surv.reshape(-1, depth)
    pmf_x = -np.diff(np.concatenate([np.ones((len(rows), 1)), rows, np.zeros((len(rows), 1))], 1))
    inv = np.zeros(len(rows))
    inv2 = np.zeros(len(rows))
    live = np.zeros((len(rows), m))  # P(t tokens committed, t < M) after n passes
    live[:, 0] = 1.0
    for n in range(1, m + 1):
        nxt = np.zeros((len(rows), m + 1 + depth))
        for x in range(1, depth + 2):
            nxt[:, x : x + m] += pmf_x[:, x - 1 : x] * live
        done = nxt[:, m:].sum(axis=1)
        inv += done / n
        inv2 += done / n**2
        live = nxt[:, :m]
        if live.sum() < 1e-15:
            break
    return inv.reshape(lead), inv2.reshape(lead)
