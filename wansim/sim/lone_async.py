"""A lone request under async in-pipe speculation, pass by pass instead of event by event.

With one request in flight (``workload.concurrency: 1``, closed arrivals) under the block
schedule with the drafter on S0 (:mod:`wansim.sim.async_speculation`: async, and the
overlapped drafter in either schedule), every stage after S0 and
every hop serves the request's passes in the order S0 forwarded them (FIFO stages, FIFO hops
that never overtake). So once S0 forwards a pass, its way round the ring is a chain of
additions, computed then, with no event:

    stage i:  start = max(arrival, end of its previous pass),  end = start + service
    hop i:    the shared delivery rule (:meth:`wansim.sim.link.Link.transmit`); the pass
              arrives at end + (delivery - end), the instant the events' loop computes
    last stage: the verifier, the bet, the verdict onto the return hop (its arrival at S0 is
              known then: the return hop carries only verdicts, in the order they are made)

Verifying a block when S0 forwards it draws the same acceptance and bet values as at its
verdict: each request draws from its own sequences, in verification order, which is the
forwarding order. Two things are known only later and are computed when they are:

- S0's next pass depends on the verdicts reaching it: S0's side runs as events of its own
  (:class:`_Clock`: S0's pass ends and wake-ups, the overlapped drafter's passes, the
  verdicts' arrivals, the next request's admission), through S0's and the block schedule's
  own methods (taking, drafting, accounting, issuing, the drafter device).
- A block forwarded behind a block that loses its bet is stale, and how far it goes depends
  on when the cancellation catches it, which S0 sends when the lost verdict reaches it. Stale
  blocks wait for it and then go round with it, stage by stage: a stale block still waiting
  when the cancellation reaches the stage is dropped; one in service is computed and not
  forwarded; one computed before goes on. The last stage drops whatever reaches it.
  (``flush_on_full_acceptance`` sends no cancellation: stale blocks go round like the others
  and the last stage computes them and drops them at their verdict.)

Several requests in flight (closed arrivals) take this path too where no cancellation ever
goes round (``flush_on_full_acceptance``; two stages, where the last stage drops stale blocks;
the sync schedule's overlapped drafter, which never forwards one): every pass is then
computed when S0 forwards it, whoever's it is. Elsewhere a stale block's fate would hold up
the other requests' passes behind it, so those runs go event by event.

Instants that tie are ordered as the events' loop orders them: events at one instant in the
order they were scheduled, i.e. by the instants at which they were scheduled (a delivery when
its message was sent, the end of a pass when it started). Where those tie too, the run is
given to the events (:func:`run` returns None). The components' own code decides everything
else (the verifier, the block schedule, the request source); their sends are caught
(:class:`_Outbox`) and put on the real links. The record is the events' to the bit
(``tests/engines/test_lone_async.py``), with no event scheduled.

Eligibility is a whitelist (:func:`applies`), as in :mod:`wansim.sim.lone_ring`.
"""

from __future__ import annotations

from heapq import heappop, heappush

from wansim.sim import lone_ring
from wansim.sim.async_speculation import Scheduler
from wansim.sim.kernel import Kernel
from wansim.sim.lone_ring import ANY
from wansim.sim.messages import VERIFY
from wansim.sim.record import RunRecord, build_record
from wansim.sim.request import RequestSource
from wansim.sim.stage import LastStage, RelayStage
from wansim.sim.verifier import Verifier

# scenario field path -> the values this module reproduces (the lone ring's, less a shared host
# (an async ring builds one), for the async schedule with the drafter on S0, chains only)
KNOWN_FIELDS: dict[str, tuple | None] = {
    **lone_ring.KNOWN_FIELDS,
    "model.host_cores": (None,),
    "drafter.placement": ("first_stage",),
    "drafter.overlap": (False, True),
    "speculation.policy": ("chain",),
    "schedule.kind": ("sync", "async"),  # (sync: with the overlapped drafter)
    "schedule.max_inflight_blocks": ANY,
    "schedule.hedge_branches": (0,),
    "schedule.batching": ("none",),
    "schedule.async_protocol": ("cancel_on_divergence", "flush_on_full_acceptance"),
    "workload.concurrency": ANY,  # several: only where no cancellation goes round (applies)
}


class _Tie(Exception):
    """Two events at one instant, scheduled at one instant: their order is the loop's own."""


def _scheduled_first(a_ms: float, b_ms: float) -> bool:
    """Of two events at one instant, does the one scheduled at ``a_ms`` run first?"""
    if a_ms == b_ms:
        raise _Tie
    return a_ms < b_ms


class _Outbox:
    """Stands in for a stage's link while the run is computed: keeps what the stage sends."""

    __slots__ = ("sent",)

    def __init__(self):
        self.sent: list[tuple] = []

    def send(self, passes, n_bytes: float, decode_share: float, offer_ms=None) -> None:
        self.sent.append((passes, n_bytes, decode_share))


def applies(pipe) -> bool:
    """Whether the built pipeline (``wansim.sim.engine.build``) is a lone request (or several,
    where no cancellation goes round: ``flush_on_full_acceptance``, two stages, or the sync
    schedule's overlapped drafter) under the block schedule with nothing this module does not
    reproduce (a whitelist)."""
    sched = pipe.scheduler
    if type(sched) is not Scheduler or not isinstance(pipe.env, Kernel):
        return False
    if lone_ring.unknown_fields(pipe.scenario, KNOWN_FIELDS):
        return False
    if pipe.timeline is not None or pipe.faults is not None or len(pipe.stages) < 2:
        return False
    if not sched.first_stage or sched.batching:
        return False
    if pipe.scenario.workload.concurrency > 1 and not (
        sched.flush or len(pipe.stages) == 2 or pipe.scenario.schedule.kind == "sync"
    ):
        return False  # a stale block's cancellation would hold up the other requests' passes
    if sched.tree_rounds is not None or sched.faults:
        return False
    if type(pipe.verifier) is not Verifier or pipe.verifier.log is not None:
        return False
    if type(pipe.source) is not RequestSource:
        return False
    last = len(pipe.stages) - 1
    for i, stage in enumerate(pipe.stages):
        if type(stage) is not (LastStage if i == last else RelayStage) or stage.hooks is not sched:
            return False
        if stage.host is not None or stage.slowdown is not None or stage.idle_extra is not None:
            return False
        if stage.micro is not None or stage.batching or stage.tree_draft_ms is not None:
            return False
    return lone_ring.plain_links(pipe.links) and all(lk.timeline is None for lk in pipe.links)


def run(pipe) -> RunRecord | None:
    """The record of the run, or None where two events tie beyond what this module orders
    (the caller then runs the events on a fresh pipeline)."""
    try:
        return _Ring(pipe).run()
    except _Tie:
        return None


class _Clock:
    """S0's side of the run as events: S0's pass ends and wake-ups, the drafter device's
    passes, the verdicts' arrivals and the next request's admission, in the loop's order: by
    instant, then by the instant each was scheduled, then in the order they were scheduled
    (faithful for what S0's side schedules as it runs; an arrival or admission computed ahead
    by the ring is *foreign*, pushed before its time: one that ties another event on both
    instants hands the run to the events). The block schedule and S0 schedule through
    :meth:`call`, as on the Kernel."""

    __slots__ = ("_now", "kernel", "queue", "seq", "served", "served_cb")

    def __init__(self, kernel: Kernel, served_cb, served):
        self._now = 0.0
        self.kernel = kernel  # (the request source reads the Kernel's clock)
        self.queue: list = []
        self.seq = 0
        self.served_cb = served_cb  # S0's end of pass on the Kernel ...
        self.served = served  # ... stands for this (the ring's)

    @property
    def now(self) -> float:
        return self._now

    def at(self, now_ms: float) -> None:
        self._now = now_ms
        self.kernel._now = now_ms

    def call(self, delay: float, callback) -> None:
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        if callback is self.served_cb:
            callback = self.served
        self.push(self._now + delay, self._now, callback, False)

    def push(self, at: float, scheduled: float, callback, foreign: bool) -> None:
        self.seq += 1
        heappush(self.queue, (at, scheduled, self.seq, foreign, callback))

    def run(self) -> None:
        queue = self.queue
        while queue:
            at, scheduled, _, foreign, callback = heappop(queue)
            if queue:
                head = queue[0]
                if head[0] == at and head[1] == scheduled and (foreign or head[3]):
                    raise _Tie
            self.at(at)
            callback(None)


class _Ring:
    """One run: S0's side as events (:class:`_Clock`), the passes' chains round the ring, the
    stale blocks' round."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.stages = pipe.stages
        self.links = pipe.links
        self.sched = pipe.scheduler
        self.source = pipe.source
        self.last = len(self.stages) - 1
        s0 = self.stages[0]
        self.clock = _Clock(pipe.env, s0._served_cb, self._s0_served)
        s0.env = self.sched.env = self.clock
        self.outboxes = [_Outbox() for _ in self.stages]
        for stage, box in zip(self.stages, self.outboxes, strict=True):
            stage.link_out = box
        self.deliver_at_s0 = self.links[self.last].deliver  # the block schedule's, into S0
        self.free_ms = [0.0] * len(self.stages)  # end of each stage's last pass
        self.started_ms = [0.0] * len(self.stages)  # ... and its start (when that was scheduled)
        self.delivered_ms = [0.0] * len(self.stages)  # each hop's latest delivery event
        self.stale: list = []  # (block, arrival at S1, sent) behind a lost bet, for its cancel
        self.block_service: list = [None] * len(self.stages)  # (compute, bytes, share) per stage
        self.lone = pipe.scenario.workload.concurrency == 1

    # ------------------------------------------------------------------------------- S0
    def run(self) -> RunRecord:
        self.clock.at(0.0)
        self.source.start()  # closed: the first request's prefill into S0's mailbox
        self.stages[0]._serve_next()  # S0's start, before the run's other events
        self.clock.run()
        if self.stale:
            raise RuntimeError("stale blocks left without a cancellation")
        return build_record(
            self.source.requests,
            self.stages,
            self.links,
            self.pipe.verifier,
            self.pipe.scenario.workload.concurrency,
            0,
            None,
            self.sched,
            None,
        )

    def _s0_served(self, _event) -> None:
        """S0's pass ends (as its ``_served``): what it forwards goes round the ring."""
        s0 = self.stages[0]
        batch, n, start, draft, compute = s0._in_service
        s0._in_service = None
        s0._account(batch, start, draft, compute)
        if s0._after(batch, n):  # the block schedule's hooks (next block), the forward
            self._forwarded(self.clock._now)
            s0._serve_next()

    def _verdict(self, message) -> None:
        """A verdict reaches S0 (a lost bet: its cancellation goes round)."""
        at = self.clock._now
        self.deliver_at_s0(message)
        box = self.outboxes[0]
        sent, box.sent = box.sent, []
        for passes, n_bytes, share in sent:  # a cancellation down the forward hops
            self._cancel_round(passes[0], self._deliver(0, passes, n_bytes, share, at), at)
        self.clock.at(at)

    def _admit(self, prefills: list) -> None:
        """The next request's prefill enters S0's mailbox (at its admission's instant)."""
        s0 = self.stages[0]
        for prefill in prefills:
            s0.receive([prefill])

    def _forwarded(self, now: float) -> None:
        """What S0 forwarded at ``now`` goes round the ring (a stale block: with its cancel)."""
        box = self.outboxes[0]
        sent, box.sent = box.sent, []
        states, flush = self.sched.states, self.sched.flush
        for passes, n_bytes, share in sent:
            arrival = self._deliver(0, passes, n_bytes, share, now)
            p = passes[0]
            if p.kind == VERIFY and not flush and p.epoch < states[p.request.rid].epoch:
                if self.last == 1:  # the last stage drops it
                    self.sched._cancelled(p)
                elif self.lone:
                    self.stale.append((p, arrival, now))
                else:  # (its fate would hold up the other requests' passes behind it)
                    raise _Tie
                continue
            self._round(p, arrival)
            self.clock.at(now)

    def _deliver(self, hop: int, passes, n_bytes: float, share: float, now: float) -> float:
        """Send a message on ``hop`` at ``now``: the instant the loop delivers it."""
        delivery = self.links[hop].transmit(passes, n_bytes, share, now)
        return self._arrival(hop, now + (delivery - now))

    def _arrival(self, hop: int, at: float) -> float:
        """A delivery event at ``at`` (scheduled as now + (delivery - now)) delivers the hop's
        oldest message in flight; two messages clamped to one delivery can round to event
        instants in the reverse order, and the loop then pairs them by order: to the events."""
        if at < self.delivered_ms[hop]:
            raise _Tie
        self.delivered_ms[hop] = at
        return at

    # ------------------------------------------------------------------------------- the ring
    def _service(self, i: int, p) -> tuple[float, float, float]:
        """(compute, bytes, decode share) of pass ``p`` at stage ``i`` (blocks: once)."""
        if p.kind == VERIFY:
            got = self.block_service[i]
            if got is not None:
                return got
        stage = self.stages[i]
        draft, compute = stage._service_ms([p], p.n, 0.0)
        if draft:
            raise RuntimeError("drafting after S0 in the async schedule")
        size, share = stage.message_bytes([p], p.n) if i < self.last else (0.0, 0.0)
        got = (compute, size, share)
        if p.kind == VERIFY:
            self.block_service[i] = got
        return got

    def _round(self, p, arrival: float) -> None:
        """A live pass from S1 on: the stages in turn, then its verdict at the last stage."""
        free, started, links, stages = self.free_ms, self.started_ms, self.links, self.stages
        delivered, services = self.delivered_ms, self.block_service
        last = self.last
        block = p.kind == VERIFY
        passes = [p]
        for i in range(1, last):
            f = free[i]
            start = arrival if arrival > f else f
            got = services[i] if block else None
            compute, size, share = got if got is not None else self._service(i, p)
            end = start + compute
            free[i] = end
            started[i] = start
            stage = stages[i]
            stage.busy_ms += compute
            stage.passes += 1
            if block:  # (stale under flush_on_full_acceptance: its work is counted)
                p.computed += 1
            delivery = links[i].transmit(passes, size, share, end)
            arrival = end + (delivery - end)
            if arrival < delivered[i]:  # (as _arrival)
                raise _Tie
            delivered[i] = arrival
        f = free[last]
        start = arrival if arrival > f else f
        compute = self._service(last, p)[0]
        end = start + compute
        free[last] = end
        started[last] = start
        stage = stages[last]
        clock = self.clock
        clock.at(end)
        s0_mailbox = self.stages[0].mailbox
        waiting, scheduled = len(s0_mailbox), clock.seq
        stage._account([p], start, 0.0, compute)
        stage._after([p], p.n)  # verifier, bet, verdict; a finished request admits the next
        if clock.seq != scheduled:  # (S0 is mid-pass here: nothing of S0's may be scheduled)
            raise RuntimeError("the last stage scheduled an event of S0's side")
        box = self.outboxes[last]
        for passes, n_bytes, share in box.sent:
            at = self._deliver(last, passes, n_bytes, share, end)
            clock.push(at, end, lambda _e, m=passes: self._verdict(m), True)
        box.sent = []
        if len(s0_mailbox) > waiting:  # admitted: its prefill enters S0 at this pass's end
            prefills = [s0_mailbox.pop() for _ in range(len(s0_mailbox) - waiting)][::-1]
            clock.push(end, start, lambda _e, ps=prefills: self._admit(ps), True)

    def _cancel_round(self, cancel, arrival: float, sent: float) -> None:
        """The cancellation and the stale blocks ahead of it, stage by stage (module
        docstring); ``arrival``/``sent``: the cancellation's at S1, then at each next stage."""
        group, self.stale = self.stale, []
        sched, stages, links = self.sched, self.stages, self.links
        free, started, delivered = self.free_ms, self.started_ms, self.delivered_ms
        for i in range(1, self.last):
            stage = stages[i]
            link = links[i]
            onward = []
            for p, at, at_sent in group:
                f = free[i]
                start = at if at > f else f
                if start == arrival:
                    computed = self._starts_first(f, at, at_sent, started[i], sent)
                else:
                    computed = start < arrival
                if not computed:  # waiting when the cancellation arrives
                    sched._cancelled(p)
                    continue
                got = self.block_service[i]
                compute, size, share = got if got is not None else self._service(i, p)
                end = start + compute
                free[i] = end
                started[i] = start
                stage.busy_ms += compute
                stage.passes += 1
                p.computed += 1
                if end < arrival or (end == arrival and _scheduled_first(start, sent)):
                    delivery = link.transmit([p], size, share, end)
                    on = end + (delivery - end)
                    if on < delivered[i]:  # (as _arrival)
                        raise _Tie
                    delivered[i] = on
                    onward.append((p, on, end))
                else:  # the stage learned of the cancellation while computing it
                    sched._cancelled(p)
            group = onward
            self.clock.at(arrival)
            sched._cancel_at(i, cancel)  # what the stage knows; on to the next (caught)
            box = self.outboxes[i]
            sent_now, box.sent = box.sent, []
            for passes, n_bytes, share in sent_now:
                sent, arrival = arrival, self._deliver(i, passes, n_bytes, share, arrival)
        for p, _, _ in group:  # the last stage drops what reaches it
            sched._cancelled(p)

    @staticmethod
    def _starts_first(
        free: float, at: float, at_sent: float, started: float, cancel_sent: float
    ) -> bool:
        """A stale block could start at the instant its cancellation arrives: does it start
        first? ``free``/``started``: the stage's previous pass's end and start; ``at``/``at_sent``:
        the block's arrival and when it was sent; ``cancel_sent``: when the cancellation was."""
        if free > at:  # waiting: the stage's end of pass against the cancellation's delivery
            return _scheduled_first(started, cancel_sent)
        if free == at and _scheduled_first(at_sent, started):  # delivered, then the end of pass
            return _scheduled_first(started, cancel_sent)
        # the stage is idle when the block arrives: its wake-up is scheduled then, after the
        # cancellation's delivery (scheduled when it was sent, before that instant)
        _scheduled_first(cancel_sent, at)
        return False
