"""Brent's root finder: ``scipy.optimize.brentq``'s algorithm without scipy.optimize's import.

scipy.optimize takes ~0.3 s of CPU to import (linprog, HiGHS, sparse linear algebra) where the
engines need one scalar root finder. This is the algorithm of scipy's ``Zeros/brentq.c``
(Charles Harris), step by step and operation by operation, so every root is the one scipy
returns, to the bit (``tests/physics/test_brentq.py`` compares them): inverse quadratic
interpolation or a secant step when it is short enough, bisection otherwise, until the
bracket is below ``xtol + rtol |x|``. Same defaults (``rtol`` = 4 eps, 100 iterations), same
errors (no sign change; not converged; a NaN from ``f``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

RTOL = 4 * 2.220446049250313e-16  # scipy's _rtol: 4 * machine epsilon
MAXITER = 100


def brentq(
    f: Callable[[float], float],
    a: float,
    b: float,
    xtol: float = 2e-12,
    rtol: float = RTOL,
    maxiter: int = MAXITER,
) -> float:
    """A root of ``f`` in [a, b], where f(a) and f(b) differ in sign (scipy's brentq)."""
    if xtol <= 0:
        raise ValueError(f"xtol too small ({xtol:g} <= 0)")
    if rtol < RTOL:
        raise ValueError(f"rtol too small ({rtol:g} < {RTOL:g})")
    xpre, xcur = float(a), float(b)
    xblk = fblk = spre = scur = 0.0
    fpre, fcur = _value(f, xpre), _value(f, xcur)
    if fpre == 0:
        return xpre
    if fcur == 0:
        return xcur
    if math.copysign(1.0, fpre) == math.copysign(1.0, fcur):
        raise ValueError("f(a) and f(b) must have different signs")
    for _ in range(maxiter):
        if fpre != 0 and fcur != 0 and math.copysign(1.0, fpre) != math.copysign(1.0, fcur):
            xblk, fblk = xpre, fpre
            spre = scur = xcur - xpre
        if abs(fblk) < abs(fcur):
            xpre, xcur, xblk = xcur, xblk, xcur
            fpre, fcur, fblk = fcur, fblk, fcur
        delta = (xtol + rtol * abs(xcur)) / 2
        sbis = (xblk - xcur) / 2
        if fcur == 0 or abs(sbis) < delta:
            return xcur
        if abs(spre) > delta and abs(fcur) < abs(fpre):
            if xpre == xblk:  # interpolate
                stry = -fcur * (xcur - xpre) / (fcur - fpre)
            else:  # extrapolate
                dpre = (fpre - fcur) / (xpre - xcur)
                dblk = (fblk - fcur) / (xblk - xcur)
                stry = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
            if 2 * abs(stry) < min(abs(spre), 3 * abs(sbis) - delta):  # a good short step
                spre, scur = scur, stry
            else:
                spre = scur = sbis
        else:
            spre = scur = sbis
        xpre, fpre = xcur, fcur
        if abs(scur) > delta:
            xcur += scur
        else:
            xcur += delta if sbis > 0 else -delta
        fcur = _value(f, xcur)
    raise RuntimeError(f"brentq failed to converge after {maxiter} iterations, value is {xcur}")


def _value(f, x: float) -> float:
    v = float(f(x))
    if math.isnan(v):
        raise ValueError(f"The function value at x={x:f} is NaN; solver cannot continue.")
    return v
