"""Student-t confidence intervals: the one half-width every interval in the project uses.

For n values (independent replications, or batch means treated as such) with sample standard
deviation s (ddof 1), the interval at ``level`` is ``centre +- t_{(1 + level) / 2, n - 1} *
s / sqrt(n)``; the centre is the values' mean unless the caller estimates it otherwise (batch
means centre on the mean of all observations). Undefined (NaN) with fewer than two values.
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
