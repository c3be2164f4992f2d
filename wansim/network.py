"""Link physics shared by both engines: jitter distributions, loss, one-way delivery time.

A message of b bytes offered to a hop at time t (link free from f) is modelled as

    start    = max(t, f)                       FIFO: it waits for the link (TCP)
    busy     = (1 + G) * b*8/B                 serialisation occupies the link (retransmissions too)
    delivery = start + busy + G * rto + D      propagation does not occupy the link
    delivery = max(delivery, previous delivery on this hop)      no overtaking

with D = max(0, L + J) the propagation delay (latency L plus jitter J) and G ~ Geometric the
number of lost transmissions (P(G = g) = q^g (1 - q), loss rate q, each loss costs ``rto``).
Without queueing the expected one-way time is

    E[T_hop] = (b*8/B) / (1 - q) + rto * q / (1 - q) + E[max(0, L + J)].
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import numpy as np

from wansim import normal_functions as nf
from wansim.errors import ScenarioError
from wansim.scenario import Hop, Jitter
from wansim.wire import serialise_ms


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


def jitter_dist(spec: Jitter) -> JitterDist:
    return _jitter_dist(spec)


@lru_cache(maxsize=256)
def _jitter_dist(spec: Jitter) -> JitterDist:
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


def read_samples(path: str | None) -> tuple[float, ...]:
    """Delays in ms, one per line (blank lines and # comments skipped)."""
    p = Path(str(path))
    if not p.is_file():
        raise ScenarioError("network.jitter.samples_file", "file not found", str(path))
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            out.append(float(line))
        except ValueError:
            raise ScenarioError(f"{path}:{i}", "not a number", line) from None
    if not out:
        raise ScenarioError("network.jitter.samples_file", "has no samples", str(path))
    return tuple(out)


def sample_losses(rng: np.random.Generator, loss_rate: float, size: int) -> np.ndarray:
    """Lost transmissions before success: P(G = g) = q^g (1 - q)."""
    if loss_rate <= 0:
        return np.zeros(size, dtype=np.int64)
    return rng.geometric(1.0 - loss_rate, size) - 1


def expected_losses(loss_rate) -> np.ndarray:
    q = np.asarray(loss_rate, dtype=float)
    return q / (1.0 - q)


def hop_mean_ms(
    latency_ms, bandwidth_mbps, jitter: Jitter, loss_rate, retransmit_ms, n_bytes
) -> np.ndarray:
    """Expected one-way time of an ``n_bytes`` message on an idle hop (see module docstring):
    serialisation + propagation + E[G] (ser + rto)."""
    ser = serialise_ms(n_bytes, bandwidth_mbps)
    extra = expected_losses(loss_rate)
    propagation = jitter_dist(jitter).mean_propagation_ms(latency_ms)
    return ser * (1.0 + extra) + np.asarray(retransmit_ms) * extra + propagation


def hop_var_ms(latency_ms, bandwidth_mbps, jitter: Jitter, loss_rate, retransmit_ms, n_bytes):
    """Variance of the one-way time on an idle hop: propagation jitter plus the retransmission
    delay's (``delay_var_ms2`` of :func:`loss_terms_ms`)."""
    loss = loss_terms_ms(loss_rate, retransmit_ms, bandwidth_mbps, n_bytes)
    return jitter_dist(jitter).var_propagation_ms(latency_ms) + loss["delay_var_ms2"]


def loss_terms_ms(loss_rate, retransmit_ms, bandwidth_mbps, n_bytes) -> dict[str, np.ndarray]:
    """One message's lost transmissions G (geometric, P(G = g) = q^g (1 - q)) and the delay
    they add, D = G c with c = ser + rto: E[G] = q / (1 - q), Var G = q / (1 - q)^2,
    E[D] = c E[G], Var D = c^2 Var G."""
    q = np.asarray(loss_rate, dtype=float)
    c = serialise_ms(n_bytes, bandwidth_mbps) + np.asarray(retransmit_ms)
    mean, var = expected_losses(q), q / (1.0 - q) ** 2
    return {
        "count_mean": mean,
        "count_var": var,
        "delay_mean_ms": c * mean,
        "delay_var_ms2": c**2 * var,
    }


def hop_mean(hop: Hop, n_bytes) -> np.ndarray:
    return hop_mean_ms(
        hop.latency_ms, hop.bandwidth_mbps, hop.jitter, hop.loss_rate, hop.retransmit_ms, n_bytes
    )


def hop_var(hop: Hop, n_bytes) -> np.ndarray:
    return hop_var_ms(
        hop.latency_ms, hop.bandwidth_mbps, hop.jitter, hop.loss_rate, hop.retransmit_ms, n_bytes
    )
