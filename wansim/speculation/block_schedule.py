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
"""

from __future__ import annotations

from wansim.config.scenario import FLUSH_ON_FULL_ACCEPTANCE, Scenario


def uses_blocks(scenario: Scenario) -> bool:
    """Async, or a drafter that overlaps (with something to draft)."""
    return scenario.schedule.kind == "async" or (
        bool(scenario.drafter.overlap) and scenario.speculation.policy != "none"
    )


def flushes(scenario: Scenario) -> bool:
    """Whether the async protocol is ``flush_on_full_acceptance``."""
    return scenario.schedule.async_protocol == FLUSH_ON_FULL_ACCEPTANCE
