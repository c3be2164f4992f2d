"""Which runs use the block schedule, and under which async protocol: the rules both engines
(:mod:`wansim.sim.async_speculation`, :mod:`wansim.analytical.blocks`) read.

The block schedule is async in-pipe speculation (``schedule.kind: async``: blocks drafted ahead
on a bet that the block in flight is fully accepted) and the overlapped drafter
(``drafter.overlap``: the next draft runs while the current pass travels), whenever something
is drafted. Its protocol (``schedule.async_protocol``):

- ``cancel_on_divergence``: a lost bet cancels the stale blocks downstream; the winning block
  commits its accepted drafts plus the bonus token;
- ``flush_on_full_acceptance``: a block commits only when all K drafts are accepted (no bonus
  token); stale blocks are computed by every stage they reach (the last included) and no
  cancellation travels; the bet is S_K (no guess).

A block drafted on a bet (behind a block still in flight) costs the drafter one more pass than
one drafted from a verified token under ``cancel_on_divergence``: the guess (:func:`bet_draft_ms`).
"""

from __future__ import annotations

import numpy as np

from wansim.config.scenario import Scenario
from wansim.config.schedule import FLUSH_ON_FULL_ACCEPTANCE
from wansim.stages.compute import drafter_tree_ms


def uses_blocks(scenario: Scenario) -> bool:
    """Async, or a drafter that overlaps (with something to draft)."""
    return scenario.schedule.kind == "async" or (
        bool(scenario.drafter.overlap) and scenario.speculation.policy != "none"
    )


def flushes(scenario: Scenario) -> bool:
    """Whether the async protocol is ``flush_on_full_acceptance``."""
    return scenario.schedule.async_protocol == FLUSH_ON_FULL_ACCEPTANCE


def bet_draft_ms(scenario: Scenario, depth, nodes, batch=1) -> np.ndarray:
    """Drafter ms of a block drafted on a bet: its root is the drafter's guess of the token
    after the earlier block's drafts, so the drafter makes one more pass (the guess) than for
    a block drafted from a verified token (``drafter_tree_ms(depth, nodes, batch)``; a parallel
    drafter still makes one pass); ``flush_on_full_acceptance`` has no guess. 0 when nothing
    is drafted. The real pipeline drafts its bets this way (``wansim.real.async_schedule``)."""
    nodes = np.asarray(nodes)
    guess = (0 if flushes(scenario) else 1) * (nodes > 0)
    return drafter_tree_ms(scenario.drafter, np.asarray(depth) + guess, nodes + guess, batch)
