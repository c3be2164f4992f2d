"""Request state and the arrival source.

A request arrives, waits for admission (at most ``workload.concurrency`` requests are in flight,
or fewer slots: ``schedule.max_batch_size`` with micro-batches; and with
``workload.kv_capacity_tokens`` their contexts -- prompt + output, reserved whole at admission --
fit the KV cache: requests queue FIFO for memory and are never preempted),
sends one prefill pass of ``prompt_tokens`` into S0, and then commits its ``M = output_tokens - 1``
decode tokens through verify passes (the first output token comes from prefill).

Arrivals (``workload.arrival``):

- ``closed``: ``concurrency`` requests arrive at t = 0; each finishing request is replaced at
  once by the next, until ``requests`` have arrived (a saturated admission queue).
- open arrivals (``poisson``, ``gamma``, ``onoff``, ``trace``): at the gaps of the run's
  :class:`~wansim.serving.workload.RequestPlan` (drawn before the run from the arrival stream); one
  that finds ``concurrency`` requests in flight waits, FIFO, and its TTFT includes that wait.

Request i's prompt and output lengths are the plan's (fixed, drawn from a distribution, or a
trace's rows: :mod:`wansim.serving.workload`).

A request finishes at its last verify completion (the last stage); with a closed loop the next
request is admitted at that instant, into S0's mailbox.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from wansim.config.workload import Workload
from wansim.serving.workload import RequestPlan
from wansim.sim.kernel import Kernel, Reference


class Request:
    """One request's state while it runs, and what the metrics need afterwards."""

    __slots__ = (
        "accepted",
        "accepted_i",
        "admitted_ms",
        "arrival_ms",
        "committed",
        "decode_tokens",
        "failed",
        "finish_ms",
        "first_token_ms",
        "gen",
        "lap_tokens",
        "laps_ms",
        "last_verify_ms",
        "passes",
        "prompt_tokens",
        "rid",
    )

    def __init__(self, rid: int, arrival_ms: float, prompt_tokens: int, decode_tokens: int):
        self.rid = rid
        self.arrival_ms = arrival_ms
        self.admitted_ms = arrival_ms
        self.prompt_tokens = prompt_tokens
        self.decode_tokens = decode_tokens  # M: tokens the verify passes must commit
        self.committed = 0
        self.passes = 0  # verify passes so far
        self.first_token_ms = float("nan")
        self.finish_ms = float("nan")
        self.last_verify_ms = 0.0  # the lap clock: last verify (or prefill) completion
        self.laps_ms: list[float] = []
        self.lap_tokens: list[int] = []  # committed by each lap's verify pass
        self.accepted: list[int] = []  # pre-drawn accepted-draft counts (see verifier)
        self.accepted_i = 0
        self.gen = 0  # renewed by each failure that hits the request (wansim.sim.faults)
        self.failed = False  # faults.recovery: fail

    @property
    def remaining(self) -> int:
        return self.decode_tokens - self.committed

    @property
    def done(self) -> bool:
        return self.committed >= self.decode_tokens


class RequestSource:
    """Creates requests at their arrival times and admits them up to the concurrency limit.

    ``admit(request)`` puts the request's prefill into S0; the last stage calls
    :meth:`finished` when a request's last verify completes.
    """

    def __init__(
        self,
        env: Kernel | Reference,
        workload: Workload,
        plan: RequestPlan,
        admit: Callable[[Request], None],
        slots: int | None = None,
    ):
        self.env = env
        self.workload = workload
        # requests in flight at most (micro-batches may hold fewer than the users)
        self.slots = workload.concurrency if slots is None else slots
        self.admit_into_pipeline = admit
        self.requests: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.in_flight = 0
        self.open = workload.arrival != "closed"
        self.kv_capacity = workload.kv_capacity_tokens  # None: no memory limit
        self.kv_used = 0  # tokens reserved by the requests in flight
        self.kv_peak = 0  # the most tokens reserved at once
        self.gaps_ms: list[float] = [] if plan.gaps_ms is None else plan.gaps_ms.tolist()
        self.prompt_tokens = plan.prompt_tokens.tolist()
        self.decode_tokens = (plan.output_tokens - 1).tolist()

    def start(self) -> None:
        wl = self.workload
        if wl.arrival == "closed":
            for _ in range(min(wl.concurrency, wl.requests)):
                self._arrive()
        else:
            self._schedule_next_arrival()

    def _new_request(self) -> Request:
        i = len(self.requests)
        req = Request(i, self.env.now, self.prompt_tokens[i], self.decode_tokens[i])
        self.requests.append(req)
        return req

    def _arrive(self, _event: object = None) -> None:
        req = self._new_request()
        if not self.waiting and self._fits(req):
            self._admit(req)
        else:
            self.waiting.append(req)
        if self.open:
            self._schedule_next_arrival()

    def _fits(self, req: Request) -> bool:
        """A free slot, and room for the request's whole context (prompt + output) in the KV
        cache: reserved at admission, so a running request is never preempted."""
        if self.in_flight >= self.slots:
            return False
        if self.kv_capacity is None:
            return True
        return self.kv_used + req.prompt_tokens + req.decode_tokens + 1 <= self.kv_capacity

    def _schedule_next_arrival(self) -> None:
        i = len(self.requests)
        if i < self.workload.requests:
            self.env.call(self.gaps_ms[i], self._arrive)

    def _admit(self, req: Request) -> None:
        self.in_flight += 1
        if self.kv_capacity is not None:
            self.kv_used += req.prompt_tokens + req.decode_tokens + 1
            self.kv_peak = max(self.kv_peak, self.kv_used)
        req.admitted_ms = self.env.now
        self.admit_into_pipeline(req)

    def finished(self, req: Request) -> None:
        """The request's last verify completed now: free its slot."""
        req.finish_ms = self.env.now
        self.in_flight -= 1
        if self.kv_capacity is None:
            if self.waiting:
                self._admit(self.waiting.popleft())
            if not self.open and len(self.requests) < self.workload.requests:
                self._arrive()  # its user asks again (it waits when the slots are full)
            return
        self.kv_used -= req.prompt_tokens + req.decode_tokens + 1
        if not self.open and len(self.requests) < self.workload.requests:
            self.waiting.append(self._new_request())  # the user's next request
        # FIFO: the head waits for memory, and those behind it wait for the head
        while self.waiting and self._fits(self.waiting[0]):
            self._admit(self.waiting.popleft())
