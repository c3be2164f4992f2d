"""The event record of a run: what the metrics are computed from.

Always kept (cheap, per request and per component): each request's arrival, admission, first
token and finish times, decode tokens, verify passes and lap durations; each stage's busy time
(compute + drafting, prefill included); each link's messages and wire bytes (retransmissions
included, decode-phase share separately); the verifier's pass/token totals.

Kept only when asked (``simulate(..., timeline=True)``): the :class:`Timeline` -- every compute
and drafting slice per stage, every transfer per link (offer, link start, serialisation end,
delivery, bytes, losses) and every verify pass (A drawn, tokens remaining, tokens committed), for
Perfetto export and for tests that inspect the order of events. The vectorised lone ring keeps
the same fields as columns (:class:`wansim.sim.columnar_timeline.ColumnarTimeline`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass
class Timeline:
    """Raw event lists (filled during the run)."""

    stage_names: list[str]
    link_names: list[str]
    # (stage, start_ms, end_ms, what, passes); what: prefill | verify | mixed | draft
    stage_slices: list[tuple] = dataclasses.field(default_factory=list)
    # (hop, offer_ms, start_ms, busy_end_ms, delivery_ms, bytes, losses, passes)
    transfers: list[tuple] = dataclasses.field(default_factory=list)
    # (rid, step, time_ms, n, accepted, remaining_before, committed)
    verify_log: list[tuple] = dataclasses.field(default_factory=list)
    # (hop, start_ms, end_ms): a message's per-message software cost (framing, codec)
    software: list[tuple] = dataclasses.field(default_factory=list)
    # (hop, from_ms, to_ms): a tcp sender waiting for ACKs with its window full
    window_stalls: list[tuple] = dataclasses.field(default_factory=list)
    # (stage, start_ms, end_ms, factor): a compute pass slowed by noise or a straggler
    slowdowns: list[tuple] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """Per-request arrays (indexed by request id) and per-component totals of one run."""

    concurrency: int
    arrival_ms: np.ndarray
    admitted_ms: np.ndarray
    first_token_ms: np.ndarray
    finish_ms: np.ndarray
    decode_tokens: np.ndarray  # M per request
    committed: np.ndarray  # tokens committed by verify passes (== M when finished)
    passes: np.ndarray  # verify passes per request
    laps_ms: np.ndarray  # every decode lap, grouped by request
    lap_request: np.ndarray  # request id of each lap
    stage_busy_ms: np.ndarray
    link_messages: np.ndarray
    link_bytes: np.ndarray  # retransmissions included
    link_bytes_decode: np.ndarray
    verify_passes: int
    tokens_verified: int
    tokens_committed: int
    target_exact: bool
    events: int  # SimPy events scheduled
    timeline: Timeline | None = None
    # the block schedule (async, overlapped drafter): stage-tokens computed for blocks that
    # were then cancelled (a block of n tokens computed by s stages counts s n)
    cancelled_stage_tokens: int = 0
    # tokens committed by each lap's verify pass (aligned with laps_ms)
    lap_tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    # faults (wansim.sim.faults): which requests failed, and what the faults did (None: no
    # faults in the scenario)
    failed: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, bool))
    faults: Any = None

    @property
    def start_ms(self) -> float:
        return float(self.arrival_ms.min())

    @property
    def makespan_ms(self) -> float:
        """First arrival to last finish."""
        return float(self.finish_ms.max() - self.arrival_ms.min())

    @property
    def decode_ms(self) -> np.ndarray:
        """Per request: first token to last verify (= the sum of its laps)."""
        return self.finish_ms - self.first_token_ms

    @property
    def output_tokens(self) -> int:
        return int((self.decode_tokens + 1).sum())


def build_record(
    requests, stages, links, verifier, concurrency, events, timeline, scheduler=None, faults=None
) -> RunRecord:
    """Collect the record from the finished run's objects."""
    laps = [r.laps_ms for r in requests]
    return RunRecord(
        concurrency=concurrency,
        arrival_ms=np.array([r.arrival_ms for r in requests]),
        admitted_ms=np.array([r.admitted_ms for r in requests]),
        first_token_ms=np.array([r.first_token_ms for r in requests]),
        finish_ms=np.array([r.finish_ms for r in requests]),
        decode_tokens=np.array([r.decode_tokens for r in requests], dtype=np.int64),
        committed=np.array([r.committed for r in requests], dtype=np.int64),
        passes=np.array([r.passes for r in requests], dtype=np.int64),
        laps_ms=np.concatenate([np.asarray(x, dtype=float) for x in laps]),
        lap_request=np.repeat(np.arange(len(requests)), [len(x) for x in laps]),
        stage_busy_ms=np.array([s.busy_ms for s in stages]),
        link_messages=np.array([lk.messages for lk in links], dtype=np.int64),
        link_bytes=np.array([lk.bytes_total for lk in links]),
        link_bytes_decode=np.array([lk.bytes_decode for lk in links]),
        verify_passes=verifier.passes,
        tokens_verified=verifier.tokens_verified,
        tokens_committed=verifier.tokens_committed,
        target_exact=verifier.target_exact,
        events=events,
        timeline=timeline,
        cancelled_stage_tokens=0 if scheduler is None else scheduler.cancelled_stage_tokens,
        lap_tokens=np.concatenate([np.asarray(r.lap_tokens, dtype=np.int64) for r in requests]),
        failed=np.array([r.failed for r in requests], dtype=bool),
        faults=faults,
    )
