"""When the host last worked: the idle a pass's cold start follows with ``model.idle_follows:
host`` (every stage on one host, :mod:`wansim.stages.idle_cost`).

One clock per run, shared by every stage. A piece of work (a stage's pass with its drafting,
a last stage's drafting after the verdicts) marks the host busy from its start: where its end
is known as it starts (no shared host) the clock holds the latest such end; on a shared host
(``model.host_cores``, whose processor sharing stretches a piece of work) it counts the
pieces running until each ends. The host's idle at an instant is 0 while any piece runs or
before the latest end, else the time since that end (the run's start before any work).
"""

from __future__ import annotations


class HostIdleClock:
    """The host's latest busy instant and its pieces of work in progress (module docstring)."""

    __slots__ = ("busy_until_ms", "running")

    def __init__(self) -> None:
        self.busy_until_ms = 0.0
        self.running = 0

    def idle_ms(self, now_ms: float) -> float:
        """How long the host has had no work at ``now_ms``."""
        if self.running:
            return 0.0
        return max(0.0, now_ms - self.busy_until_ms)

    def busy_until(self, end_ms: float) -> None:
        """A piece of work whose end is known runs until ``end_ms``."""
        if end_ms > self.busy_until_ms:
            self.busy_until_ms = end_ms

    def begin(self) -> None:
        """A piece of work whose end is not known yet (a shared host's) starts."""
        self.running += 1

    def end(self, now_ms: float) -> None:
        """That piece of work ends at ``now_ms``."""
        self.running -= 1
        self.busy_until(now_ms)
