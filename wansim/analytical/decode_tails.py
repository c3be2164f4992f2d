"""TPOT percentiles of a request (decode time / M): alone, under load, and over requests that
differ in length.

Model: a request of difficulty node z decodes in N_z passes; alone each lap has mean L_a and
the decode time is normal (renewal CLT) with mean t_z M and sd s_z M (per token: ``tpot_ms``,
``sd_ms``; :func:`wansim.analytical.distribution.mixture_normal_quantiles` over z). Under load
every lap also waits: the lap's mean becomes L (the loaded model's ``lap_ms_mean``), the
alone part stretched by L / L_a, plus independent waits of variance ``wait_var_ms2`` per lap,
so a node's TPOT has mean t_z L / L_a and variance (s_z L / L_a)^2 + N_z wait_var / M^2.

Requests that differ (lengths, acceptance rows: :mod:`wansim.analytical.mixture`): a request's
own lengths set its passes (M) but its waits come from the others in flight, whose lengths are
drawn from the whole workload - not from its own node (a node of long prompts analysed alone
is a pipe where every refill is a long prefill: its TPOT p99 was +121% to +159% against the
DES at 8 users). So each node keeps its own passes and lap alone, and takes the population's
wait: the mean wait per lap W = sum_i w_i P_i (L_i - L_a,i) / sum_i w_i P_i and the wait
variance per lap sum_i w_i P_i wait_var_i / sum_i w_i P_i (P_i the node's passes per request:
the laps of node i are that share of all laps). Both are exact averages when the waits are
convoys behind others' prefills arriving at a rate per lap (a compound count: its mean and
variance are linear in the mix of convoy sizes), the approximation being each node's own
wait model. The TPOT of the workload is the mixture over nodes and difficulty of these
normals.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.analytical.distribution import mixture_normal_quantiles


@dataclasses.dataclass(frozen=True)
class DecodeParts:
    """One node's decode time per token, by difficulty (module docstring)."""

    weights: np.ndarray  # difficulty nodes' weights
    tpot_ms: np.ndarray  # mean TPOT per difficulty node, alone
    sd_ms: np.ndarray  # its sd, alone
    lap_alone_ms: float  # the mean lap alone (L_a)
    lap_ms: float  # the mean lap under load (L)
    wait_var_ms2: float  # the independent waits' variance per lap
    decode_tokens: int  # M

    def passes(self) -> np.ndarray:
        """Passes per difficulty node (N_z = t_z M / L_a)."""
        return self.tpot_ms * self.decode_tokens / max(self.lap_alone_ms, 1e-300)

    def loaded(self, lap_ms: float, wait_var_ms2: float) -> tuple[np.ndarray, np.ndarray]:
        """(mean, sd) of TPOT per difficulty node at a loaded lap ``lap_ms`` with waits of
        variance ``wait_var_ms2`` per lap."""
        stretch = lap_ms / max(self.lap_alone_ms, 1e-300)
        m = self.decode_tokens
        sd = np.sqrt((self.sd_ms * stretch) ** 2 + self.passes() * wait_var_ms2 / m**2)
        return self.tpot_ms * stretch, sd


def loaded_tpot_quantiles(parts: DecodeParts, qs=(0.5, 0.99)) -> np.ndarray:
    """TPOT quantiles of one node under its own load (module docstring)."""
    mean, sd = parts.loaded(parts.lap_ms, parts.wait_var_ms2)
    return mixture_normal_quantiles(parts.weights, mean, sd, list(qs))


def population_tpot_quantiles(weighted: list[tuple[float, DecodeParts]], qs=(0.5, 0.99)):
    """TPOT quantiles over nodes that differ (module docstring): ``weighted`` is (request
    share, the node's parts) per node."""
    w = np.array([x for x, _ in weighted], dtype=float)
    w = w / w.sum()
    parts = [p for _, p in weighted]
    per_request = np.array([float(p.weights @ p.passes()) for p in parts])
    lap_share = w * per_request / float(w @ per_request)
    wait = float(lap_share @ np.array([p.lap_ms - p.lap_alone_ms for p in parts]))
    wait_var = float(lap_share @ np.array([p.wait_var_ms2 for p in parts]))
    weights, means, sds = [], [], []
    for wi, p in zip(w, parts, strict=True):
        mean, sd = p.loaded(p.lap_alone_ms + wait, wait_var)
        weights.append(wi * p.weights)
        means.append(mean)
        sds.append(sd)
    return mixture_normal_quantiles(
        np.concatenate(weights), np.concatenate(means), np.concatenate(sds), list(qs)
    )
