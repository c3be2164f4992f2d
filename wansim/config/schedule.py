"""Scenario section ``schedule``: sync or async in-pipe speculation, the async protocol,
batching and micro-batches, hedge branches and the per-round hybrid.

Field documentation: README.md's scenario section."""

from __future__ import annotations

import dataclasses

from wansim.config.validation import spec

SCHEDULES = ("sync", "async")
CANCEL_ON_DIVERGENCE = "cancel_on_divergence"
FLUSH_ON_FULL_ACCEPTANCE = "flush_on_full_acceptance"
ASYNC_PROTOCOLS = (CANCEL_ON_DIVERGENCE, FLUSH_ON_FULL_ACCEPTANCE)
BATCHING = ("none", "continuous")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """``sync``: one block in flight per request (the next is drafted from the verdict).
    ``async`` (in-pipe speculation): S0 launches up to ``max_inflight_blocks`` blocks of a
    request before their verdicts return, each drafted from the drafts before it; needs the
    drafter on S0 (``drafter.placement: first_stage``) and a chain (:mod:`wansim.sim.async_speculation`
    has the protocol). ``async_protocol``: ``cancel_on_divergence`` (a verified block commits
    its accepted drafts and the bonus or correction token; a lost bet cancels the blocks behind
    it, with cancellation messages) or ``flush_on_full_acceptance`` (a block's K drafts count
    only when all are accepted, without a bonus token; else the block commits only the
    target's token at the divergence; stale blocks are computed by every stage they reach and
    dropped at the last, no cancellation travels). ``hybrid_confident_fraction`` p: the
    per-round hybrid (:mod:`wansim.speculation.hybrid_rounds`): each round is pipelined chain blocks
    with probability p, else one synchronous round of the tree ``speculation.tree``; ``profile``
    takes p from the acceptance profile's selected workload row.

    ``batching: continuous`` shares passes between the requests in flight: by default one batch
    circulates; ``micro_batches: N`` keeps N batches in flight at once, each of at most
    ``max_batch_size`` sequences, with prefill split into chunks of at most
    ``prefill_chunk_tokens`` per pass (:mod:`wansim.serving.micro_batching`)."""

    kind: str = spec("sync", choices=SCHEDULES)
    max_inflight_blocks: int = spec(1, ge=1)
    hedge_branches: int = spec(0, ge=0)
    batching: str = spec("none", choices=BATCHING)
    async_protocol: str = spec(CANCEL_ON_DIVERGENCE, choices=ASYNC_PROTOCOLS)
    micro_batches: int | None = spec(
        None, ge=1, le=4096, doc="batches in flight at once (continuous batching); null: one"
    )
    max_batch_size: int | None = spec(
        None, ge=1, le=65_536, doc="sequences per micro-batch at most; null: no cap"
    )
    prefill_chunk_tokens: int | None = spec(
        None, ge=1, le=10_000_000, doc="prompt tokens a pass carries at most; null: whole"
    )
    hybrid_confident_fraction: float | str | None = spec(
        None,
        ge=0,
        le=1,
        choices=("profile",),
        doc="async only: share of rounds the drafter is confident (pipelined chain blocks);"
        " the others are one synchronous round of speculation.tree"
        " (:mod:`wansim.speculation.hybrid_rounds`); profile: the selected acceptance-profile"
        " workload's hybrid_confident_fraction; null: every round async",
    )
