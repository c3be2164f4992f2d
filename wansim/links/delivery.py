"""The delivery rule of one message on one hop (the DES, the analytical engine and the emulator).

A message of ``b`` bytes is offered to hop h at time ``t``; the hop's sender is free from ``f``:

    start    = max(t, f)                                   FIFO: it waits for the sender (TCP)
    software = per_message_ms + codec_ms_per_mb * b / 1e6  framing, codec, sidecar: paid once
    wire     = b * 8 / B                                   one transmission's serialisation
    busy     = software + (1 + G) * wire                   every transmission occupies the link
    free     = start + busy                                the next message may start
    delivery = max(free + G * rto + max(0, L + J), previous delivery on this hop)

G is the number of lost transmissions of the message (geometric, P(G = g) = q^g (1 - q) for a
loss rate q), ``rto`` the wait before each retransmission, L the latency, J the jitter
(:mod:`wansim.links.draws` draws G and max(0, L + J) once per message, never per frame).
Propagation does not occupy the link: the next message may start as soon as ``free``. No
overtaking: a message is never delivered before the one sent before it.

A retransmission pays serialisation again. On a TCP-like link loss is recovered by sending the
lost bytes again: the copy crosses the same bottleneck, occupies it for its serialisation time
(delaying every message queued behind it) and the receiver cannot deliver the message until that
copy has arrived. Charging serialisation once would make a retransmission free of bandwidth,
which understates both the delay of the lost message and the queueing behind it exactly where
loss matters (a 100 kB activation at 40 Mbit/s serialises in 20 ms). The model loses whole
messages (one loss draw per message, as in the engines); real TCP re-sends only the lost
segment, so for messages of many segments at a per-packet loss rate this rule over-charges: set
``loss_rate`` to the per-message rate (about 1 - (1 - p)^segments for a packet loss rate p), or
use ``network.transport: tcp`` (:mod:`wansim.links.tcp`), where a loss re-sends one segment.

:class:`HopSender` holds a hop's state (``free``, the previous delivery, a TCP window, a drift)
and applies this rule per message; the DES link and the real-path emulator both call it.

With ``network.idle_cost`` the per-message cost adds the cost of a message after the sender
idled ``start - f`` ms (the first message: since 0; :mod:`wansim.stages.idle_cost`'s table).

The software cost is the sender's own work before the bytes go out; it occupies the sender (the
next message waits for it, as a single sender thread or sidecar process does) and is not paid
again by a retransmission (the transport re-sends bytes already framed and encoded).

Expected values on an idle hop (the analytical engine; G's mean is q / (1 - q)):

    E[busy]     = software + (1 + E[G]) * wire
    E[one-way]  = E[busy] + rto * E[G] + E[max(0, L + J)]
"""

from __future__ import annotations

import math

from wansim.links.nonstationary import Modulation, drift_factors  # noqa: F401 (drift_factors: API)


def wire_ms(n_bytes, bandwidth_mbps):
    """One transmission's serialisation: ``n_bytes`` at ``bandwidth_mbps`` Mbit/s (ms).
    Plain arithmetic: floats (DES, emulator) or numpy arrays (analytical) alike."""
    return n_bytes * 8.0 / (bandwidth_mbps * 1e3)


def software_ms(n_bytes, per_message_ms, codec_ms_per_mb):
    """The sender's fixed per-message cost plus its codec cost per 10^6 bytes (ms)."""
    return per_message_ms + codec_ms_per_mb * n_bytes / 1e6


def busy_ms(n_bytes, bandwidth_mbps, per_message_ms, codec_ms_per_mb, losses):
    """How long a message holds its hop's sender: software + (1 + losses) * wire (ms).
    ``losses`` is the message's count (DES, emulator) or its expectation (analytical: busy is
    linear in the count, so its expectation is exact)."""
    return software_ms(n_bytes, per_message_ms, codec_ms_per_mb) + wire_ms(
        n_bytes, bandwidth_mbps
    ) * (1.0 + losses)


class HopSender:
    """One hop's sender state and the rule above, one call per message: ``free_ms`` (when the
    sender may start the next message), ``last_delivery_ms`` (no overtaking), and with
    ``tcp`` (:class:`wansim.links.tcp.TcpParams`) a congestion window that replaces the ideal
    transport's ``(1 + G) * wire`` and ``G * rto`` (:mod:`wansim.links.tcp`)."""

    __slots__ = (
        "_lossless_busy",
        "bandwidth_mbps",
        "codec_ms_per_mb",
        "drift",
        "free_ms",
        "idle_extra",
        "last_delivery_ms",
        "last_idle_extra_ms",
        "latency_ms",
        "per_message_ms",
        "retransmit_ms",
        "tcp",
    )

    def __init__(
        self,
        bandwidth_mbps: float,
        per_message_ms: float,
        codec_ms_per_mb: float,
        retransmit_ms: float,
        latency_ms: float,
        tcp=None,
        drift=None,
        idle_extra=None,
    ):
        self.bandwidth_mbps = bandwidth_mbps
        self.latency_ms = latency_ms
        # time-varying links (wansim.links.nonstationary): a Modulation, a bare Drift, or None
        if drift is not None and not isinstance(drift, Modulation):
            drift = Modulation(drift)
        self.drift = drift
        self.per_message_ms = per_message_ms
        self.codec_ms_per_mb = codec_ms_per_mb
        self.retransmit_ms = retransmit_ms
        self.free_ms = 0.0
        self.last_delivery_ms = 0.0
        # a message after the sender idled costs more (network.idle_cost): idle ms -> extra
        # ms added to per_message_ms (wansim.stages.idle_cost), None when off
        self.idle_extra = idle_extra
        self.last_idle_extra_ms = 0.0
        self.tcp = None
        if tcp is not None:
            from wansim.links.tcp import TcpSender

            self.tcp = TcpSender(tcp, bandwidth_mbps, latency_ms, retransmit_ms)
        # n_bytes -> busy of a message without losses, where busy depends on nothing else (no
        # idle cost, drift or tcp): messages repeat their sizes
        plain = tcp is None and drift is None and idle_extra is None
        self._lossless_busy: dict[float, float] | None = {} if plain else None

    def send(
        self, offer_ms: float, n_bytes: float, losses: int, propagation: float
    ) -> tuple[float, float, float]:
        """(start, free, delivery) of a message offered at ``offer_ms`` with ``losses`` lost
        transmissions and propagation max(0, L + J) = ``propagation`` (ms). A drift or trace
        adds L * (latency factor - 1) to it (never below 0) and scales the bandwidth, at the
        message's start
        (the TCP window keeps the bandwidth it was built with: with tcp they change latency)."""
        start = self.free_ms if self.free_ms > offer_ms else offer_ms
        cache = self._lossless_busy
        if cache is not None and not losses:  # (the rule below, its busy memoised by size)
            busy = cache.get(n_bytes)
            if busy is None:
                busy = cache[n_bytes] = busy_ms(
                    n_bytes, self.bandwidth_mbps, self.per_message_ms, self.codec_ms_per_mb, 0
                )
            repair = 0.0
        else:
            busy, repair, propagation = self._busy_repair(start, n_bytes, losses, propagation)
        free = start + busy
        delivery = free + propagation + repair
        if delivery < self.last_delivery_ms:
            delivery = self.last_delivery_ms
        self.free_ms = free
        self.last_delivery_ms = delivery
        return start, free, delivery

    def window_idle_ms(self, offer_ms: float, n_bytes: float) -> float | None:
        """For a message offered at ``offer_ms``: how long its tcp window will have been idle
        when its bytes start (after its software cost), i.e. what decides the window's restart
        after idle (:meth:`wansim.links.tcp.TcpSender.idle_ms`); None without tcp or before the
        first send. No state changes."""
        tcp = self.tcp
        if tcp is None or tcp.last_sent_ms == -math.inf:
            return None
        start = self.free_ms if self.free_ms > offer_ms else offer_ms
        per_message = self.per_message_ms
        if self.idle_extra is not None:
            per_message = per_message + self.idle_extra(start - self.free_ms)
        return tcp.idle_ms(start + software_ms(n_bytes, per_message, self.codec_ms_per_mb))

    def _busy_repair(
        self, start: float, n_bytes: float, losses: int, propagation: float
    ) -> tuple[float, float, float]:
        """(busy, repair, propagation) of a message starting at ``start``: the per-message cost
        after an idle, a drift's latency and bandwidth then, the ideal transport's (1 + G)
        transmissions and G retransmission waits, or the tcp window's."""
        per_message = self.per_message_ms
        if self.idle_extra is not None:  # the sender idled since the previous message freed it
            self.last_idle_extra_ms = extra = self.idle_extra(start - self.free_ms)
            per_message = per_message + extra
        bandwidth = self.bandwidth_mbps
        if self.drift is not None:  # the hop as it is when the message starts
            lat_f, bw_f = self.drift.at(start)
            # (never below 0: a factor near 0 on a hop whose jitter draw clamped at 0)
            propagation = max(propagation + self.latency_ms * (lat_f - 1.0), 0.0)
            bandwidth *= bw_f
        if self.tcp is None:
            busy = busy_ms(n_bytes, bandwidth, per_message, self.codec_ms_per_mb, losses)
            repair = losses * self.retransmit_ms if losses else 0.0
        else:
            software = software_ms(n_bytes, per_message, self.codec_ms_per_mb)
            sent, repair = self.tcp.send(start + software, n_bytes, losses)
            busy = software + sent
        return busy, repair, propagation

    def wire_bytes(self, n_bytes: float, losses: int) -> float:
        """Bytes put on the wire: every transmission of the message (ideal), or the message and
        one re-sent segment per loss (tcp)."""
        if self.tcp is None:
            return n_bytes * (1 + losses)
        return n_bytes + losses * min(self.tcp.params.mss_bytes, n_bytes)
