"""``network.transport: tcp`` in the analytical engine: the sync schedule, one request.

Each hop carries one message per lap, so its sender sees a periodic train of equal messages
offered one lap apart. Its busy time under the window (:class:`wansim.links.tcp.TcpSender`, the
code the DES and the emulator run) is that of the settled train
(:func:`wansim.links.tcp.periodic_busy_ms`); the extra over the ideal transport's serialisation
becomes the hop's per-message cost, and the ideal closed forms do the rest. The lap and the busy
times depend on each other (a longer lap lets the window restart), so the two are iterated to a
fixed point, starting from a cold connection (every frame from the initial window): a ring whose
frames restart stays cold, one whose window survives the lap warms up (the DES from its first
frame does the same). Scope: one request in the sync schedule, no loss (a loss's effect on the window of
later messages is not in the closed forms); the prefill message is given the verify message's
window regime (approximate TTFT). The rest is refused (use the DES).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from wansim.config.scenario import HopOverride, Scenario
from wansim.links.delivery import wire_ms
from wansim.links.tcp import periodic_busy_ms, tcp_params

ITERATIONS = 8


def tcp_as_ideal(scenario: Scenario, lap_ms, parts: dict) -> Scenario:
    """The ideal-transport scenario whose hops cost what TCP costs at a lap of ``lap_ms``."""
    from wansim.analytical.sync import ring_message_bytes

    net = scenario.network
    tcp = tcp_params(net)
    hops = scenario.resolved_hops()
    sizes = ring_message_bytes(scenario, parts)
    overrides = []
    for hop, size in zip(hops, sizes, strict=True):
        busy = periodic_busy_ms(
            tcp, hop.bandwidth_mbps, hop.latency_ms, hop.retransmit_ms, size, float(lap_ms)
        )
        extra = max(busy - float(wire_ms(size, hop.bandwidth_mbps)), 0.0)
        overrides.append(
            HopOverride(
                latency_ms=hop.latency_ms,
                bandwidth_mbps=hop.bandwidth_mbps,
                jitter=hop.jitter,
                loss_rate=hop.loss_rate,
                per_message_ms=hop.per_message_ms + extra,
                codec_ms_per_mb=hop.codec_ms_per_mb,
            )
        )
    network = dataclasses.replace(net, transport="ideal", hops=tuple(overrides))
    return dataclasses.replace(scenario, network=network)


def tcp_equivalent(scenario: Scenario, lap_of) -> Scenario:
    """Fixed point of lap -> TCP busy times -> lap; ``lap_of(scenario)`` is the ideal engine's
    mean lap and ``lap_parts`` its message sizes (``wansim.analytical.sync``)."""
    from wansim.analytical.sync import lap_parts

    parts = lap_parts(scenario)
    lap = math.inf  # a connection starts cold (cwnd = IW), as the DES's and a real one do
    out = scenario
    for _ in range(ITERATIONS):
        out = tcp_as_ideal(scenario, lap, parts)
        new = float(np.asarray(lap_of(out)))
        if math.isfinite(lap) and abs(new - lap) <= 1e-9 * max(lap, 1.0):
            break
        lap = new
    return out
