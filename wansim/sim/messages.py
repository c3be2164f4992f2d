"""What travels through the pipeline: a pass (a block of tokens one request sends through the
stages) and the message a link carries (one pass, or a batch of passes as one tensor).

A pass is created at S0 (prefill, on admission) or at the last stage (the next verify pass,
right after a verdict) and is the unit the stages compute: ``n`` tokens of ``request`` at decode
``step`` (0 = prefill, 1.. = verify passes). The verdict and the next drafts ride the return hop
as the next step's pass, so one class covers the whole ring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wansim.sim.request import Request

PREFILL = 0
VERIFY = 1
KIND_NAMES = ("prefill", "verify")


class Pass:
    """``n`` tokens of one request at one step; ``kind`` is PREFILL or VERIFY."""

    __slots__ = ("gen", "kind", "n", "request", "step")
    tree = False  # a tree round's block (the per-round hybrid, wansim.sim.async_speculation)
    bet = False  # a block drafted on a bet: one more drafter pass (wansim.sim.async_speculation)

    def __init__(self, request: Request, kind: int, step: int, n: int):
        self.request = request
        self.gen = request.gen  # a failure renews the request's generation (wansim.sim.faults)
        self.kind = kind
        self.step = step
        self.n = n

    def label(self) -> str:
        """``r3 verify 5``: request, kind, step (Perfetto slice names)."""
        return f"r{self.request.rid} {KIND_NAMES[self.kind]} {self.step}"

    def __repr__(self) -> str:
        return f"Pass({self.label()}, n={self.n})"


def batch_label(passes: list[Pass] | tuple[Pass, ...]) -> str:
    """One pass's label, or ``batch of 3: r1 verify 4, r2 prefill 0, ...``."""
    if len(passes) == 1:
        return passes[0].label()
    return f"batch of {len(passes)}: " + ", ".join(p.label() for p in passes)
