"""A test-only pause point, so that tests interrupt or kill a process at a known moment instead
of racing it.

``WANSIM_HOLD_AFTER=LABEL:N`` makes the process stop right after its N-th ``LABEL`` checkpoint
(e.g. ``sweep-part:1``: after the sweep wrote its first shard) and wait there until a signal
ends the wait (SIGINT raises :class:`KeyboardInterrupt` inside it). A safety limit
(``WANSIM_HOLD_MAX_S``, default 300 s) lets a forgotten hold continue instead of hanging.
``WANSIM_HOLD_PIDFILE=PATH``: the holding process writes its pid there first (a test that kills
a stage process mid-run finds it so: the labels ``stage{i}-pass`` count stage i's passes).
Unset (every normal run), a checkpoint costs one environment lookup.
"""

from __future__ import annotations

import os
import time

ENV = "WANSIM_HOLD_AFTER"


def checkpoint(label: str, count: int) -> None:
    """Hold here if ``WANSIM_HOLD_AFTER`` names this label and count (see the module doc)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, n = spec.partition(":")
    if name != label or count != int(n or 1):
        return
    pidfile = os.environ.get("WANSIM_HOLD_PIDFILE")
    if pidfile:
        with open(pidfile + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(pidfile + ".tmp", pidfile)  # whole, never half written
    deadline = time.monotonic() + float(os.environ.get("WANSIM_HOLD_MAX_S", "300"))
    while time.monotonic() < deadline:
        time.sleep(0.05)
