"""The random parts of a message's trip, drawn once per message (never per frame).

Each hop has two independent streams: propagation max(0, L + J) (jitter J from
:mod:`wansim.links.jitter`) and lost transmissions G (geometric, P(G = g) = q^g (1 - q)).
Both are drawn in blocks of ``DRAW_BLOCK`` values, so a stream's n-th message gets the same
value whoever consumes it: the DES and the emulator given the same seeds draw the same delays.

Seeds: ``ring_seeds(seed, stages)`` = ``SeedSequence(seed).spawn(4 + 2P)``; hop i's
propagation stream is child 3 + 2i and its loss stream child 4 + 2i (the DES's documented
layout: 0 acceptance, 1 difficulty, 2 arrivals, last: the block schedule's bets).
"""

from __future__ import annotations

import numpy as np

from wansim.links.jitter import JitterDist

DRAW_BLOCK = 4096


def ring_seeds(seed: int, stages: int) -> list[np.random.SeedSequence]:
    """Every random stream of a ring of ``stages`` hops (module docstring for the layout)."""
    return np.random.SeedSequence(seed).spawn(4 + 2 * stages)


def hop_streams(seeds: list[np.random.SeedSequence], hop: int) -> tuple:
    """(propagation, losses) generators of hop ``hop`` from :func:`ring_seeds`."""
    return np.random.default_rng(seeds[3 + 2 * hop]), np.random.default_rng(seeds[4 + 2 * hop])


def sample_losses(rng: np.random.Generator, loss_rate: float, size: int) -> np.ndarray:
    """Lost transmissions before success: P(G = g) = q^g (1 - q)."""
    if loss_rate <= 0:
        return np.zeros(size, dtype=np.int64)
    return rng.geometric(1.0 - loss_rate, size) - 1


class LinkDraws:
    """Per-message draws of one hop: :meth:`propagation_ms` and :meth:`losses`."""

    __slots__ = (
        "_losses",
        "_losses_i",
        "_prop",
        "_prop_i",
        "has_jitter",
        "has_loss",
        "jitter",
        "latency_ms",
        "loss_rate",
        "loss_rng",
        "prop_rng",
    )

    def __init__(
        self,
        latency_ms: float,
        jitter: JitterDist,
        loss_rate: float,
        prop_rng: np.random.Generator,
        loss_rng: np.random.Generator,
    ):
        self.latency_ms = float(latency_ms)
        self.jitter = jitter
        self.loss_rate = float(loss_rate)
        self.prop_rng = prop_rng
        self.loss_rng = loss_rng
        self.has_jitter = jitter.kind != "none"
        self.has_loss = self.loss_rate > 0
        self._prop: list[float] = []
        self._prop_i = 0
        self._losses: list[int] = []
        self._losses_i = 0

    def propagation_ms(self) -> float:
        """max(0, L + J) for the next message (L itself without jitter; no draw)."""
        if not self.has_jitter:
            return self.latency_ms
        if self._prop_i >= len(self._prop):
            self._prop = self._prop_block().tolist()
            self._prop_i = 0
        d = self._prop[self._prop_i]
        self._prop_i += 1
        return d

    def losses(self) -> int:
        """G, the lost transmissions of the next message (0 without loss; no draw)."""
        if not self.has_loss:
            return 0
        if self._losses_i >= len(self._losses):
            self._losses = self._loss_block().tolist()
            self._losses_i = 0
        g = self._losses[self._losses_i]
        self._losses_i += 1
        return g

    def propagation_block(self, count: int) -> np.ndarray:
        """max(0, L + J) of the next ``count`` messages as an array, taken from the stream
        exactly as ``count`` calls of :meth:`propagation_ms` would (same blocks, same order)."""
        if not self.has_jitter:
            return np.full(count, self.latency_ms)
        return self._take("_prop", count, self._prop_block)

    def losses_block(self, count: int) -> np.ndarray:
        """G of the next ``count`` messages as an array (as ``count`` calls of :meth:`losses`)."""
        if not self.has_loss:
            return np.zeros(count, dtype=np.int64)
        return self._take("_losses", count, self._loss_block)

    def _prop_block(self) -> np.ndarray:
        j = self.jitter.sample(self.prop_rng, DRAW_BLOCK)
        return np.maximum(0.0, self.latency_ms + j)

    def _loss_block(self) -> np.ndarray:
        return sample_losses(self.loss_rng, self.loss_rate, DRAW_BLOCK)

    def _take(self, name: str, count: int, block) -> np.ndarray:
        """The next ``count`` values of buffer ``name`` (refilled by ``block()`` only when
        exhausted, as the scalar methods do); the buffer is left where they would leave it."""
        buf, i = getattr(self, name), getattr(self, name + "_i")
        parts = [np.asarray(buf[i:])] if i < len(buf) else []
        have = len(buf) - i if i < len(buf) else 0
        last = None
        while have < count:
            last = block()
            parts.append(last)
            have += len(last)
        out = np.concatenate(parts)[:count] if parts else np.zeros(0)
        if last is None:  # served from the current buffer
            setattr(self, name + "_i", i + count)
        else:
            setattr(self, name, last.tolist())
            setattr(self, name + "_i", len(last) - (have - count))
        return out
