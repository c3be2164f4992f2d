"""Propagation jitter J of a hop: the distribution the delay max(0, L + J) draws from.

Kinds (``wansim.config.network.Jitter``): none (J = 0); normal N(mean_ms, std_ms); lognormal (J >= 0,
mean ``mean_ms``, default ``std_ms``, and standard deviation ``std_ms``); pareto (Lomax, tail
index ``shape`` > 2, standard deviation ``std_ms``); empirical (resampled values). Sampling and
moments need numpy only; the distribution functions import scipy when first called (the
emulator's relays sample and must start fast).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import numpy as np

from wansim.data import is_file
from wansim.errors import ScenarioError


@dataclasses.dataclass(frozen=True)
class JitterDist:
    """Distribution of the extra delay J (ms)."""

    kind: str
    params: tuple[float, ...] = ()
    samples: tuple[float, ...] = ()

    # -- sampling -------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.kind == "none":
            return np.zeros(size)
        if self.kind == "normal":
            mean, std = self.params
            return rng.normal(mean, std, size)
        if self.kind == "lognormal":
            mu, sigma = self.params
            return rng.lognormal(mu, sigma, size)
        if self.kind == "pareto":
            shape, scale = self.params
            return scale * (rng.random(size) ** (-1.0 / shape) - 1.0)
        return rng.choice(np.asarray(self.samples), size)

    # -- moments and distribution ---------------------------------------------------------
    def mean(self) -> float:
        if self.kind == "none":
            return 0.0
        if self.kind == "normal":
            return self.params[0]
        if self.kind == "lognormal":
            mu, sigma = self.params
            return float(np.exp(mu + sigma**2 / 2))
        if self.kind == "pareto":
            shape, scale = self.params
            return scale / (shape - 1.0)
        return float(np.mean(self.samples))

    def cdf(self, x: np.ndarray) -> np.ndarray:
        from wansim.numerics import normal_functions as nf  # only here: relays sample without scipy

        x = np.asarray(x, dtype=float)
        if self.kind == "none":
            return (x >= 0).astype(float)
        if self.kind == "normal":
            mean, std = self.params
            return nf.norm_cdf(x, mean, std)
        if self.kind == "lognormal":
            mu, sigma = self.params
            return nf.lognorm_cdf(x, sigma, np.exp(mu))
        if self.kind == "pareto":
            shape, scale = self.params
            return np.where(x > 0, 1.0 - (1.0 + np.maximum(x, 0) / scale) ** (-shape), 0.0)
        s = np.sort(np.asarray(self.samples))
        return np.searchsorted(s, x, side="right") / len(s)

    def ppf(self, p: float) -> float:
        from wansim.numerics import normal_functions as nf  # only here: relays sample without scipy

        if self.kind == "none":
            return 0.0
        if self.kind == "normal":
            mean, std = self.params
            return float(nf.norm_ppf(p, mean, std))
        if self.kind == "lognormal":
            mu, sigma = self.params
            return float(nf.lognorm_ppf(p, sigma, np.exp(mu)))
        if self.kind == "pareto":
            shape, scale = self.params
            return float(scale * ((1.0 - p) ** (-1.0 / shape) - 1.0))
        return float(np.quantile(np.asarray(self.samples), p))

    def var(self) -> float:
        if self.kind == "none":
            return 0.0
        if self.kind == "normal":
            return self.params[1] ** 2
        if self.kind == "lognormal":
            mu, sigma = self.params
            return float((np.exp(sigma**2) - 1.0) * np.exp(2 * mu + sigma**2))
        if self.kind == "pareto":
            shape, scale = self.params
            return scale**2 * shape / ((shape - 1.0) ** 2 * (shape - 2.0))
        return float(np.var(self.samples))

    def can_be_negative(self) -> bool:
        return self.kind == "normal" or (self.kind == "empirical" and min(self.samples) < 0)

    def mean_propagation_ms(self, latency_ms) -> np.ndarray:
        """E[max(0, L + J)] for latency arrays L."""
        from wansim.numerics import normal_functions as nf  # only here: relays sample without scipy

        latency = np.asarray(latency_ms, dtype=float)
        if not self.can_be_negative():
            return latency + self.mean()
        if self.kind == "normal":
            mean, std = self.params
            mu = latency + mean
            return mu * nf.norm_cdf(mu / std) + std * nf.norm_pdf(mu / std)
        s = np.sort(np.asarray(self.samples, dtype=float))
        tail = np.concatenate([np.cumsum(s[::-1])[::-1], [0.0]])  # sum of s[i:]
        idx = np.searchsorted(s, -latency, side="right")
        count = len(s) - idx
        return (count * latency + tail[idx]) / len(s)

    def var_propagation_ms(self, latency_ms) -> np.ndarray:
        """Var[max(0, L + J)] for latency arrays L."""
        from wansim.numerics import normal_functions as nf  # only here: relays sample without scipy

        latency = np.asarray(latency_ms, dtype=float)
        if not self.can_be_negative():
            return np.full(latency.shape, self.var())
        if self.kind == "normal":
            mean, std = self.params
            mu = latency + mean
            a = mu / std
            m1 = mu * nf.norm_cdf(a) + std * nf.norm_pdf(a)
            m2 = (mu**2 + std**2) * nf.norm_cdf(a) + mu * std * nf.norm_pdf(a)
            return np.maximum(m2 - m1**2, 0.0)
        s = np.asarray(self.samples, dtype=float)
        d = np.maximum(0.0, latency[..., None] + s)
        return d.var(axis=-1)


def jitter_dist(spec) -> JitterDist:
    """The distribution of a ``wansim.config.network.Jitter`` (or anything with its fields)."""
    return _jitter_dist(spec)


@lru_cache(maxsize=256)
def _jitter_dist(spec) -> JitterDist:
    if spec.kind == "none":
        return JitterDist("none")
    if spec.kind == "normal":
        return JitterDist("normal", (spec.mean_ms or 0.0, spec.std_ms))
    if spec.kind == "lognormal":
        mean = spec.std_ms if spec.mean_ms is None else spec.mean_ms
        sigma2 = np.log1p((spec.std_ms / mean) ** 2)
        return JitterDist("lognormal", (float(np.log(mean) - sigma2 / 2), float(np.sqrt(sigma2))))
    if spec.kind == "pareto":
        a = spec.shape
        scale = spec.std_ms * (a - 1.0) * np.sqrt((a - 2.0) / a)
        return JitterDist("pareto", (a, float(scale)))
    samples = spec.samples_ms or read_samples(spec.samples_file)
    return JitterDist("empirical", samples=tuple(float(x) for x in samples))


def read_samples(path: str | Path | None, where: str = "network.jitter.samples_file") -> tuple:
    """Delays in ms, one per line (blank lines and # comments skipped): finite numbers within
    the schema's magnitude limit (:data:`wansim.config.validation.MAX_MAGNITUDE`)."""
    from wansim.config.user_yaml import read_text
    from wansim.config.validation import MAX_MAGNITUDE

    p = Path(str(path))
    if not is_file(p):
        raise ScenarioError(where, "file not found", str(path))
    out = []
    for i, line in enumerate(read_text(p, where).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            value = float(line)
        except ValueError:
            raise ScenarioError(where, f"line {i} is not a number", line[:40]) from None
        if not abs(value) <= MAX_MAGNITUDE:
            raise ScenarioError(
                where, f"line {i} must be a finite number of magnitude <= {MAX_MAGNITUDE:g}", value
            )
        out.append(value)
    if not out:
        raise ScenarioError(where, "has no samples", str(path))
    return tuple(out)
