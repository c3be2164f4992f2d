"""Stage and link failures in the DES (``faults:`` in the scenario; README: faults).

Model. A failure of stage i or hop i at time t stops the whole ring until t + D (D: the event's
``downtime_s``, else ``faults.detection_s``: detection and the switch to a spare). Every pass in
flight at t - computing, queued at a stage or on a link - is lost: each request in the ring
gets a new generation (``Request.gen``), and a pass of an older generation is dropped where it
is next handled (a link's delivery, a stage's mailbox, the verifier). Work in progress is not
aborted (a stage finishes the pass it computes; its busy time counts, the result is dropped).
Requests admitted during the outage wait for the ring. Under the block schedule the verdicts
and cancellations in flight carry the generation too, and the schedule is told of each request
hit (:meth:`wansim.sim.async_speculation.Scheduler.lost_in_failure`): it issues nothing for it
until the re-prefill's first token, then starts a new chain.

With micro-batches every micro-batch in flight is lost and stops circulating
(:meth:`wansim.sim.micro_batches.MicroBatcher.lose_all`); a failover's re-prefill goes into the
request's own micro-batch as a prompt, chunked by ``prefill_chunk_tokens``.

Recovery (``faults.recovery``):

- ``failover``: at t + D every request that was in the ring re-prefills its prompt plus the
  tokens it had committed (one prefill pass of ``prompt_tokens + committed`` tokens into S0: the
  spare has no KV cache, and a ring re-formed around a dead link restarts its requests the same
  way), then decodes on from its committed tokens. No acceptance draw is consumed by a lost pass,
  so a request commits the same sequence it would have without the fault (losslessness kept).
  A re-prefill keeps the request's first-token time and lap clock: the lap that spans the fault
  carries the outage and the re-prefill (the laps still sum to the decode time).
- ``fail``: those requests fail at t (their slot frees; the next request is admitted when the
  ring serves again); the tokens they had produced count in throughput, not in goodput.

Failures at a rate: one Poisson process over all rate events (total rate the sum; which
component fails is drawn in proportion to its rate), its clock running while the ring is up (a
failure drawn during an outage is skipped and the next gap starts at the outage's end; by
memorylessness the same as a clock stopped while down). A fixed-time failure during an outage
extends it to max(its end, t + D). Draws come from their own stream (child ``4 + 2P + 1`` of
the seed), so every other draw of the run is unchanged by the faults.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.config.faults import Faults
from wansim.errors import ScenarioError
from wansim.sim.messages import PREFILL, Pass

MS_PER_S = 1e3
MS_PER_HOUR = 3.6e6
MAX_OUTAGES = 100_000


@dataclasses.dataclass
class Outage:
    """One outage of the ring: [start_ms, end_ms), the components that failed in it and the
    requests it hit (re-prefilled or failed)."""

    start_ms: float
    end_ms: float
    components: list[str]
    hit: int


@dataclasses.dataclass
class FaultLog:
    """What the faults did in a run (record and details)."""

    recovery: str
    outages: list[Outage] = dataclasses.field(default_factory=list)
    failed: int = 0
    reprefills: int = 0
    reprefill_tokens: int = 0

    def down_ms(self, until_ms: float) -> float:
        """Time the ring could not serve before ``until_ms`` (outages are disjoint)."""
        return float(sum(max(0.0, min(o.end_ms, until_ms) - o.start_ms) for o in self.outages))


def fault_seed(seed: int, stages: int) -> np.random.SeedSequence:
    """The faults' own stream: the child after the ring's documented ones and the bets'."""
    return np.random.SeedSequence(seed).spawn(4 + 2 * stages + 2)[-1]


class FaultInjector:
    """Fails the ring at the scenario's times and rates and recovers it (module docstring).

    Wiring: link deliveries and admissions go through :meth:`deliver` and :meth:`admit`
    (:meth:`wire` names the source and the admission). Closed-form stages (before the last,
    sync, no batching) cannot un-queue: they finish the passes already queued at them (their
    results are dropped), which delays the ring only when the downtime is shorter than that
    queue."""

    def __init__(self, env, faults: Faults, stages, seed: np.random.SeedSequence):
        self.env = env
        self.faults = faults
        self.stages = stages
        self.source = None
        self._admit = None
        self.scheduler = None  # the block schedule, told of the requests a failure hits
        self.micro = None  # the micro-batches (wansim.sim.micro_batches), lost in a failure
        self.rng = np.random.default_rng(seed)
        self.log = FaultLog(faults.recovery)
        self.down_until = -1.0
        self.waiting: list = []  # admitted during an outage
        self.restart: list = []  # failover: re-prefill at the outage's end
        rated = [e for e in faults.events if e.rate_per_hour is not None]
        self.rated = rated
        self.rate_total = sum(e.rate_per_hour for e in rated) / MS_PER_HOUR  # per ms
        self.rate_p = np.array([e.rate_per_hour for e in rated]) / max(
            sum(e.rate_per_hour for e in rated), 1e-300
        )

    # ----------------------------------------------------------------------- wiring
    def wire(self, source, admit) -> None:
        """The request source, and the admission into S0 that :meth:`admit` defers."""
        self.source = source
        self._admit = admit

    def deliver(self, receive):
        """A link's delivery callback that drops the passes of an older generation."""

        micro = self.micro

        def deliver(message: list) -> None:
            if micro is not None:  # a micro-batch: lost whole in a failure, else all current
                if micro.current(message):
                    receive(message)
                return
            if all(p.gen == p.request.gen for p in message):
                receive(message)
                return
            live = [p for p in message if p.gen == p.request.gen]
            if live:
                receive(live)

        return deliver

    def admit(self, req) -> None:
        """An admission: into the ring now, or when the outage ends."""
        if self.env._now < self.down_until:
            self.waiting.append(req)
        else:
            self._admit(req)

    def start(self) -> None:
        for event in self.faults.events:
            if event.at_s is not None:
                self.env.call(event.at_s * MS_PER_S, lambda _e, ev=event: self._fail(ev))
        if self.rated:
            self._next_rated(0.0)

    # ----------------------------------------------------------------------- failures
    def _running(self) -> bool:
        """Whether requests remain (the run has not ended)."""
        src = self.source
        return src.in_flight > 0 or bool(src.waiting) or len(src.requests) < src.workload.requests

    def _next_rated(self, from_ms: float) -> None:
        if not self._running():
            return
        gap = self.rng.exponential(1.0 / self.rate_total)
        which = int(self.rng.choice(len(self.rated), p=self.rate_p)) if len(self.rated) > 1 else 0
        self.env.call(from_ms - self.env._now + gap, lambda _e: self._rated(self.rated[which]))

    def _rated(self, event) -> None:
        now = self.env._now
        if now < self.down_until:  # the clock runs while the ring is up
            self._next_rated(self.down_until)
            return
        self._fail(event)
        self._next_rated(self.down_until)

    def _downtime_ms(self, event) -> float:
        d = event.downtime_s if event.downtime_s is not None else self.faults.detection_s
        return d * MS_PER_S

    def _fail(self, event) -> None:
        if not self._running():
            return
        now = self.env._now
        end = now + self._downtime_ms(event)
        if len(self.log.outages) >= MAX_OUTAGES:
            raise ScenarioError(
                "faults.events",
                f"more than {MAX_OUTAGES} outages in one run: the ring fails faster than it"
                " finishes its requests (lower the rates or the downtimes)",
                f"{len(self.faults.events)} events",
            )
        if now < self.down_until:  # already down: the outage lasts to the later end
            outage = self.log.outages[-1]
            outage.components.append(event.component)
            if end > self.down_until:
                self.down_until = outage.end_ms = end
                self.env.call(end - now, self._recover)
            return
        queued = set(map(id, self.source.waiting))  # arrived, not admitted: not in the ring
        hit = [
            r for r in self.source.requests if r.finish_ms != r.finish_ms and id(r) not in queued
        ]
        for req in hit:
            req.gen += 1
            if self.scheduler is not None:
                self.scheduler.lost_in_failure(req)
        if self.micro is not None:  # every micro-batch in flight is lost
            self.micro.lose_all()
            for stage in self.stages:
                stage.mailbox.clear()
        for stage in self.stages:  # queued passes of the old generations
            if stage.mailbox:
                stale = [p for p in stage.mailbox if p.gen != p.request.gen]
                for p in stale:
                    stage.mailbox.remove(p)
        self.log.outages.append(Outage(now, end, [event.component], len(hit)))
        self.down_until = end
        if self.faults.recovery == "fail":
            for req in hit:
                req.failed = True
                self.log.failed += 1
                if self.micro is not None:
                    self.micro.finished(req)
                self.source.finished(req)  # frees the slot (the next waits for the ring)
        else:
            self.restart.extend(hit)
        self.env.call(end - now, self._recover)

    def _recover(self, _event=None) -> None:
        if self.env._now < self.down_until:  # an extended outage: its own recovery comes
            return
        restart, self.restart = self.restart, []
        for req in restart:
            n = req.prompt_tokens + req.committed
            self.log.reprefills += 1
            self.log.reprefill_tokens += n
            if self.micro is not None:
                self.micro.reprefill(req, n)
            else:
                self.stages[0].receive([Pass(req, PREFILL, req.passes, n)])
        waiting, self.waiting = self.waiting, []
        for req in waiting:
            self._admit(req)
