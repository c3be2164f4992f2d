"""A link (one hop of the ring): FIFO, bandwidth-limited, with latency, jitter and loss.

Not a process: sending computes the delivery time in closed form (``wansim.network``'s model)
and schedules one timeout whose callback drops the message into the next stage's mailbox:

    start    = max(offer, link free)            FIFO: a message waits for the link (TCP)
    busy     = (1 + G) * bytes*8/B              only serialisation occupies the link
    free     = start + busy
    delivery = start + busy + G * rto + max(0, L + J)
    delivery = max(delivery, previous delivery on this hop)     no overtaking

Propagation overlaps: the link is free again after ``busy``, however long the latency. Jitter
J and losses G are drawn in vectorised blocks from the hop's own streams. Each delivery pops
the oldest message in flight, so delivery order is the send order even when two deliveries
fall on the same instant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import simpy
from simpy.events import Timeout

from wansim.network import jitter_dist, sample_losses
from wansim.scenario import Hop
from wansim.sim.messages import VERIFY, Pass

DRAW_BLOCK = 4096


class Link:
    """Hop ``index`` of the ring (the last one is the return hop to S0)."""

    __slots__ = (
        "_arrive_cb",
        "_losses",
        "_losses_i",
        "_prop",
        "_prop_i",
        "bytes_decode",
        "bytes_total",
        "deliver",
        "env",
        "free_ms",
        "has_jitter",
        "has_loss",
        "hop",
        "in_flight",
        "index",
        "jitter",
        "last_delivery_ms",
        "latency_ms",
        "loss_rate",
        "loss_rng",
        "messages",
        "ms_per_byte",
        "prop_rng",
        "rto_ms",
        "timeline",
    )

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        hop: Hop,
        deliver: Callable[[list[Pass]], None],
        prop_rng: np.random.Generator,
        loss_rng: np.random.Generator,
        timeline: list | None = None,
    ):
        self.env = env
        self.index = index
        self.hop = hop
        self.deliver = deliver
        self.ms_per_byte = 8.0 / (hop.bandwidth_mbps * 1e3)
        self.latency_ms = hop.latency_ms
        self.jitter = jitter_dist(hop.jitter)
        self.loss_rate = hop.loss_rate
        self.rto_ms = hop.retransmit_ms
        self.prop_rng = prop_rng
        self.loss_rng = loss_rng
        self._prop: list[float] = []
        self._prop_i = 0
        self._losses: list[int] = []
        self._losses_i = 0
        self.free_ms = 0.0
        self.last_delivery_ms = 0.0
        self.in_flight: deque[list[Pass]] = deque()
        self.messages = 0
        self.bytes_total = 0.0  # including retransmissions
        self.bytes_decode = 0.0  # the share carrying verify passes
        self.timeline = timeline  # (hop, offer, start, busy_end, delivery, bytes, losses, passes)
        self.has_jitter = self.jitter.kind != "none"
        self.has_loss = self.loss_rate > 0
        self._arrive_cb = self._arrive

    def _propagation(self) -> float:
        """max(0, L + J) for the next message (a jittered hop)."""
        if self._prop_i >= len(self._prop):
            self._prop = self._prop_block().tolist()
            self._prop_i = 0
        d = self._prop[self._prop_i]
        self._prop_i += 1
        return d

    def _lost(self) -> int:
        """G: lost transmissions of the next message (a lossy hop)."""
        if self._losses_i >= len(self._losses):
            self._losses = self._loss_block().tolist()
            self._losses_i = 0
        g = self._losses[self._losses_i]
        self._losses_i += 1
        return g

    def draw(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """max(0, L + J) and G of the next ``count`` messages as arrays, taken from the hop's
        streams exactly as ``count`` calls of :meth:`send` would (same blocks, same order)."""
        if self.has_jitter:
            prop = _take(self, "_prop", count, self._prop_block)
        else:
            prop = np.full(count, self.latency_ms, dtype=float)
        if self.has_loss:
            losses = _take(self, "_losses", count, self._loss_block)
        else:
            losses = np.zeros(count, dtype=np.int64)
        return prop, losses

    def ring_terms(self, n_bytes: np.ndarray, losses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For messages that find the link idle (the lone-request ring): :meth:`send`'s
        ``busy`` and retransmission wait, so that delivery = ((offer + busy) + propagation) +
        wait, the same operations in the same order (a wait of 0.0 adds nothing)."""
        busy = n_bytes * self.ms_per_byte * (1 + losses)
        return busy, losses * self.rto_ms

    def _prop_block(self) -> np.ndarray:
        return np.maximum(0.0, self.latency_ms + self.jitter.sample(self.prop_rng, DRAW_BLOCK))

    def _loss_block(self) -> np.ndarray:
        return sample_losses(self.loss_rng, self.loss_rate, DRAW_BLOCK)

    def send(
        self,
        passes: list[Pass],
        n_bytes: float,
        decode_share: float,
        offer_ms: float | None = None,
    ) -> None:
        """Offer a message at ``offer_ms`` (default now; later for a closed-form stage, which
        offers a pass when its service ends); offers come in time order. ``decode_share`` of
        its bytes counts as decode-phase traffic."""
        env = self.env
        now = env._now
        if offer_ms is None:
            offer_ms = now
        start = self.free_ms if self.free_ms > offer_ms else offer_ms
        g = self._lost() if self.has_loss else 0
        busy = n_bytes * self.ms_per_byte * (1 + g)
        self.free_ms = start + busy
        delivery = start + busy + (self._propagation() if self.has_jitter else self.latency_ms)
        if g:
            delivery += g * self.rto_ms
        if delivery < self.last_delivery_ms:
            delivery = self.last_delivery_ms
        self.last_delivery_ms = delivery
        self.in_flight.append(passes)
        Timeout(env, delivery - now).callbacks.append(self._arrive_cb)
        wire = n_bytes * (1 + g)
        self.messages += 1
        self.bytes_total += wire
        self.bytes_decode += wire * decode_share
        if self.timeline is not None:
            self.timeline.append(
                (self.index, offer_ms, start, start + busy, delivery, n_bytes, g, passes)
            )

    def _arrive(self, _event: object) -> None:
        self.deliver(self.in_flight.popleft())


def _take(link: Link, name: str, count: int, block) -> np.ndarray:
    """The next ``count`` pre-drawn values of ``link.<name>`` (refilled by ``block()`` only
    when exhausted, as the scalar path does); leaves the buffer where the scalar path would."""
    buf, i = getattr(link, name), getattr(link, name + "_i")
    have = len(buf) - i
    parts = [np.asarray(buf[i:])] if have > 0 else []
    last = buf
    while have < count:
        last = block()
        parts.append(last)
        have += len(last)
    out = np.concatenate(parts)[:count] if parts else np.asarray(buf[:0])
    left = have - count  # unused values of the last block drawn
    setattr(link, name, last.tolist() if last is not buf else buf)
    setattr(link, name + "_i", len(last) - left)
    return out


def decode_share(passes: list[Pass]) -> float:
    """Share of a message's bytes that is decode-phase traffic (verify tokens / all tokens)."""
    total = verify = 0
    for p in passes:
        total += p.n
        if p.kind == VERIFY:
            verify += p.n
    return verify / total if total else 0.0
