"""The DES's shared host: exact processor sharing of the computes in progress
(``model.host_cores``, :mod:`wansim.stages.host_cpu`).

A stage hands its pass's CPU work (drafting + compute, ms when alone) to :meth:`SharedHost.
compute` and waits for the returned event. Between two changes of the set of jobs every job
progresses at ``share_rate(jobs, cores)``; on every arrival and completion the host advances
the jobs' remaining work to now and schedules one timeout for the next completion (an older
pending timeout is ignored when it fires).
"""

from __future__ import annotations

import simpy
from simpy.events import Event, Timeout

from wansim.stages.host_cpu import share_rate

DONE_MS = 1e-9  # remaining work below this is finished (rounding of the advance)


class SharedHost:
    """Processor sharing of ``cores`` cores among the jobs computing at once."""

    def __init__(self, env: simpy.Environment, cores: int):
        self.env = env
        self.cores = int(cores)
        self.jobs: list[list] = []  # [remaining CPU ms, event], in arrival order
        self.updated_ms = 0.0
        self.generation = 0  # the pending completion timeout's; an older one is stale
        self.peak_jobs = 0

    def compute(self, work_ms: float) -> Event:
        """An event that succeeds when ``work_ms`` of CPU work has been served."""
        done = Event(self.env)
        if work_ms <= 0.0:
            done.succeed()
            return done
        self._advance()
        self.jobs.append([float(work_ms), done])
        self.peak_jobs = max(self.peak_jobs, len(self.jobs))
        self._schedule()
        return done

    def _advance(self) -> None:
        now = self.env._now
        if self.jobs and now > self.updated_ms:
            served = (now - self.updated_ms) * share_rate(len(self.jobs), self.cores)
            for job in self.jobs:
                job[0] -= served
        self.updated_ms = now

    def _schedule(self) -> None:
        self.generation += 1
        if not self.jobs:
            return
        first = min(job[0] for job in self.jobs)
        wait = max(first, 0.0) / share_rate(len(self.jobs), self.cores)
        generation = self.generation
        Timeout(self.env, wait).callbacks.append(lambda _e: self._complete(generation))

    def _complete(self, generation: int) -> None:
        if generation != self.generation:  # the jobs changed since: a newer timeout is pending
            return
        self._advance()
        least = min(job[0] for job in self.jobs)
        finished = [job for job in self.jobs if job[0] <= least + DONE_MS]
        self.jobs = [job for job in self.jobs if job[0] > least + DONE_MS]
        for job in finished:
            job[1].succeed()
        self._schedule()
