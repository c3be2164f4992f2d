"""The DES's event loop: SimPy's order of events in a lighter loop.

The sim's components need from an event loop a clock (``_now``), a call of a callback after a
delay (:meth:`Kernel.call`: a link's delivery, the end of a stage's pass, an arrival), and for
each stage server a start and wake-ups. SimPy orders events by the key (time, priority, eid),
eid a counter of every event scheduled, and runs an event's callbacks in the order they were
added. :class:`Kernel` keeps exactly that key, with the callback itself on the heap instead of
an event object (each of the sim's events has one callback; no failure, interrupt or ``until``
handling: the sim's events never fail and a run goes to its end); a stage server is the steps of its SimPy process as callbacks (the start
at SimPy's ``Initialize`` key (now, URGENT, eid), a wake-up at ``Event.succeed``'s (now, NORMAL,
eid)). So the components run on it in the same order, instant by instant and tie by tie, and
give the same record to the bit (checked against SimPy's loop, events and processes by a
hypothesis test over random scenarios: ``tests/engines/test_kernel_equality.py``).

:class:`Reference` is ``simpy.Environment`` itself with the same :meth:`~Reference.call` (a
``Timeout`` and its callback), where the stage servers are generator processes
(``simulate(..., per_event=True)``). :class:`Timeout` and :class:`Event` are lighter versions of
SimPy's for those processes: they push SimPy's own key and carry what its loop reads.
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import count

import simpy

URGENT = 0  # SimPy's priorities: a process's start runs before the instant's other events
NORMAL = 1


class Kernel:
    """The event loop: a heap of (time, priority, eid, callback); :meth:`run` pops the least
    key, advances the clock to it and calls the callback, until the heap is empty."""

    def __init__(self, initial_time: float = 0.0):
        self._now = initial_time
        self._queue: list = []
        self._eid = count()

    @property
    def now(self) -> float:
        return self._now

    def call(self, delay: float, callback) -> None:
        """``callback(None)`` after ``delay`` (SimPy's ``Timeout``: key (now + delay, NORMAL,
        next eid)); ``delay`` 0: where SimPy's ``Event.succeed`` would resume a process."""
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        heappush(self._queue, (self._now + delay, NORMAL, next(self._eid), callback))

    def start(self, callback) -> None:
        """``callback(None)`` now, before the instant's other events (a process's start)."""
        heappush(self._queue, (self._now + 0, URGENT, next(self._eid), callback))

    def run(self) -> None:
        queue = self._queue
        pop = heappop
        while queue:
            self._now, _, _, callback = pop(queue)
            callback(None)


class Reference(simpy.Environment):
    """SimPy's own loop, with :meth:`call` as the components use it on the Kernel."""

    def call(self, delay: float, callback) -> None:
        Timeout(self, delay).callbacks.append(callback)


class Event:
    """A one-shot event: pending until :meth:`succeed` schedules it now (SimPy's
    ``Event.succeed``: key (now, NORMAL, next eid)); its callbacks then run in order."""

    __slots__ = ("callbacks", "env")
    _ok = True  # (what SimPy's loop and processes read: the sim's events always succeed)
    _value = None

    def __init__(self, env):
        self.env = env
        self.callbacks = []

    def succeed(self) -> None:
        env = self.env
        heappush(env._queue, (env._now + 0, NORMAL, next(env._eid), self))


class Timeout:
    """An event that fires ``delay`` after now: scheduled when made (SimPy's ``Timeout``:
    key (now + delay, NORMAL, next eid))."""

    __slots__ = ("callbacks",)
    _ok = True
    _value = None

    def __init__(self, env, delay: float):
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        self.callbacks = []
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), self))
