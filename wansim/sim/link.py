"""A link (one hop of the ring): FIFO, bandwidth-limited, with latency, jitter and loss.

Not a process: sending applies the shared delivery rule (:class:`wansim.links.delivery.HopSender`,
the same code the analytical engine takes expectations of and the real-path emulator runs) and
schedules one timeout whose callback drops the message into the next stage's mailbox. Jitter
and losses are drawn once per message from the hop's own streams
(:class:`wansim.links.draws.LinkDraws`). Each delivery pops the oldest message in flight, so
delivery order is the send order even when two deliveries fall on the same instant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from wansim.config.network import Hop
from wansim.links.delivery import HopSender, software_ms
from wansim.links.draws import LinkDraws
from wansim.links.expected_delay import jitter_dist
from wansim.sim.kernel import Kernel, Reference
from wansim.sim.messages import VERIFY, Pass


class Link:
    """Hop ``index`` of the ring (the last one is the return hop to S0)."""

    __slots__ = (
        "_arrive_cb",
        "bytes_decode",
        "bytes_total",
        "deliver",
        "draws",
        "env",
        "hop",
        "in_flight",
        "index",
        "messages",
        "sender",
        "software_log",
        "timeline",
    )

    def __init__(
        self,
        env: Kernel | Reference,
        index: int,
        hop: Hop,
        deliver: Callable[[list[Pass]], None],
        prop_rng: np.random.Generator,
        loss_rng: np.random.Generator,
        timeline: list | None = None,
        tcp=None,
        drift=None,
        idle_extra=None,
    ):
        self.env = env
        self.index = index
        self.hop = hop
        self.deliver = deliver
        self.sender = hop_sender(hop, tcp, drift, idle_extra)
        self.draws = LinkDraws(
            hop.latency_ms, jitter_dist(hop.jitter), hop.loss_rate, prop_rng, loss_rng
        )
        self.in_flight: deque[list[Pass]] = deque()
        self.messages = 0
        self.bytes_total = 0.0  # including retransmissions
        self.bytes_decode = 0.0  # the share carrying verify passes
        self.timeline = timeline  # (hop, offer, start, busy_end, delivery, bytes, losses, passes)
        self._arrive_cb = self._arrive
        self.software_log: list | None = None

    def keep_costs(self, software: list, window_stalls: list) -> None:
        """Keep (hop, start, end) slices of the software cost and of tcp window stalls."""
        self.software_log = software
        if self.sender.tcp is not None:
            self.sender.tcp.stall_log = window_stalls
            self.sender.tcp.stall_hop = self.index

    def send(
        self,
        passes: list[Pass],
        n_bytes: float,
        decode_share: float,
        offer_ms: float | None = None,
    ) -> None:
        """Offer a message at ``offer_ms`` (default now; later for a closed-form stage, which
        offers a pass when its service ends); offers come in time order. ``decode_share`` of
        its bytes counts as decode-phase traffic. One event: its delivery."""
        env = self.env
        now = env._now
        delivery = self.transmit(
            passes, n_bytes, decode_share, now if offer_ms is None else offer_ms
        )
        self.in_flight.append(passes)
        env.call(delivery - now, self._arrive_cb)

    def transmit(
        self, passes: list[Pass], n_bytes: float, decode_share: float, offer_ms: float
    ) -> float:
        """The message's delivery instant by the shared rule (its draws, the sender's state),
        counted in the hop's totals (and timeline); no event (:meth:`send` schedules one, the
        lone async request (:mod:`wansim.sim.lone_async`) computes on from it)."""
        draws = self.draws
        g = draws.losses() if draws.has_loss else 0
        prop = draws.propagation_ms() if draws.has_jitter else draws.latency_ms
        start, free, delivery = self.sender.send(offer_ms, n_bytes, g, prop)
        wire = self.sender.wire_bytes(n_bytes, g) if g else n_bytes
        self.messages += 1
        self.bytes_total += wire
        self.bytes_decode += wire * decode_share
        if self.timeline is not None:
            self.timeline.append((self.index, offer_ms, start, free, delivery, n_bytes, g, passes))
            if self.software_log is not None:
                sender = self.sender
                sw = software_ms(n_bytes, sender.per_message_ms, sender.codec_ms_per_mb)
                if sender.idle_extra is not None:
                    sw += sender.last_idle_extra_ms
                if sw > 0:
                    self.software_log.append((self.index, start, start + sw))
        return delivery

    def _arrive(self, _event: object) -> None:
        self.deliver(self.in_flight.popleft())


def hop_sender(hop: Hop, tcp=None, drift=None, idle_extra=None) -> HopSender:
    """The shared per-hop sender for a resolved hop (``tcp``: TcpParams, or None: ideal;
    ``drift``: the network's Drift, or None; ``idle_extra``: idle ms -> extra ms of a message,
    ``network.idle_cost``, or None)."""
    return HopSender(
        hop.bandwidth_mbps,
        hop.per_message_ms,
        hop.codec_ms_per_mb,
        hop.retransmit_ms,
        hop.latency_ms,
        tcp,
        drift,
        idle_extra,
    )


def decode_share(passes: list[Pass]) -> float:
    """Share of a message's bytes that is decode-phase traffic (verify tokens / all tokens)."""
    total = verify = 0
    for p in passes:
        total += p.n
        if p.kind == VERIFY:
            verify += p.n
    return verify / total if total else 0.0
