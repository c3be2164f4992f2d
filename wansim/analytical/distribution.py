"""Lap and TPOT percentiles (one scenario at a time).

Lap: T_lap = C + sum_h R_h with C the deterministic part (compute, drafting, serialisation) and
R_h = max(0, L_h + J_h) + G_h (ser_h + rto) the random part of hop h (propagation with jitter,
retransmissions). The R_h are independent; their densities are discretised on a common grid and
convolved by FFT, and percentiles are read off the cumulative sum (resolution: the grid step,
reported as ``lap_grid_ms``).

TPOT of a request (decode time / M): given difficulty Z it is approximately normal with mean
E[N_Z] E[T] / M and variance (E[T]^2 Var N_Z + E[N_Z] Var T) / M^2 (renewal CLT for N, the lap
times independent of acceptance in the sync schedule); percentiles come from the mixture over
the difficulty quadrature.
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np

from wansim.config.network import Hop
from wansim.links.delivery import software_ms
from wansim.links.expected_delay import jitter_dist
from wansim.links.wire_bytes import serialise_ms
from wansim.numerics import normal_functions as nf

GRID_POINTS = 1 << 15
MAX_SHIFTED_POINTS = 1 << 20  # shifted_mixture's grid (coarsened beyond)
TAIL = 1e-7
NEGLIGIBLE = 1e-12  # probability below which shifted_mixture drops a shift


def _loss_terms(hop: Hop) -> tuple[np.ndarray, np.ndarray]:
    """Numbers of losses g = 0..G with their probabilities (truncated at mass TAIL)."""
    q = hop.loss_rate
    if q <= 0:
        return np.zeros(1, dtype=int), np.ones(1)
    g_max = int(np.ceil(np.log(TAIL) / np.log(q)))
    g = np.arange(g_max + 1)
    p = q**g * (1 - q)
    return g, p / p.sum()


def _span(hop: Hop, ser: float) -> float:
    jitter = jitter_dist(hop.jitter)
    hi = max(0.0, hop.latency_ms + jitter.ppf(1 - TAIL))
    g, _ = _loss_terms(hop)
    return hi + g[-1] * (ser + hop.retransmit_ms)


def _hop_pmf(hop: Hop, ser: float, dt: float, size: int) -> np.ndarray:
    """Probability of R_h in bins [i dt - dt/2, i dt + dt/2) (bin 0 holds the mass at 0)."""
    jitter = jitter_dist(hop.jitter)
    edges = (np.arange(size + 1) - 0.5) * dt
    cdf = np.where(edges >= 0, jitter.cdf(edges - hop.latency_ms), 0.0)
    cdf[-1] = 1.0
    prop = np.diff(cdf)
    g, pg = _loss_terms(hop)
    if len(g) == 1:
        return prop
    out = np.zeros(size)
    for gi, pi in zip(g, pg, strict=True):
        shift = round(gi * (ser + hop.retransmit_ms) / dt)
        if shift < size:
            out[shift:] += pi * prop[: size - shift]
    return out


def _stage_cdf(term, t):
    """P(c X Y <= t) for a slowed stage's pass (:mod:`wansim.stages.slowdown`): Y = s with probability
    f (episodes: the stationary share), X the noise."""
    c, kind, cv, f, s = term
    x_cdf = noise_dist(kind, cv).cdf if kind != "none" else (lambda x: (x >= 1.0) * 1.0)
    t = np.asarray(t, dtype=float)
    return (1.0 - f) * x_cdf(t / c) + f * x_cdf(t / (c * s))


def _stage_span(term) -> float:
    c, kind, cv, f, s = term
    top = noise_dist(kind, cv).ppf(1 - TAIL) if kind != "none" else 1.0
    return c * top * (s if f else 1.0)


def _stage_pmf(term, dt: float, size: int) -> np.ndarray:
    edges = (np.arange(size + 1) - 0.5) * dt
    cdf = np.where(edges >= 0, _stage_cdf(term, np.maximum(edges, 0.0)), 0.0)
    cdf[-1] = 1.0
    return np.diff(cdf)


@functools.lru_cache(maxsize=64)
def noise_dist(kind: str, cv: float):
    """X of :mod:`wansim.stages.slowdown` as a frozen scipy distribution (mean 1, CV ``cv``),
    built once per (kind, cv): freezing costs ~1 ms, and only its cdf and ppf are used."""
    from scipy import stats

    if kind == "lognormal":
        sigma = float(np.sqrt(np.log1p(cv * cv)))
        return stats.lognorm(sigma, scale=float(np.exp(-sigma * sigma / 2)))
    return stats.gamma(1.0 / (cv * cv), scale=cv * cv)


def lap_distribution(
    hops: list[Hop], message_bytes: list[float], constant_ms: float, stage_terms=()
) -> tuple[np.ndarray, np.ndarray, float]:
    """(lap values in ms, probabilities, grid step) for the given hops and message sizes;
    ``stage_terms``: the slowed stages' passes (c, noise kind, cv, f, s), each an independent
    random term c X Y (:mod:`wansim.stages.slowdown`) on top of ``constant_ms``."""
    sers = [
        float(serialise_ms(b, h.bandwidth_mbps)) for h, b in zip(hops, message_bytes, strict=True)
    ]
    software = [
        float(software_ms(b, h.per_message_ms, h.codec_ms_per_mb))
        for h, b in zip(hops, message_bytes, strict=True)
    ]
    constant = constant_ms + sum(sers) + sum(software)
    random_hops = [
        (h, s)
        for h, s in zip(hops, sers, strict=True)
        if h.jitter.kind != "none" or h.loss_rate > 0
    ]
    fixed_latency = sum(h.latency_ms for h in hops if h.jitter.kind == "none" and h.loss_rate <= 0)
    constant += fixed_latency
    if not random_hops and not stage_terms:
        return np.array([constant]), np.ones(1), 0.0
    span = sum(_span(h, s) for h, s in random_hops) + sum(_stage_span(t) for t in stage_terms)
    dt = max(span * 1.05 / GRID_POINTS, 1e-6)
    size = GRID_POINTS
    nfft = 2 * size
    spectrum = np.ones(nfft // 2 + 1, dtype=complex)
    # identical hops (the usual uniform ring) share one transform: work O(distinct hops)
    for (h, s), count in Counter(random_hops).items():
        spectrum *= np.fft.rfft(_hop_pmf(h, s, dt, size), nfft) ** count
    for term, count in Counter(stage_terms).items():
        spectrum *= np.fft.rfft(_stage_pmf(term, dt, size), nfft) ** count
    pmf = np.fft.irfft(spectrum, nfft)[:size]
    pmf = np.clip(pmf, 0.0, None)
    pmf /= pmf.sum()
    values = constant + np.arange(size) * dt
    return values, pmf, dt


def quantiles(values: np.ndarray, pmf: np.ndarray, qs) -> np.ndarray:
    """Quantiles of a discrete distribution (linear interpolation within a bin)."""
    if len(values) == 1:
        return np.full(len(np.atleast_1d(qs)), values[0])
    cdf = np.cumsum(pmf)
    dt = values[1] - values[0]
    out = []
    for q in np.atleast_1d(qs):
        i = int(np.searchsorted(cdf, q))
        i = min(i, len(values) - 1)
        below = cdf[i - 1] if i > 0 else 0.0
        frac = (q - below) / pmf[i] if pmf[i] > 0 else 0.5
        out.append(values[i] - dt / 2 + frac * dt)
    return np.array(out)


def mean_var(values: np.ndarray, pmf: np.ndarray) -> tuple[float, float]:
    mean = float(values @ pmf)
    return mean, float(((values - mean) ** 2) @ pmf)


def mixture_normal_quantiles(weights, means, sds, qs) -> np.ndarray:
    """Quantiles of sum_j w_j N(mean_j, sd_j^2) (point masses where sd_j = 0)."""
    weights = np.asarray(weights, dtype=float)
    means = np.asarray(means, dtype=float)
    sds = np.maximum(np.asarray(sds, dtype=float), 1e-12 * np.maximum(1.0, np.abs(means)))

    def cdf(x: float) -> float:
        return float(weights @ nf.norm_cdf((x - means) / sds))

    from wansim.numerics.brentq import (
        brentq,
    )  # scipy.optimize.brentq to the bit, without its import

    lo = float((means - 12 * sds).min())
    hi = float((means + 12 * sds).max())
    return np.array(
        [brentq(lambda x, q=q: cdf(x) - q, lo, hi, xtol=1e-9) for q in np.atleast_1d(qs)]
    )


def one_atom_if_unresolved(values: np.ndarray, pmf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """X as one atom at its mean where its uniform grid's spacing is below the float resolution
    of its values (laps of ~1e13 ms: values[1] - values[0] is 0), on which no grid of shifts or
    waits can be built; else X as it is."""
    if len(values) > 1 and not values[1] - values[0] > 0:
        mass = float(np.sum(pmf))
        return np.array([float(np.dot(values, pmf)) / mass]), np.array([mass])
    return values, pmf


def shifted_mixture(
    values: np.ndarray, pmf: np.ndarray, shifts_ms, weights
) -> tuple[np.ndarray, np.ndarray]:
    """The distribution of X + D, D independent of X taking ``shifts_ms`` (>= 0) with
    ``weights`` (the rest of the mass at 0), on X's uniform grid extended to the largest
    shift (each shift rounded to the grid); X's grid is coarsened (bins summed) where that
    would exceed ``MAX_SHIFTED_POINTS``. Shifts of weight below ``NEGLIGIBLE`` are dropped
    (they would only coarsen the grid)."""
    keep = np.asarray(weights, dtype=float) > NEGLIGIBLE
    shifts_ms = np.asarray(shifts_ms, dtype=float)[keep]
    weights = np.asarray(weights, dtype=float)[keep]
    values, pmf = one_atom_if_unresolved(np.asarray(values, dtype=float), np.asarray(pmf))
    if len(values) == 1 and not len(shifts_ms):
        return values, pmf
    if len(values) == 1:
        atoms = np.concatenate([[0.0], np.asarray(shifts_ms, dtype=float)]) + values[0]
        mass = np.concatenate([[1.0 - np.sum(weights)], np.asarray(weights, dtype=float)])
        dt = max(float(np.max(atoms) - np.min(atoms)) / 1024, 1e-9)
        # (a grid by index: arange(v0, v0 + dt, dt) is empty where v0 + dt rounds to v0)
        grid = values[0] + dt * np.arange(int(np.rint((np.max(atoms) - values[0]) / dt)) + 1)
        out = np.zeros(len(grid))
        np.add.at(out, np.rint((atoms - values[0]) / dt).astype(int), mass)
        return grid, out
    dt = values[1] - values[0]
    # bounded work: where the largest shift is many grids long, coarsen X's grid first
    span = len(pmf) + float(np.max(shifts_ms, initial=0.0)) / dt
    factor = int(np.ceil(span / MAX_SHIFTED_POINTS))
    if factor > 1:
        pmf = np.bincount(np.arange(len(pmf)) // factor, weights=pmf)
        values = values[0] + (factor - 1) * dt / 2 + factor * dt * np.arange(len(pmf))
        dt *= factor
    steps = np.rint(np.asarray(shifts_ms, dtype=float) / dt).astype(int)
    top = int(steps.max(initial=0))
    out = np.zeros(len(pmf) + top)
    out[: len(pmf)] += (1.0 - float(np.sum(weights))) * pmf
    for step, w in zip(steps, weights, strict=True):
        out[step : step + len(pmf)] += w * pmf
    return values[0] + dt * np.arange(len(out)), out


MAX_WAIT_POINTS = 1 << 16  # with_waits' grid (coarsened beyond)


def with_waits(values: np.ndarray, pmf: np.ndarray, waits, shift_ms: float = 0.0):
    """The distribution of X + shift + sum_i W_i, the W_i independent of X and of each other,
    each 0 with probability 1 - p_i and uniform on [lo_i, hi_i] otherwise (``waits``: (p, lo,
    hi) triples), on X's uniform grid (coarsened where it would exceed ``MAX_WAIT_POINTS``; a
    single atom X gets a grid of 1/4096 of the waits' span)."""
    waits = [(p, lo, hi) for p, lo, hi in waits if p > NEGLIGIBLE and hi > 0]
    values = np.asarray(values, dtype=float) + shift_ms
    pmf = np.asarray(pmf, dtype=float)
    if not waits:
        return values, pmf
    extra = sum(hi for _, _, hi in waits)
    values, pmf = one_atom_if_unresolved(values, pmf)
    if len(values) == 1:
        dt = max(extra / 4096, 1e-9)
    else:
        dt = values[1] - values[0]
        factor = int(np.ceil((len(pmf) + extra / dt) / MAX_WAIT_POINTS))
        if factor > 1:
            pmf = np.bincount(np.arange(len(pmf)) // factor, weights=pmf)
            values = values[0] + (factor - 1) * dt / 2 + factor * dt * np.arange(len(pmf))
            dt *= factor
    out = pmf
    for p, lo, hi in waits:
        a, b = int(np.rint(lo / dt)), int(np.rint(hi / dt))
        part = np.zeros(b + 1)
        part[0] = 1.0 - p
        part[a : b + 1] += p / (b - a + 1)
        size = len(out) + len(part) - 1
        nfft = 1 << int(np.ceil(np.log2(size)))
        out = np.fft.irfft(np.fft.rfft(out, nfft) * np.fft.rfft(part, nfft), nfft)[:size]
        out = np.clip(out, 0.0, None)
    out /= out.sum()
    return values[0] + dt * np.arange(len(out)), out


def waits_variance(waits) -> float:
    """Var of sum_i W_i for :func:`with_waits`' (p, lo, hi) triples."""
    var = 0.0
    for p, lo, hi in waits:
        mean = p * (lo + hi) / 2
        var += p * (lo * lo + lo * hi + hi * hi) / 3 - mean * mean
    return var
