"""The DES's micro-batches (``schedule.micro_batches``; the rules: :mod:`wansim.serving.micro_batching`).

:class:`MicroBatcher` keeps each micro-batch's members and the prompts waiting at S0, forms the
micro-batch's pass when S0 starts it (its verify passes plus prompt chunks within the budget),
tells the last stage whether a chunk completed its prompt, and whether the micro-batch still
has members after a verdict (else it stops circulating until a new member arrives, which
sends it into S0 again). A micro-batch travels as one :class:`MicroBatchMessage`.

Faults (:mod:`wansim.sim.faults`): a failure loses every micro-batch in flight with the prompt
chunks it carried (:meth:`MicroBatcher.lose_all`: the messages of the old epoch are dropped
where they are next handled, and no micro-batch circulates); at the outage's end each request
that was in the ring re-prefills its prompt plus the tokens it had committed into its own
micro-batch, chunked like any prompt (:meth:`MicroBatcher.reprefill`), and its micro-batch
starts again; a request that fails instead leaves its micro-batch.
"""

from __future__ import annotations

from collections import deque

from wansim.sim.messages import PREFILL, Pass
from wansim.sim.request import Request


class MicroBatchMessage(list):
    """A micro-batch's passes (a list, as any batch) and which micro-batch it is."""

    __slots__ = ("epoch", "index")

    def __init__(self, index: int, passes=(), epoch: int = 0):
        super().__init__(passes)
        self.index = index
        self.epoch = epoch  # the failures before it was sent (wansim.sim.faults)


class MicroBatcher:
    """``n_batches`` micro-batches; ``chunk_tokens``: the prompt tokens a pass carries at most
    (None: whole prompts); ``kick(message)`` puts a micro-batch that was not circulating into
    S0's mailbox."""

    def __init__(self, n_batches: int, chunk_tokens: int | None, kick):
        self.chunk_tokens = chunk_tokens
        self.kick = kick
        self.members = [0] * n_batches
        self.circulating = [False] * n_batches
        self.waiting: list[deque[list]] = [deque() for _ in range(n_batches)]  # [request, left]
        self.prompt_left: dict[int, int] = {}  # request id -> prompt tokens not yet computed
        self.batch_of: dict[int, int] = {}  # request id -> micro-batch
        self.freed = -1  # the micro-batch whose request finished last
        self.epoch = 0  # failures so far: a message of an older epoch was lost in one

    def message(self, index: int, passes=()) -> MicroBatchMessage:
        """Micro-batch ``index``'s message, of the current epoch."""
        return MicroBatchMessage(index, passes, self.epoch)

    def current(self, message: MicroBatchMessage) -> bool:
        """Whether the message was sent since the last failure (else it was lost in one)."""
        return message.epoch == self.epoch

    def admit(self, req: Request) -> None:
        """Join the micro-batch with the fewest members; its prompt waits at S0."""
        members = self.members
        m = min(range(len(members)), key=lambda i: (members[i], i != self.freed, i))
        members[m] += 1
        self.batch_of[req.rid] = m
        self._prompt(req, m, req.prompt_tokens)

    def _prompt(self, req: Request, m: int, tokens: int) -> None:
        """``tokens`` of prompt wait at S0 for micro-batch ``m``, which starts if idle."""
        self.prompt_left[req.rid] = tokens
        self.waiting[m].append([req, tokens])
        if not self.circulating[m]:
            self.circulating[m] = True
            self.kick(self.message(m))

    def lose_all(self) -> None:
        """A failure: every micro-batch in flight is lost with its prompt chunks, and none
        circulates until a member re-prefills or a request joins."""
        self.epoch += 1
        self.circulating = [False] * len(self.members)
        for waiting in self.waiting:
            waiting.clear()
        self.prompt_left.clear()

    def reprefill(self, req: Request, tokens: int) -> None:
        """Failover: the request's ``tokens`` (prompt + committed) into its own micro-batch."""
        self._prompt(req, self.batch_of[req.rid], tokens)

    def form(self, message: MicroBatchMessage) -> MicroBatchMessage:
        """S0 starts micro-batch ``message.index``: its verify passes plus prompt chunks, first
        come first served, up to the budget."""
        waiting = self.waiting[message.index]
        budget = self.chunk_tokens
        while waiting and (budget is None or budget > 0):
            entry = waiting[0]
            req, left = entry
            take = left if budget is None else min(left, budget)
            message.append(Pass(req, PREFILL, req.passes, take))
            if budget is not None:
                budget -= take
            if take == left:
                waiting.popleft()
            else:
                entry[1] = left - take
        return message

    def prompt_done(self, p: Pass) -> bool:
        """Last stage: whether this prefill chunk completes its request's prompt."""
        rid = p.request.rid
        left = self.prompt_left[rid] - p.n
        self.prompt_left[rid] = left
        return left <= 0

    def finished(self, req: Request) -> None:
        """The request's last verify completed: it leaves its micro-batch."""
        m = self.batch_of[req.rid]
        self.members[m] -= 1
        self.freed = m

    def still_circulates(self, index: int) -> bool:
        """After a verdict: whether micro-batch ``index`` goes back to S0 (it has members)."""
        going = self.members[index] > 0
        self.circulating[index] = going
        return going
