"""Head-of-line blocking on an in-order link: the wait for earlier messages to be delivered.

A link delivers in send order (``wansim.sim.link``: delivery = max(own delivery, the previous
message's)): a message whose predecessor drew a longer delay (a retransmission, a jitter
spike) waits for it. With messages offered as a Poisson stream of rate lambda and delays X
i.i.d. (propagation plus jitter plus retransmissions; serialisation queues separately), a
message of delay x is held R = max(0, max_j (a_j + X_j) - (a_i + x)) over the earlier ones,

    P(R <= t | x) = exp(-lambda E[(X - x - t)^+])     (the M/G/inf resequencing law)
    E[R] = E_x int_x^inf (1 - exp(-lambda psi(y))) dy,   psi(y) = E[(X - y)^+].

One loss (probability q, RTO c) at rate lambda q blocks the link ~c; every message offered
meanwhile waits ~c / 2: E[R] ~ lambda q c^2 / 2 while that is small, which the M/D/1 queue of
the serialisation alone never sees.
"""

from __future__ import annotations

import numpy as np

from wansim.links.expected_delay import jitter_dist

JITTER_ATOMS = 8  # quantile midpoints of the jitter
MAX_LOSSES = 3  # retransmissions per message followed one by one (the rest folded into 3)
GRID = 96


def delay_atoms(latency_ms, jitter, loss_rate, retransmit_ms, ser_ms) -> tuple:
    """(values, weights) of a message's delay on one hop, atoms on the last axis: propagation
    max(0, L + J) at JITTER_ATOMS jitter quantiles times G (ser + rto) for G = 0..MAX_LOSSES
    lost transmissions (P(G = g) = q^g (1 - q), the tail folded into the last)."""
    dist = jitter_dist(jitter)
    if jitter.kind == "none":
        j = np.zeros(1)
    else:
        j = np.array([dist.ppf((i + 0.5) / JITTER_ATOMS) for i in range(JITTER_ATOMS)])
    prop = np.maximum(np.asarray(latency_ms, dtype=float)[..., None] + j, 0.0)  # (..., J)
    q = np.asarray(loss_rate, dtype=float)[..., None]
    g = np.arange(MAX_LOSSES + 1)
    pg = q**g * (1.0 - q)
    pg = np.concatenate([pg[..., :-1], 1.0 - pg[..., :-1].sum(-1, keepdims=True)], axis=-1)
    step = (np.asarray(ser_ms, dtype=float) + np.asarray(retransmit_ms, dtype=float))[..., None]
    extra = g * step  # (..., G)
    values = prop[..., :, None] + extra[..., None, :]
    weights = np.broadcast_to(pg[..., None, :] / len(j), values.shape)
    shape = np.broadcast_shapes(values.shape, weights.shape)
    values = np.broadcast_to(values, shape).reshape(*shape[:-2], -1)
    weights = np.broadcast_to(weights, shape).reshape(*shape[:-2], -1)
    return values, weights


def resequencing_wait_ms(rate_per_ms, values, weights) -> np.ndarray:
    """E[R] (module docstring) for Poisson offers at ``rate_per_ms`` (...) and delay atoms
    ``values``/``weights`` (..., A)."""
    values = np.asarray(values, dtype=float)
    weights = np.asarray(weights, dtype=float)
    rate = np.asarray(rate_per_ms, dtype=float)
    lead = np.broadcast_shapes(rate.shape, values.shape[:-1], weights.shape[:-1])
    values = np.broadcast_to(values, (*lead, values.shape[-1]))
    weights = np.broadcast_to(weights, (*lead, weights.shape[-1]))
    rate = np.broadcast_to(rate, lead)
    lo, hi = values.min(axis=-1), values.max(axis=-1)
    span = hi - lo
    if not np.any(span > 0) or not np.any(rate > 0):
        return np.zeros(np.broadcast_shapes(rate.shape, lo.shape))
    t = np.linspace(0.0, 1.0, GRID)
    y = lo[..., None] + span[..., None] * t  # (..., G)
    psi = (weights[..., None, :] * np.maximum(values[..., None, :] - y[..., :, None], 0.0)).sum(-1)
    f = 1.0 - np.exp(-rate[..., None] * psi)
    dy = span[..., None] / (GRID - 1)
    seg = 0.5 * (f[..., 1:] + f[..., :-1]) * dy
    tail = np.concatenate([np.cumsum(seg[..., ::-1], axis=-1)[..., ::-1], 0.0 * seg[..., :1]], -1)
    # F(x) = int_x^hi f: linear interpolation on the uniform grid at each atom
    pos = np.where(
        span[..., None] > 0, (values - lo[..., None]) / np.maximum(span, 1e-300)[..., None], 0.0
    )
    pos = pos * (GRID - 1)
    i = np.clip(np.floor(pos).astype(np.int64), 0, GRID - 2)
    frac = pos - i
    at = np.take_along_axis(tail, i, -1) * (1 - frac) + np.take_along_axis(tail, i + 1, -1) * frac
    return (weights * at).sum(axis=-1)


def ring_hol_ms(scenario, rate_per_ms, fwd_bytes, ret_bytes, *, lossy_only=False) -> np.ndarray:
    """Sum over the ring's hops (forward hops with ``fwd_bytes`` messages, the return hop
    with ``ret_bytes``) of the resequencing wait at ``rate_per_ms`` offered messages; hops
    without jitter or loss add nothing (``lossy_only``: hops without loss add nothing)."""
    from wansim.analytical.path import hop_bytes
    from wansim.links.wire_bytes import serialise_ms

    net = scenario.network
    if net.hops or isinstance(fwd_bytes, tuple):
        links = [
            (h.latency_ms, h.bandwidth_mbps, h.jitter, h.loss_rate, h.retransmit_ms)
            for h in scenario.resolved_hops()
        ]
        counts = [1.0] * len(links)
    else:
        one = (net.latency_ms, net.bandwidth_mbps, net.jitter, net.loss_rate, net.retransmit_ms)
        links = [one, one]
        counts = [np.asarray(scenario.stages) - 1.0, 1.0]  # the forward hops, the return hop
    total = np.zeros(np.shape(rate_per_ms))
    for i, ((lat, bw, jit, loss, rto), count) in enumerate(zip(links, counts, strict=True)):
        if not np.any(np.asarray(loss) > 0) and (lossy_only or jit.kind == "none"):
            continue
        n_bytes = ret_bytes if i == len(links) - 1 else hop_bytes(fwd_bytes, i)
        values, weights = delay_atoms(lat, jit, loss, rto, serialise_ms(n_bytes, bw))
        total = total + count * resequencing_wait_ms(rate_per_ms, values, weights)
    return total
