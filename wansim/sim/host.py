"""The DES's shared host: exact processor sharing of the computes in progress
(``model.host_cores``, :mod:`wansim.stages.host_cpu`).

A stage hands its pass's CPU work (drafting + compute, ms when alone) to :meth:`SharedHost.
compute` and waits for the returned event. Between two changes of the set of jobs every job
progresses at ``share_rate(jobs, cores)``; on every arrival and completion the host advances
the jobs' remaining work to now and schedules one timeout for the next completion (an older
pending timeout is ignored when it fires).

Each job's wait (its time on the host less its work: the sharing's stretch) is summed per stage
(:meth:`SharedHost.wait_ms_per_job`), the DES's side of the real path's per-pass wait for a core
(:mod:`wansim.real.host_load`).
"""

from __future__ import annotations

import simpy
from simpy.events import Event, Timeout

from wansim.stages.host_cpu import share_rate

DONE_MS = 1e-9  # remaining work below this is finished (rounding of the advance)


class SharedHost:
    """Processor sharing of ``cores`` cores among the jobs computing at once."""

    def __init__(self, env: simpy.Environment, cores: int, stages: int = 1):
        self.env = env
        self.cores = int(cores)
        # [remaining CPU ms, event, start ms, work ms, stage], in arrival order
        self.jobs: list[list] = []
        self.updated_ms = 0.0
        self.generation = 0  # the pending completion timeout's; an older one is stale
        self.peak_jobs = 0
        # per stage: its finished jobs' summed time on the host and work, and their count
        self.held_ms = [0.0] * stages
        self.work_ms = [0.0] * stages
        self.done_jobs = [0] * stages

    def compute(self, work_ms: float, stage: int = 0) -> Event:
        """An event that succeeds when ``work_ms`` of CPU work has been served (a job of
        ``stage``'s)."""
        done = Event(self.env)
        if work_ms <= 0.0:
            done.succeed()
            return done
        self._advance()
        self.jobs.append([float(work_ms), done, self.env._now, float(work_ms), stage])
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
        now = self.env._now
        for job in finished:
            stage = job[4]
            self.held_ms[stage] += now - job[2]
            self.work_ms[stage] += job[3]
            self.done_jobs[stage] += 1
            job[1].succeed()
        self._schedule()

    def wait_ms_per_job(self) -> list[float | None]:
        """Per stage: the mean wait of its finished jobs (ms; rounding below 0 is 0), None
        where it finished none."""
        return [
            max(0.0, held - work) / n if n else None
            for held, work, n in zip(self.held_ms, self.work_ms, self.done_jobs, strict=True)
        ]
