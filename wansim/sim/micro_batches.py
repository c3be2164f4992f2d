"""The DES's micro-batches (``schedule.micro_batches``; the rules: :mod:`wansim.serving.micro_batching`).

:class:`MicroBatcher` keeps each micro-batch's members and the prompts waiting at S0, forms the
micro-batch's pass when S0 starts it (its verify passes plus prompt chunks within the budget),
tells the last stage whether a chunk completed its prompt, and whether the micro-batch still
has members after a verdict (else it stops circulating until a new member arrives, which
sends it into S0 again). A micro-batch travels as one :class:`MicroBatchMessage`.
"""

from __future__ import annotations

from collections import deque

from wansim.sim.messages import PREFILL, Pass
from wansim.sim.request import Request


class MicroBatchMessage(list):
    """A micro-batch's passes (a list, as any batch) and which micro-batch it is."""

    __slots__ = ("index",)

    def __init__(self, index: int, passes=()):
        super().__init__(passes)
        self.index = index


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

    def admit(self, req: Request) -> None:
        """Join the micro-batch with the fewest members; its prompt waits at S0."""
        members = self.members
        m = min(range(len(members)), key=lambda i: (members[i], i != self.freed, i))
        members[m] += 1
        self.batch_of[req.rid] = m
        self.prompt_left[req.rid] = req.prompt_tokens
        self.waiting[m].append([req, req.prompt_tokens])
        if not self.circulating[m]:
            self.circulating[m] = True
            self.kick(MicroBatchMessage(m))

    def form(self, message: MicroBatchMessage) -> MicroBatchMessage:
        """S0 starts micro-batch ``message.index``: its verify passes plus prompt chunks, first
        come first served, up to the budget."""
        waiting = self.waiting[message.index]
        budget = self.chunk_tokens
        while waiting and (budget is None or budget > 0):
            entry = waiting[0]
            req, left = entry
            take = left if budget is None else min(left, budget)
            message.append(Pass(req, PREFILL, 0, take))
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
