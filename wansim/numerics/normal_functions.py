"""The distribution functions the engines need, from ``scipy.special`` (imported in ~0.1 s)
instead of ``scipy.stats`` (~0.5-1 s): the same formulas scipy.stats evaluates, so the same
values to the bit (``tests/physics/test_normal_functions.py`` compares them with scipy.stats).

- standard normal: cdf = ndtr, ppf = ndtri, pdf = exp(-x^2 / 2) / sqrt(2 pi);
- normal N(mean, std^2): cdf((x - mean) / std), ppf(p) * std + mean;
- lognormal with shape s and scale e^mu (support x > 0): cdf = ndtr(log(x / scale) / s),
  ppf = exp(s ndtri(p)) * scale;
- Student t with df degrees of freedom: ppf = stdtrit(df, p).
"""

from __future__ import annotations

import numpy as np
from scipy import special

_SQRT_2PI = np.sqrt(2 * np.pi)


def norm_cdf(x, mean=0.0, std=1.0):
    return special.ndtr((np.asarray(x, dtype=float) - mean) / std)


def norm_ppf(p, mean=0.0, std=1.0):
    return special.ndtri(np.asarray(p, dtype=float)) * std + mean


def norm_pdf(x):
    x = np.asarray(x, dtype=float)
    return np.exp(-(x**2) / 2.0) / _SQRT_2PI


def lognorm_cdf(x, s: float, scale: float):
    z = np.asarray(x, dtype=float) / scale
    positive = z > 0
    out = np.zeros(z.shape)
    out[positive] = special.ndtr(np.log(z[positive]) / s)
    return out if out.ndim else out[()]


def lognorm_ppf(p, s: float, scale: float):
    return np.exp(s * special.ndtri(np.asarray(p, dtype=float))) * scale


def t_ppf(p, df):
    p = np.asarray(p, dtype=float)
    out = np.where(p == 0.0, -np.inf, special.stdtrit(df, p))  # stdtrit(df, 0) is +inf
    return out if out.ndim else out[()]
