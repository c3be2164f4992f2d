"""Deterministic service times along the pipe, per station (shared by the ring of concurrent
requests and the convoys of continuous batching).

A station is a stage (compute of the pass's tokens) or a hop (serialisation of the message,
times 1 + E[losses] for retransmissions). Propagation is not a service: it delays a message
without holding the station, so it cancels between two messages on the same path.
"""

from __future__ import annotations

import numpy as np

from wansim.links.delivery import busy_ms
from wansim.links.expected_delay import expected_losses
from wansim.stages.compute import mean_stage_ms, stage_ms_each, stages_differ


def stage_services_ms(scenario, n_tokens, n_stations: int, sequences=1) -> list[np.ndarray]:
    """Compute ms of a pass of ``n_tokens`` over ``sequences`` sequences at stages 0 ..
    n_stations - 1 (each stage's own model with ``model.stage_compute``, else the one model;
    ``stages`` may then be an array and ``n_stations`` its maximum)."""
    if stages_differ(scenario):
        return [
            np.asarray(x, dtype=float)
            for x in stage_ms_each(scenario, n_tokens, sequences=sequences)
        ]
    one = np.asarray(mean_stage_ms(scenario, n_tokens, sequences), dtype=float)  # all alike
    return [one] * n_stations


def hop_service_ms(scenario, hop: int, n_bytes) -> np.ndarray:
    """Expected time an ``n_bytes`` message holds hop ``hop``'s sender (the shared rule's
    :func:`wansim.links.delivery.busy_ms` at E[losses]: retransmissions included)."""
    net = scenario.network
    h = scenario.resolved_hops()[hop] if net.hops else net
    n = np.asarray(n_bytes, dtype=float)
    bw = np.asarray(h.bandwidth_mbps, dtype=float)
    return busy_ms(n, bw, h.per_message_ms, h.codec_ms_per_mb, expected_losses(h.loss_rate))


def hop_bytes(sizes, hop: int):
    """Forward hop ``hop``'s message size from ``sizes``: one per hop (a tuple, with
    ``payload.extra_tensors``) or the one size every hop carries."""
    return sizes[hop] if isinstance(sizes, tuple) else sizes


def per_hop(sizes, fn):
    """``fn`` of each forward hop's message size in ``sizes`` (a tuple, one per hop, with
    ``payload.extra_tensors``), or of the one size every hop carries."""
    return tuple(fn(x) for x in sizes) if isinstance(sizes, tuple) else fn(sizes)


def ring_sums(scenario, fn, n_bytes_fwd, n_bytes_ret) -> tuple[np.ndarray, np.ndarray]:
    """(sum over the forward hops of fn(link, n_bytes_fwd), fn(return link, n_bytes_ret)), with
    link a resolved ``Hop`` hop by hop when per-hop overrides are given, else the one
    ``Network`` (the same field names; ``stages`` may then be an array). ``n_bytes_fwd`` may
    be a tuple, one size per forward hop (``payload.extra_tensors``: scalar ``stages``)."""
    net = scenario.network
    per_hop = isinstance(n_bytes_fwd, tuple)
    if net.hops or per_hop:
        links = scenario.resolved_hops()
        sizes = n_bytes_fwd if per_hop else (n_bytes_fwd,) * (len(links) - 1)
        fwd = sum(
            (fn(link, n) for link, n in zip(links[:-1], sizes, strict=True)), start=np.zeros(())
        )
        return fwd, fn(links[-1], n_bytes_ret)
    return (np.asarray(scenario.stages) - 1) * fn(net, n_bytes_fwd), fn(net, n_bytes_ret)
