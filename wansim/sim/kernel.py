"""The DES's event loop: SimPy's ordering rule in a lighter loop, and the events the sim uses.

The sim's components need three things from an event loop: a clock (``_now``), timeouts whose
callbacks run when they fire, and one-shot events that a component triggers (a stage's
wake-up). On SimPy a stage server is a generator process; on the Kernel it is the same steps as
callbacks (:class:`Start` stands for the process's start event). SimPy orders events by the key (time, priority,
eid), eid a counter of every event scheduled, and runs an event's callbacks in the order they
were added; :class:`Kernel` keeps exactly that key and rule with less work per event (no
failure, interrupt or ``until`` handling: the sim's events never fail and a run goes to its
end). So the same components run on it in the same order, instant by instant and tie by tie,
and give the same record to the bit (checked against ``simpy.Environment`` by a hypothesis test
over random scenarios: ``tests/engines/test_kernel_equality.py``).

:class:`Timeout` and :class:`Event` push SimPy's own key onto the loop's heap and carry the
attributes SimPy's loop reads (``callbacks``, ``_ok``, ``_value``), so the components use them
on either loop; ``simpy.Environment`` stays the reference (``simulate(..., per_event=True)``).
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import count

URGENT = 0  # SimPy's priorities: a process's start runs before the instant's other events
NORMAL = 1


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


class Start:
    """An event that fires now, before the instant's other events: how a server starts (the
    key of SimPy's ``Initialize`` of a process, (now, URGENT, next eid))."""

    __slots__ = ("callbacks",)
    _ok = True
    _value = None

    def __init__(self, env, callback):
        self.callbacks = [callback]
        heappush(env._queue, (env._now + 0, URGENT, next(env._eid), self))


class Kernel:
    """The event loop: a heap of (time, priority, eid, event); :meth:`run` pops the least key,
    advances the clock to it and runs the event's callbacks, until the heap is empty."""

    def __init__(self, initial_time: float = 0.0):
        self._now = initial_time
        self._queue: list = []
        self._eid = count()

    @property
    def now(self) -> float:
        return self._now

    def run(self) -> None:
        queue = self._queue
        pop = heappop
        while queue:
            self._now, _, _, event = pop(queue)
            callbacks = event.callbacks
            event.callbacks = None
            for callback in callbacks:
                callback(event)
