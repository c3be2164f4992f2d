"""The host's CPU load over a real run: how many cores were busy, how many of them the run's
own processes kept busy, and how much the hypervisor stole.

The 1-minute load average cannot describe a run of a few seconds (a 3 s cell moves it by a
tenth), so a real measurement also records the CPU counters over exactly its own window:
``/proc/stat``'s first line (every CPU's jiffies by state, summed) and ``/proc/<pid>/stat``'s
user + system jiffies of each of the run's processes, read before and after. Over the window

    busy_cores   = (busy jiffies / all jiffies) x CPUs      busy: all but idle and iowait
    own_cores    = the run's processes' jiffies / (wall s x ticks per s)
    others_cores = max(busy_cores - own_cores, 0)          other tenants, the coordinator
    steal        = steal jiffies / all jiffies              the hypervisor's share

and the run's own cores by role (``own_cores_by_role``) where its pids are named: a name
less its trailing digits (``stage0`` -> ``stage``, ``link3`` -> ``link``; the calling process
is ``coordinator``), so a cell's relays and stages can be told apart. Where the pids are
named, each one's wait for a core too (``wait_ms_by_process``): the time its threads spent
runnable but not running, the second field of ``/proc/<pid>/task/<tid>/schedstat`` summed
over its threads (nanoseconds; absent where the kernel keeps no schedstats).

Linux only (elsewhere :func:`snapshot` returns None and the load is not recorded). Jiffies
are counted at the kernel's tick (usually 100 per second), so a window under a second carries
a few hundredths of a core of rounding.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

STAT = "/proc/stat"
IDLE_STATES = (3, 4)  # idle, iowait in /proc/stat's cpu line (user nice system idle iowait ...)
STEAL_STATE = 7


@dataclass(frozen=True)
class Snapshot:
    """CPU counters at one instant (jiffies)."""

    wall_s: float
    states: tuple[int, ...]  # /proc/stat's cpu line: user nice system idle iowait irq softirq steal
    processes: dict[int, int]  # pid -> user + system jiffies (0 once gone)
    waits: dict[int, int | None] = field(default_factory=dict)  # pid -> run delay ns, summed


@dataclass(frozen=True)
class HostLoad:
    """The host over a window (module docstring); ``seconds``: the window's wall time."""

    seconds: float
    busy_cores: float
    own_cores: float
    others_cores: float
    steal_fraction: float
    own_cores_by_role: tuple[tuple[str, float], ...] = ()  # (role, cores), roles sorted
    wait_ms_by_process: tuple[tuple[str, float], ...] = ()  # (name, ms runnable, not running)

    def as_dict(self) -> dict:
        out = {
            "seconds": round(self.seconds, 3),
            "busy_cores": round(self.busy_cores, 3),
            "own_cores": round(self.own_cores, 3),
            "others_cores": round(self.others_cores, 3),
            "steal_fraction": round(self.steal_fraction, 4),
        }
        if self.own_cores_by_role:
            out["own_cores_by_role"] = {r: round(c, 3) for r, c in self.own_cores_by_role}
        if self.wait_ms_by_process:
            out["wait_ms_by_process"] = {n: round(w, 3) for n, w in self.wait_ms_by_process}
        return out


def role(name: str) -> str:
    """A process name's role: the name less its trailing digits (``link12`` -> ``link``)."""
    return name.rstrip("0123456789") or name


def cpu_states(text: str) -> tuple[int, ...]:
    """The summed ``cpu`` line of a ``/proc/stat`` text: jiffies per state (at least 8)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            states = tuple(int(x) for x in fields[1:])
            if len(states) < 8:
                raise ValueError(f"/proc/stat cpu line has {len(states)} states, expected >= 8")
            return states
    raise ValueError("/proc/stat has no summed cpu line")


def process_jiffies(text: str) -> int:
    """User + system jiffies from a ``/proc/<pid>/stat`` text (the command name may hold
    spaces and parentheses: the fields after the last ``)`` are counted)."""
    rest = text[text.rfind(")") + 2 :].split()
    return int(rest[11]) + int(rest[12])  # utime, stime (fields 14 and 15)


def run_delay_ns(texts: Iterable[str]) -> int | None:
    """The summed run delay (ns) of a process's threads from their ``schedstat`` texts
    (``cpu_ns run_delay_ns timeslices``); None where none could be read."""
    total, seen = 0, False
    for text in texts:
        fields = text.split()
        if len(fields) >= 2:
            total += int(fields[1])
            seen = True
    return total if seen else None


def _process_run_delay_ns(pid: int) -> int | None:
    try:
        tids = os.listdir(f"/proc/{int(pid)}/task")
    except OSError:
        return None
    texts = (_read(f"/proc/{int(pid)}/task/{t}/schedstat") for t in tids)
    return run_delay_ns(t for t in texts if t)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def snapshot(pids: Iterable[int]) -> Snapshot | None:
    """The counters now, for the host and each pid (a pid that has exited counts 0); None where
    the host has no ``/proc/stat``."""
    text = _read(STAT)
    if text is None:
        return None
    processes, waits = {}, {}
    for pid in pids:
        own = _read(f"/proc/{int(pid)}/stat")
        processes[int(pid)] = process_jiffies(own) if own else 0
        waits[int(pid)] = _process_run_delay_ns(pid)
    return Snapshot(time.monotonic(), cpu_states(text), processes, waits)


def host_load(
    before: Snapshot | None,
    after: Snapshot | None,
    cpus: int | None = None,
    roles: dict[int, str] | None = None,
    names: dict[int, str] | None = None,
) -> HostLoad | None:
    """The load between two snapshots of the same pids (module docstring); None if either is
    missing or no time passed. ``cpus``: the machine's CPUs (default ``os.cpu_count()``);
    ``roles``: pid -> role, for the own cores by role; ``names``: pid -> name, for each one's
    wait for a core (where both snapshots read it)."""
    if before is None or after is None:
        return None
    seconds = after.wall_s - before.wall_s
    delta = [a - b for a, b in zip(after.states, before.states, strict=False)]
    total = sum(delta[:8])
    if seconds <= 0 or total <= 0:
        return None
    cpus = int(cpus or os.cpu_count() or 1)
    idle = sum(delta[i] for i in IDLE_STATES)
    busy_cores = (total - idle) / total * cpus
    ticks = os.sysconf("SC_CLK_TCK")
    used = {
        pid: max(after.processes.get(pid, 0) - j, 0)
        for pid, j in before.processes.items()
        if after.processes.get(pid, 0) > 0
    }
    own_cores = sum(used.values()) / ticks / seconds
    by_role: dict[str, int] = {}
    for pid, r in (roles or {}).items():
        by_role[r] = by_role.get(r, 0) + used.get(pid, 0)
    waits = []
    for pid, name in sorted((names or {}).items(), key=lambda x: x[1]):
        a, b = after.waits.get(pid), before.waits.get(pid)
        if a is not None and b is not None:
            waits.append((name, max(a - b, 0) / 1e6))
    return HostLoad(
        seconds=seconds,
        busy_cores=busy_cores,
        own_cores=own_cores,
        others_cores=max(busy_cores - own_cores, 0.0),
        steal_fraction=delta[STEAL_STATE] / total,
        own_cores_by_role=tuple((r, j / ticks / seconds) for r, j in sorted(by_role.items())),
        wait_ms_by_process=tuple(waits),
    )


def measured(
    pids: Iterable[int] | Mapping[str, int], work: Callable[[], object]
) -> tuple[object, HostLoad | None]:
    """``work()``'s result and the host's load while it ran, counting ``pids`` and this
    process as the run's own; named pids (name -> pid) are also counted by :func:`role`, and
    each one's wait for a core recorded."""
    named = isinstance(pids, Mapping)
    roles = (
        {int(p): role(n) for n, p in pids.items()} if named else dict.fromkeys(map(int, pids), "")
    )
    roles[os.getpid()] = "coordinator"
    before = snapshot(roles)
    result = work()
    names = {int(p): n for n, p in pids.items()} if named else None
    return result, host_load(before, snapshot(roles), roles=roles if named else None, names=names)
