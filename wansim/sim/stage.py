"""A pipeline stage: a FIFO compute server, in closed form or as a SimPy process with a mailbox.

Closed form (a stage before the last, one pass at a time, sync schedule): the service time of a
pass depends only on the pass, so it needs no event of its own. When a pass arrives at t:

    start = max(t, end of the previous pass)      FIFO: it waits for the stage
    end   = start + draft + stage_ms(n)
    the pass is offered to the forward hop at ``end`` (the hop computes its own delivery)

and the only event per stage and pass is the hop's delivery into the next stage. This is the
same schedule the process below produces (same instants, same order; checked against it), with
fewer than half the events (10 stages: 10 events per lap instead of 31).

Process (the last stage, continuous batching, or the block schedule, where what starts next
depends on what is waiting at that instant): one long-lived process with a mailbox (a deque plus
a wake event). The stage takes the oldest pass from its mailbox (FIFO), or with ``schedule.batching:
continuous`` every pass waiting there as one batch of sum(n) tokens, and holds for ONE timeout
of ``stage_ms(n)`` (one process step per pass or batch, never per token). Then:

- a stage before the last sends the pass (or batch, as one message of header + sum(n)
  activations) on its forward hop;
- the last stage is where the verifier sits: a prefill pass yields the first output token
  (TTFT), a verify pass commits min(A + 1, remaining) tokens and closes a lap. A request with
  tokens left gets its next verify pass of K + 1 tokens, which rides the return hop to S0 (one
  message of ``return_bytes`` per request); a finished request leaves (no draft after the final
  verify) and frees its admission slot at that instant.

Roles (one class each; a one-stage ring's only stage is the last stage):

- :class:`RelayStage`, every stage before the last: serves passes (in closed form where it can)
  and sends them on its forward hop. The first stage S0 is one, with the first stage's duties:
  admissions enter its mailbox, and with ``placement: first_stage`` it drafts before computing
  (``draft_before_ms``; the block schedule's hooks issue the next blocks there);
- :class:`LastStage`: the verifier's stage: first tokens, verdicts, drafting after the verdicts
  with ``placement: last_stage`` (``draft_after_ms``) and the return message to S0.

Both share :class:`Stage`: the mailbox, the service time of a pass or batch, busy time and the
timeline slices.

Drafting occupies the stage it runs on. ``placement: last_stage``: after the verdicts, one
drafter pass (``drafter_ms(K)``, block or autoregressive) drafts the continuing requests of the
batch, then the verdict+drafts leave. ``first_stage``: S0 drafts (one drafter pass per batch
holding verify passes) right before computing; drafting and compute then share one timeout.
At the last stage drafting is a second timeout after the verdicts, because the verdict instant
is observable: it closes the lap and, for a finishing request, admits the next one.
Stage busy time (compute + drafting, prefill included) is summed for utilisation.
With ``model.idle_cost`` a pass's compute adds the cold start of the time the stage idled
since its last busy instant (:mod:`wansim.stages.idle_cost`), before noise and stragglers.

With ``schedule.micro_batches`` (:mod:`wansim.sim.micro_batches`) the mailbox holds whole
micro-batches, served one at a time and never merged; S0 adds the waiting prompt chunks to a
micro-batch when it starts it, and the last stage sends the micro-batch back (even with no
verify pass left, while it has members).

With ``schedule.kind: async`` or ``drafter.overlap: true`` the stage calls the block schedule's
hooks (:mod:`wansim.sim.async_speculation`): before computing (drop cancelled blocks), after computing
(count the work, issue blocks at S0) and, at the last stage, for the verdicts.
"""

from __future__ import annotations

from collections import deque

import simpy

from wansim.sim.kernel import Event, Kernel, Reference, Timeout
from wansim.sim.link import Link, decode_share
from wansim.sim.messages import KIND_NAMES, PREFILL, VERIFY, Pass
from wansim.sim.request import RequestSource
from wansim.sim.verifier import Verifier

WAKE_CALL = object()  # Stage.wake on the Kernel: idle, to be woken by a call of _serve_next


class Stage:
    """What every stage role shares: stage ``index``'s mailbox, the service time of a pass or
    batch (drafting before the compute when this stage drafts there, then ``compute_ms(n)``),
    busy time and timeline slices. Wire ``link_out`` and ``source`` before :meth:`start`."""

    is_last = False
    __slots__ = (
        "_compute_cache",
        "_in_service",
        "_serve_next_cb",
        "_served_cb",
        "batching",
        "busy_ms",
        "closed_form",
        "compute_ms",
        "draft_before_ms",
        "draft_before_per_sequence_ms",
        "draft_bet_extra_ms",
        "draft_sequence_ms",
        "env",
        "free_ms",
        "hooks",
        "host",
        "idle_clock",
        "idle_extra",
        "idle_since",
        "index",
        "link_out",
        "mailbox",
        "micro",
        "passes",
        "process",
        "slowdown",
        "slowdowns",
        "source",
        "timeline",
        "tree_draft_ms",
        "wake",
    )

    def __init__(
        self,
        env: Kernel | Reference,
        index: int,
        compute_ms,
        *,
        batching: bool,
        draft_before_ms: float = 0.0,
        draft_before_per_sequence_ms: float = 0.0,
        timeline: list | None = None,
        hooks=None,
        micro=None,
        slowdown=None,
        host=None,
        idle_extra=None,
        idle_clock=None,
    ):
        self.env = env
        self.index = index
        self.compute_ms = compute_ms  # n tokens -> ms
        self.batching = batching
        # S0 with placement first_stage: a drafter pass per batch holding verify passes, plus
        # (trees, wansim.speculation) the drafter's width cost per sequence
        self.draft_before_ms = draft_before_ms
        self.draft_before_per_sequence_ms = draft_before_per_sequence_ms
        # the drafting stage (either placement): a drafter pass over a batch costs this more per
        # sequence beyond the first (drafter.sequence_ms per pass; 0 elsewhere)
        self.draft_sequence_ms = 0.0
        # the per-round hybrid (wansim.speculation.hybrid_rounds): S0 drafts a tree round's block at
        # this cost instead (None: no tree rounds)
        self.tree_draft_ms: float | None = None
        # the block schedule: a batch holding a block drafted on a bet drafts its guess first
        # (wansim.speculation.block_schedule.bet_draft_ms less draft_before_ms)
        self.draft_bet_extra_ms = 0.0
        self.timeline = timeline  # (stage, start, end, what, passes); labels made on export
        # the block schedule (async, overlapped drafter: wansim.sim.async_speculation), None for sync
        self.hooks = hooks
        # micro-batches (wansim.sim.micro_batches): the mailbox holds whole micro-batches
        self.micro = micro
        # compute noise and stragglers (wansim.stages.slowdown.StageSlowdown), None when off
        self.slowdown = slowdown
        self.slowdowns: list | None = None  # (stage, start, end, factor) when kept (Perfetto)
        # the host's cores shared with the other stages (wansim.sim.host.SharedHost), None when
        # every stage has its own CPU
        self.host = host
        # a pass after an idle costs more (wansim.stages.idle_cost): idle ms -> extra ms, None
        # when off; the stage's last busy instant
        self.idle_extra = idle_extra
        self.idle_since = 0.0
        # model.idle_follows host: the run's one HostIdleClock (wansim.sim.host_idle), which
        # every piece of work on the host marks busy; None: the stage's own idle_since
        self.idle_clock = idle_clock
        self.mailbox: deque[Pass] = deque()
        self.wake: simpy.Event | None = None
        self.link_out: Link | None = None
        self.source: RequestSource | None = None
        self.busy_ms = 0.0
        self.passes = 0
        self.free_ms = 0.0  # closed form: when the pass now in service ends
        # n tokens (or (n, sequences) for a batched pass) -> ms (sizes repeat)
        self._compute_cache: dict = {}
        self.closed_form = False
        self.process: simpy.Process | None = None
        self._in_service: tuple | None = None  # (batch, n, start, draft, compute) on the Kernel
        self._serve_next_cb = self._serve_next
        self._served_cb = self._served

    def start(self) -> None:
        """Begin serving (after wiring: ``link_out``, ``source`` and ``hooks`` are set).

        A stage that can serve in closed form (:meth:`serves_in_closed_form`) needs no process
        (module docstring); every other stage is a process with a mailbox: on SimPy a generator
        (:meth:`run`, the reference), on the :class:`~wansim.sim.kernel.Kernel` the same steps
        as callbacks (:meth:`_serve_next`, :meth:`_served`: the same events in the same order).
        """
        self.closed_form = self.serves_in_closed_form()
        if self.closed_form:
            return
        if isinstance(self.env, Kernel):
            self.env.start(self._serve_next_cb)
        else:
            self.process = self.env.process(self.run())

    def serves_in_closed_form(self) -> bool:
        return False

    def run(self):
        raise NotImplementedError

    def receive(self, passes: list[Pass]) -> None:
        """Mailbox drop (a link delivery, or an admission into S0); wakes an idle stage."""
        if self.closed_form:
            for p in passes:
                self._serve(p)
            return
        if self.micro is not None:
            self.mailbox.append(passes)  # one micro-batch, served as one
        else:
            self.mailbox.extend(passes)
        wake = self.wake
        if wake is not None:
            self.wake = None
            if wake is WAKE_CALL:  # the Kernel: the wake-up's callback, at Event.succeed's key
                self.env.call(0, self._serve_next_cb)
            else:
                wake.succeed()

    def _serve(self, p: Pass) -> None:
        raise NotImplementedError

    def _compute_next(self):
        """Process steps: wait for a pass, take the next pass or batch (:meth:`_next_batch`)
        and hold the stage for its service time. Returns (batch, tokens); an empty batch
        (every block in it cancelled) was not computed."""
        env = self.env
        mailbox = self.mailbox
        while not mailbox:  # (a cancellation may empty the mailbox before we wake)
            wake = self.wake = Event(env)
            yield wake
        batch, n = self._next_batch()
        if batch:
            start = env._now
            draft, compute = self._service_ms(batch, n, start)
            clock = self.idle_clock
            if self.host is None:
                if clock is not None:
                    clock.busy_until(start + (draft + compute))
                yield Timeout(env, draft + compute)
            else:
                if clock is not None:
                    clock.begin()
                yield self.host.compute(draft + compute, self.index)
                if clock is not None:
                    clock.end(env._now)
                draft, compute = self._stretched(start, draft, compute)
            self._account(batch, start, draft, compute)
        return batch, n

    def _serve_next(self, _event=None) -> None:
        """:meth:`_compute_next` as a callback: start the next pass or batch (a timeout to
        :meth:`_served`), or wait for a pass (a wake-up event back to this method)."""
        env = self.env
        mailbox = self.mailbox
        while mailbox:
            batch, n = self._next_batch()
            if batch:
                start = env._now
                draft, compute = self._service_ms(batch, n, start)
                if self.idle_clock is not None:
                    self.idle_clock.busy_until(start + (draft + compute))
                self._in_service = (batch, n, start, draft, compute)
                env.call(draft + compute, self._served_cb)
                return
        self.wake = WAKE_CALL  # (receive schedules this method at the wake-up's key)

    def _served(self, _event) -> None:
        """A pass or batch is computed: account for it, hand it on (:meth:`_after`), serve on."""
        batch, n, start, draft, compute = self._in_service
        self._in_service = None
        self._account(batch, start, draft, compute)
        if self._after(batch, n):
            self._serve_next()

    def _after(self, batch: list[Pass], n: int) -> bool:
        """What the role does with a computed pass or batch (as in its :meth:`run`); False
        when it holds the stage longer (it then serves on itself)."""
        raise NotImplementedError

    def _next_batch(self) -> tuple[list[Pass], int]:
        """The oldest pass of the (non-empty) mailbox, or with continuous batching every pass
        waiting there; less the cancelled blocks (block schedule). (batch, tokens)."""
        mailbox = self.mailbox
        if self.micro is not None:
            batch = mailbox.popleft()
            if self.index == 0:  # S0 adds the prompt chunks waiting for this micro-batch
                batch = self.micro.form(batch)
            return batch, sum(p.n for p in batch)
        if self.batching and len(mailbox) > 1:
            batch = list(mailbox)
            mailbox.clear()
            n = sum(p.n for p in batch)
        else:
            p = mailbox.popleft()
            batch = [p]
            n = p.n
        if self.hooks is not None:  # drop cancelled blocks before starting them
            kept = self.hooks.take(self.index, batch)
            if kept is not batch:  # (the same list back: nothing dropped)
                batch = kept
                n = sum(p.n for p in batch)
        return batch, n

    def _service_ms(self, batch: list[Pass], n: int, start: float = 0.0) -> tuple[float, float]:
        """(drafting before compute, compute) for a pass or batch of ``n`` tokens starting at
        ``start`` (its compute slowed by the stage's noise and stragglers, when set)."""
        draft = 0.0
        if self.draft_before_ms or self.draft_before_per_sequence_ms:
            verifies = sum(p.kind == VERIFY for p in batch)
            if verifies:
                draft = self.draft_before_ms + self.draft_before_per_sequence_ms * verifies
                if verifies > 1:  # a batched drafter pass: each sequence beyond the first
                    draft += self.draft_sequence_ms * (verifies - 1)
                if self.tree_draft_ms is not None and batch[0].tree:  # (hybrid: one a batch)
                    draft = self.tree_draft_ms
                elif self.draft_bet_extra_ms and any(p.bet for p in batch):
                    draft += self.draft_bet_extra_ms
        key = n if len(batch) == 1 else (n, len(batch))  # a batched pass: its sequences too
        compute = self._compute_cache.get(key)
        if compute is None:
            compute = self._compute_cache[key] = float(self.compute_ms(n, sequences=len(batch)))
        if self.idle_extra is not None:  # the cold start after the stage's (or host's) idle
            clock = self.idle_clock
            idle = start - self.idle_since if clock is None else clock.idle_ms(start)
            compute += self.idle_extra(idle)
        if self.slowdown is not None:
            factor = self.slowdown.factor(start)
            if self.slowdowns is not None and factor != 1.0:
                begin = start + draft
                self.slowdowns.append((self.index, begin, begin + compute * factor, factor))
            compute *= factor
        return draft, compute

    def _stretched(self, start: float, draft: float, compute: float) -> tuple[float, float]:
        """(drafting, compute) as they took on the shared host: stretched alike to the time
        from ``start`` to now."""
        work = draft + compute
        stretch = (self.env._now - start) / work if work > 0 else 1.0
        return draft * stretch, compute * stretch

    def _account(self, batch: list[Pass], start: float, draft: float, compute: float) -> None:
        """Busy time, pass count and (when kept) the timeline slices of one pass."""
        self.busy_ms += draft + compute
        self.passes += 1
        self.idle_since = start + (draft + compute)
        if self.timeline is not None:
            end = start + (draft + compute)
            if draft:
                self.timeline.append((self.index, start, start + draft, "draft", batch))
            self.timeline.append((self.index, start + draft, end, _what(batch), batch))


class RelayStage(Stage):
    """A stage before the last (S0 included when the ring has more than one stage): serves a
    pass, then offers it (header + n activations, + tree masks) to its forward hop."""

    __slots__ = ("forward_bytes", "mask_bytes_per_sequence", "tree_mask_bytes")

    def __init__(
        self,
        env: Kernel | Reference,
        index: int,
        compute_ms,
        forward_bytes,
        *,
        mask_bytes_per_sequence: float = 0.0,
        **shared,
    ):
        super().__init__(env, index, compute_ms, **shared)
        self.forward_bytes = forward_bytes  # n tokens -> bytes of one forward message
        self.mask_bytes_per_sequence = mask_bytes_per_sequence
        self.tree_mask_bytes = 0.0  # the per-round hybrid: a tree round's block's mask

    def serves_in_closed_form(self) -> bool:
        """Neither batching, the block schedule, a shared host nor the host's idle clock (a
        pass must start in time order): a FIFO server with a fixed service time per pass, in
        closed form (module docstring)."""
        return (
            not self.batching
            and self.hooks is None
            and self.host is None
            and self.idle_clock is None
        )

    def _serve(self, p: Pass) -> None:
        """Closed-form FIFO service of one pass arriving now: it starts when the stage is free,
        holds it for its service time and is offered to the forward hop when it ends."""
        now = self.env._now
        start = self.free_ms if self.free_ms > now else now
        batch = [p]
        draft, compute = self._service_ms(batch, p.n, start)
        self.free_ms = end = start + (draft + compute)
        self._account(batch, start, draft, compute)
        self._forward(batch, p.n, end)

    def _forward(self, batch: list[Pass], n: int, offer_ms: float | None) -> None:
        """Offer a computed pass or batch to the next hop."""
        size, share = self.message_bytes(batch, n)
        self.link_out.send(batch, size, share, offer_ms)

    def message_bytes(self, batch: list[Pass], n: int) -> tuple[float, float]:
        """(bytes, decode share) of the forward message of a pass or batch of ``n`` tokens."""
        share = 1.0 if batch[0].kind == VERIFY and len(batch) == 1 else decode_share(batch)
        size = self.forward_bytes(n)
        if self.mask_bytes_per_sequence:
            size += self.mask_bytes_per_sequence * sum(p.kind == VERIFY for p in batch)
        if self.tree_mask_bytes:
            size += self.tree_mask_bytes * sum(p.tree for p in batch)
        return size, share

    def run(self):
        while True:
            batch, n = yield from self._compute_next()
            if batch:
                self._after(batch, n)

    def _after(self, batch: list[Pass], n: int) -> bool:
        hooks = self.hooks
        if hooks is not None:  # count the work; cancelled meanwhile: not forwarded
            kept = hooks.done(self.index, batch)
            if not kept:
                return True
            if kept is not batch:  # (the same list back: nothing dropped)
                batch = kept
                n = sum(p.n for p in batch)
        self._forward(batch, n, None)
        return True


class LastStage(Stage):
    """The verifier's stage: a prefill pass yields the first token, a verify pass commits
    tokens and closes a lap; unfinished requests' next passes ride the return hop to S0 (one
    ``return_bytes`` message per request), after the drafting here with ``placement:
    last_stage``."""

    is_last = True
    __slots__ = ("draft_after_ms", "draft_after_per_sequence_ms", "return_bytes", "verifier")

    def __init__(
        self,
        env: Kernel | Reference,
        index: int,
        compute_ms,
        return_bytes: float,
        *,
        verifier: Verifier,
        draft_after_ms: float = 0.0,
        draft_after_per_sequence_ms: float = 0.0,
        **shared,
    ):
        super().__init__(env, index, compute_ms, **shared)
        self.return_bytes = return_bytes
        self.verifier = verifier
        self.draft_after_ms = draft_after_ms
        self.draft_after_per_sequence_ms = draft_after_per_sequence_ms

    def draft_after(self, sequences: int) -> float:
        """Drafting after the verdicts for ``sequences`` continuing requests (0 when the
        drafter is not here: then no drafting timeout at all)."""
        if self.draft_after_ms or self.draft_after_per_sequence_ms:
            draft = self.draft_after_ms + self.draft_after_per_sequence_ms * sequences
            if sequences > 1:  # a batched drafter pass: each sequence beyond the first
                draft += self.draft_sequence_ms * (sequences - 1)
            return draft
        return 0.0

    def run(self):
        env = self.env
        hooks = self.hooks
        while True:
            batch, _ = yield from self._compute_next()
            if not batch:
                continue
            if hooks is not None:  # the block schedule verifies and answers
                hooks.verdicts(self, hooks.done(self.index, batch))
                continue
            following, chunks = self._verdicts(batch)
            if not following and self.micro is None:
                continue
            if following and (self.draft_after_ms or self.draft_after_per_sequence_ms):
                start = env._now
                draft = self.draft_after(len(following))
                clock = self.idle_clock
                if self.host is None:
                    if clock is not None:
                        clock.busy_until(start + draft)
                    yield Timeout(env, draft)
                else:  # as long as it took on the shared host
                    if clock is not None:
                        clock.begin()
                    yield self.host.compute(draft, self.index)
                    if clock is not None:
                        clock.end(env._now)
                    draft = env._now - start
                self._drafted(following, start, draft)
            self._send_back(batch, following, chunks)

    def _after(self, batch: list[Pass], n: int) -> bool:
        """:meth:`run`'s steps after a computed pass or batch, on the Kernel (the drafting
        after the verdicts is a timeout to :meth:`_drafted_then_send`)."""
        hooks = self.hooks
        if hooks is not None:
            hooks.verdicts(self, hooks.done(self.index, batch))
            return True
        following, chunks = self._verdicts(batch)
        if not following and self.micro is None:
            return True
        if following and (self.draft_after_ms or self.draft_after_per_sequence_ms):
            start = self.env._now
            draft = self.draft_after(len(following))
            if self.idle_clock is not None:
                self.idle_clock.busy_until(start + draft)
            self.env.call(
                draft, lambda _e: self._drafted_then_send(batch, following, chunks, start, draft)
            )
            return False
        self._send_back(batch, following, chunks)
        return True

    def _drafted_then_send(self, batch, following, chunks, start: float, draft: float) -> None:
        self._drafted(following, start, draft)
        self._send_back(batch, following, chunks)
        self._serve_next()

    def _drafted(self, following: list[Pass], start: float, draft: float) -> None:
        """The drafting after the verdicts has ended (busy time, its timeline slice)."""
        self.busy_ms += draft
        self.idle_since = self.env._now
        if self.timeline is not None:
            self.timeline.append((self.index, start, self.env._now, "draft", following))

    def _send_back(self, batch, following: list[Pass], chunks: int) -> None:
        """The next passes ride the return hop to S0 (micro-batches: the micro-batch)."""
        if self.micro is None:
            self.link_out.send(following, self.return_bytes * len(following), 1.0)
        elif not self.micro.current(batch):  # lost in a failure while computed
            return
        elif self.micro.still_circulates(batch.index):  # back to S0, one record a sequence
            records = max(len(following) + chunks, 1)
            back = self.micro.message(batch.index, following)
            self.link_out.send(back, self.return_bytes * records, 1.0)

    def _verdicts(self, batch: list[Pass]) -> tuple[list[Pass], int]:
        """First tokens and verdicts; returns the next passes of unfinished requests and the
        number of prompt chunks that did not complete their prompt (micro-batches)."""
        now = self.env._now
        verifier = self.verifier
        micro = self.micro
        following = []
        chunks = 0
        for p in batch:
            req = p.request
            if p.gen != req.gen:  # lost in a failure while computed (wansim.sim.faults)
                continue
            if p.kind == PREFILL:
                if micro is not None and not micro.prompt_done(p):
                    chunks += 1  # more of the prompt rides the micro-batch's next pass
                    continue
                if req.first_token_ms != req.first_token_ms:  # a re-prefill keeps both clocks
                    req.first_token_ms = now
                    req.last_verify_ms = now
            else:
                verifier.verify(p, now)
                req.laps_ms.append(now - req.last_verify_ms)
                req.last_verify_ms = now
            if req.committed >= req.decode_tokens:
                if micro is not None:
                    micro.finished(req)
                self.source.finished(req)
            else:
                following.append(Pass(req, VERIFY, p.step + 1, verifier.tokens_per_pass(req)))
        return following, chunks


def _what(batch: list[Pass]) -> str:
    """prefill | verify | mixed (a continuous batch holding both)."""
    if len(batch) == 1:
        return KIND_NAMES[batch[0].kind]
    kinds = {p.kind for p in batch}
    return "mixed" if len(kinds) > 1 else KIND_NAMES[kinds.pop()]
