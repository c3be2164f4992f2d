"""Student-t confidence intervals: the one half-width every interval in the project uses.

For n values (independent replications, or batch means treated as such) with sample standard
deviation s (ddof 1), the interval at ``level`` is ``centre +- t_{(1 + level) / 2, n - 1} *
s / sqrt(n)``; the centre is the values' mean unless the caller estimates it otherwise (batch
means centre on the mean of all observations). Undefined (NaN) with fewer than two values.

Skewed values (per-request rates when prompts differ in difficulty: a few easy prompts run
several times faster) make a sample's mean and sd move together, so the t-interval misses on
the long tail's side far more often than its level says (40 rates of skewness 2.3: the true
mean above a 95% interval's upper end in 8% of samples, above a 99.99% one's in 0.9%).
:func:`skew_corrected_interval` removes the skewness term by Hall's transformation (P. Hall,
"On the removal of skewness by transformation", JRSS B 54(1), 1992): with T = sqrt(n) (mean -
mu) / s, sample skewness g, a = g / (3 sqrt(n)) and b = g / (6 n),
``G(T) = T + a T^2 + a^2 T^3 / 3 + b`` is nearly symmetric; G is increasing, with the closed
inverse ``G^-1(y) = ((1 + 3 a (y - b))^(1/3) - 1) / a``, so mu lies in ``[mean - s/sqrt(n)
G^-1(q), mean - s/sqrt(n) G^-1(-q)]`` with q the t quantile (at g = 0: the t-interval).
"""

from __future__ import annotations

import numpy as np

from wansim.numerics.normal_functions import t_ppf


def t_half_width(values, level: float = 0.95) -> float:
    """``t_{(1 + level) / 2, n - 1} * sd(values, ddof=1) / sqrt(n)``; NaN when n < 2."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n < 2:
        return float("nan")
    return float(t_ppf(0.5 + level / 2, n - 1) * np.std(values, ddof=1) / np.sqrt(n))


def t_interval(values, level: float = 0.95, centre: float | None = None) -> tuple[float, float]:
    """``centre +- t_half_width(values, level)``; ``centre`` defaults to the values' mean."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float("nan"), float("nan")
    mid = float(np.mean(values)) if centre is None else float(centre)
    half = t_half_width(values, level)
    return mid - half, mid + half


def sample_skewness(values) -> float:
    """Third central moment over the cubed sample sd (ddof 1); 0 without spread."""
    values = np.asarray(values, dtype=float)
    sd = float(np.std(values, ddof=1))
    if not sd > 0:
        return 0.0
    return float(np.mean((values - values.mean()) ** 3) / sd**3)


def hall_inverse(y, a: float, b: float):
    """``G^-1(y)`` for Hall's ``G(t) = t + a t^2 + a^2 t^3 / 3 + b`` (module docstring)."""
    if abs(a) < 1e-12:
        return y - b
    return (np.cbrt(1 + 3 * a * (y - b)) - 1) / a


def skew_corrected_interval(values, level: float = 0.95) -> tuple[float, float]:
    """Hall's skewness-corrected t-interval for the mean (module docstring); NaN when n < 2."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n < 2:
        return float("nan"), float("nan")
    mean, se = float(values.mean()), float(np.std(values, ddof=1) / np.sqrt(n))
    g = sample_skewness(values)
    a, b = g / (3 * np.sqrt(n)), g / (6 * n)
    q = t_ppf(0.5 + level / 2, n - 1)
    return float(mean - se * hall_inverse(q, a, b)), float(mean - se * hall_inverse(-q, a, b))
