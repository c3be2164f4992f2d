"""Head-of-line blocking on an in-order link: the wait for earlier messages to be delivered.

A link delivers in send order (``wansim.sim.link``: delivery = max(own delivery, the previous
message's)): a message whose predecessor drew a longer delay (a retransmission, a jitter
spike) waits for it. With messages offered as a Poisson stream of rate lambda and delays X
i.i.d. (propagation plus jitter plus retransmissions; serialisation queues separately), a
message of delay x is held R = max(0, max_j (a_j + X_j) - (a_i + x)) over the earlier ones,

    P(R <= t | x) = exp(-lambda E[(X - x - t)^+])     (the M/G/inf resequencing law)
    E[R] = E_x int_x^inf (1 - exp(-lambda psi(y))) dy,   psi(y) = E[(X - y)^+],

X a set of atoms (:func:`delay_atoms`), over which psi is piecewise linear and the integral
exact (:class:`Resequencing`).

One loss (probability q, RTO c) at rate lambda q blocks the link ~c; every message offered
meanwhile waits ~c / 2: E[R] ~ lambda q c^2 / 2 while that is small, which the M/D/1 queue of
the serialisation alone never sees.
"""

from __future__ import annotations

import numpy as np

from wansim.links.expected_delay import jitter_dist

JITTER_ATOMS = 8  # quantile midpoints of the jitter
MAX_LOSSES = 3  # retransmissions per message followed one by one (the rest folded into 3)


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
    return Resequencing(values, weights)(rate_per_ms)


class Resequencing:
    """E[R] of one set of delay atoms as a function of the offered rate, exactly: psi is
    piecewise linear between the sorted atoms u_1 <= ... <= u_A (slope -S_k on [u_k, u_k+1],
    S_k the weight above u_k), so each segment integrates in closed form,

        int_{u_k}^{u_k+1} (1 - exp(-lambda psi)) dy
            = D_k - exp(-lambda psi(u_k+1)) (1 - exp(-lambda S_k D_k)) / (lambda S_k),

    D_k = u_k+1 - u_k, and E[R] = sum_k w_(k) F(u_k) with F(u_k) the segments above u_k.
    What does not depend on the rate (the order, psi at the atoms) is computed once, for the
    fixed points that call it at many rates (:mod:`wansim.analytical.concurrent`)."""

    def __init__(self, values, weights):
        values = np.asarray(values, dtype=float)
        weights = np.asarray(weights, dtype=float)
        lead = np.broadcast_shapes(values.shape[:-1], weights.shape[:-1])
        values = np.broadcast_to(values, (*lead, values.shape[-1]))
        weights = np.broadcast_to(weights, (*lead, weights.shape[-1]))
        order = np.argsort(values, axis=-1, kind="stable")
        u = np.take_along_axis(values, order, -1)
        self.w = np.take_along_axis(weights, order, -1)
        self.lead = lead
        above = np.cumsum(self.w[..., ::-1], axis=-1)[..., ::-1]  # weight at or above u_k
        self.slope = above[..., 1:]  # S_k: the weight above u_k on (u_k, u_k+1)
        self.gap = np.diff(u, axis=-1)  # D_k
        # psi(u_k) = sum_{j > k} w_j (u_j - u_k) = sum over the segments above of S_j D_j
        tail = np.cumsum((self.slope * self.gap)[..., ::-1], axis=-1)[..., ::-1]
        self.psi_next = np.concatenate([tail[..., 1:], np.zeros((*lead, 1))], -1)  # psi(u_k+1)
        self.flat = not np.any(self.gap > 0)

    def __call__(self, rate_per_ms) -> np.ndarray:
        rate = np.asarray(rate_per_ms, dtype=float)
        lead = np.broadcast_shapes(rate.shape, self.lead)
        if self.flat or not np.any(rate > 0):
            return np.zeros(lead)
        lam = np.broadcast_to(rate, lead)[..., None]
        x = lam * self.slope
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(x > 0, -np.expm1(-x * self.gap) / np.where(x > 0, x, 1.0), self.gap)
        seg = self.gap - np.exp(-lam * self.psi_next) * ratio
        above = np.cumsum(seg[..., ::-1], axis=-1)[..., ::-1]  # F(u_k), k < A; F(u_A) = 0
        return (self.w[..., :-1] * above).sum(axis=-1)


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
