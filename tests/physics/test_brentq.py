"""wansim.numerics.brentq against scipy.optimize.brentq: the same root to the bit, the same errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq as scipy_brentq

from wansim.numerics.brentq import brentq


@settings(max_examples=300, deadline=None)
@given(
    st.floats(-50, 50),
    st.sampled_from(["cubic", "exp", "logistic", "steep", "flat"]),
    st.floats(0.01, 30),
    st.floats(0.01, 30),
    st.sampled_from([2e-12, 1e-9, 1e-13, 1e-3]),
)
def test_the_same_root_as_scipy_to_the_bit(root, shape, left, right, xtol):
    funcs = {
        "cubic": lambda x: (x - root) ** 3 + 0.5 * (x - root),
        "exp": lambda x: math.exp(0.3 * (x - root)) - 1.0,
        "logistic": lambda x: 1 / (1 + math.exp(-(x - root))) - 0.5,
        "steep": lambda x: math.atan(1e4 * (x - root)),
        "flat": lambda x: (x - root) * 1e-8 + (x - root) ** 5,
    }
    f = funcs[shape]
    a, b = root - left, root + right
    assert brentq(f, a, b, xtol=xtol) == scipy_brentq(f, a, b, xtol=xtol)


def test_numpy_valued_functions_as_the_engines_call_it():
    w, m, s = np.array([0.3, 0.7]), np.array([1.0, 4.0]), np.array([0.5, 2.0])

    def cdf(x):
        return float(w @ (0.5 * (1 + np.tanh((x - m) / s)))) - 0.99

    assert brentq(cdf, -20.0, 30.0, xtol=1e-9) == scipy_brentq(cdf, -20.0, 30.0, xtol=1e-9)


def test_the_same_errors():
    with pytest.raises(ValueError, match="different signs"):
        brentq(lambda x: x * x + 1, -1.0, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        brentq(lambda x: float("nan"), -1.0, 1.0)
    with pytest.raises(RuntimeError, match="converge"):
        brentq(lambda x: x - 0.3, -1.0, 1.0, maxiter=2)
    assert brentq(lambda x: x, 0.0, 1.0) == 0.0  # a root at an end
