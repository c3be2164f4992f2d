"""Expected link times for the analytical engine, from the shared rule of
:mod:`wansim.links.delivery` (one message on one hop) and its draws (:mod:`wansim.links.draws`).

On an idle hop, with G the lost transmissions (E[G] = q / (1 - q) for a loss rate q), a message
of b bytes takes

    E[T_hop] = busy(E[G]) + rto * E[G] + E[max(0, L + J)],
    busy(g) = per_message_ms + codec_ms_per_mb * b / 1e6 + (1 + g) * b*8/B

(a retransmission pays serialisation again and waits ``rto``). The jitter distributions and
the loss sampler live in :mod:`wansim.links`; they are re-exported here for existing callers.
"""

from __future__ import annotations

import numpy as np

from wansim.config.network import Hop, Jitter
from wansim.links.delivery import busy_ms
from wansim.links.draws import sample_losses
from wansim.links.jitter import JitterDist, jitter_dist, read_samples
from wansim.links.wire_bytes import serialise_ms

__all__ = [
    "JitterDist",
    "expected_losses",
    "hop_mean",
    "hop_mean_ms",
    "hop_var",
    "hop_var_ms",
    "jitter_dist",
    "loss_terms_ms",
    "read_samples",
    "sample_losses",
]


def expected_losses(loss_rate) -> np.ndarray:
    q = np.asarray(loss_rate, dtype=float)
    return q / (1.0 - q)


def hop_mean_ms(
    latency_ms,
    bandwidth_mbps,
    jitter: Jitter,
    loss_rate,
    retransmit_ms,
    n_bytes,
    per_message_ms=0.0,
    codec_ms_per_mb=0.0,
) -> np.ndarray:
    """Expected one-way time of an ``n_bytes`` message on an idle hop (module docstring):
    software + serialisation + propagation + E[G] (ser + rto)."""
    extra = expected_losses(loss_rate)
    propagation = jitter_dist(jitter).mean_propagation_ms(latency_ms)
    n = np.asarray(n_bytes, dtype=float)
    bw = np.asarray(bandwidth_mbps, dtype=float)
    busy = busy_ms(n, bw, np.asarray(per_message_ms), np.asarray(codec_ms_per_mb), extra)
    return busy + np.asarray(retransmit_ms) * extra + propagation


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
    """:func:`hop_mean_ms` of a resolved ``Hop`` (or the ``Network``: the same field names)."""
    return hop_mean_ms(
        hop.latency_ms,
        hop.bandwidth_mbps,
        hop.jitter,
        hop.loss_rate,
        hop.retransmit_ms,
        n_bytes,
        hop.per_message_ms,
        hop.codec_ms_per_mb,
    )


def hop_var(hop: Hop, n_bytes) -> np.ndarray:
    return hop_var_ms(
        hop.latency_ms, hop.bandwidth_mbps, hop.jitter, hop.loss_rate, hop.retransmit_ms, n_bytes
    )
