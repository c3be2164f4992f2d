"""Stages sharing one host's CPU cores: processor sharing (``model.host_cores``).

Model: every stage (and the drafting on its stage) runs on one host of N cores, one thread per
stage (the real path: one single-threaded process per stage). A pass's compute, and the
drafting before or after it, is a job of ``w`` ms of CPU work: its service time when it runs
alone. While ``j`` jobs compute at once each progresses at :func:`share_rate` = min(1, N / j)
(processor sharing: the kernel's fair scheduler, to a first approximation), so a job that never
overlaps more than N - 1 others takes ``w`` ms, and one overlapped by more takes longer; the
work done is conserved. ``host_cores: null`` (the default) is an unlimited host: every stage its
own CPU, today's engines. Not on the host: the link emulator's relays and their per-message
cost (``per_message_ms``), and an overlapped drafter on its own device (``drafter.overlap``).

- DES (``wansim.sim.host``): exact processor sharing of the jobs in progress.
- Analytical (``wansim.analytical.shared_host``): the mean-value equivalent. With ``m`` passes
  computing at once on average (Little's law: the sum of the stages' utilisations, which
  include the stretch) out of ``slots`` = min(passes in flight, stages) that can (a stage
  serves one pass at a time), a pass computing at stage i sees the other slots computing
  independently, each with probability q_i = (m - rho_i) / (slots - rho_i): the passes' time
  computing at the other stages over their time away from stage i (a saturated stage does
  not count its own load as the others'), so Y_i ~ Binomial(slots - 1, q_i) others, and its
  mean stretch is :func:`stage_stretches` = E[max(1, (1 + Y_i) / N)]. The engine solves the
  fixed point s_i = stretch_i(rho(s)), each stage's costs times its own s_i (a grid of
  scenarios: one stretch for every stage, :func:`mean_stretch`, q = m / slots). With one pass
  in flight (slots = 1) the stretch is 1 exactly; at saturation it tends to slots / N.
"""

from __future__ import annotations

import math

import numpy as np


def share_rate(jobs: int, cores: int) -> float:
    """CPU ms each job receives per ms while ``jobs`` jobs compute on ``cores`` cores."""
    return 1.0 if jobs <= cores else cores / jobs


def mean_stretch(computing: float, slots: int, cores: int) -> float:
    """E[max(1, (1 + Y) / cores)], Y ~ Binomial(slots - 1, computing / slots): a computing
    pass's mean slowdown when ``computing`` passes (of ``slots`` that can) compute at once on
    average, every stage alike (module docstring)."""
    if slots <= cores:
        return 1.0
    return _binomial_stretch(computing / slots, slots, cores)


def stage_stretches(utilization, slots: int, cores: int) -> np.ndarray:
    """Per stage i: E[max(1, (1 + Y_i) / cores)], Y_i ~ Binomial(slots - 1, q_i), q_i =
    (m - rho_i) / (slots - rho_i) with ``utilization`` rho (the stretch included) and m their
    sum (module docstring)."""
    rho = np.asarray(utilization, dtype=float)
    if slots <= cores:
        return np.ones_like(rho)
    m = float(np.sum(rho))
    return np.array([_binomial_stretch((m - r) / (slots - r), slots, cores) for r in rho])


def _binomial_stretch(q: float, slots: int, cores: int) -> float:
    q = min(max(q, 0.0), 1.0)
    others = np.arange(slots)  # Y = 0 .. slots - 1
    pmf = np.array([math.comb(slots - 1, y) for y in others], dtype=float)
    pmf *= q**others * (1.0 - q) ** (slots - 1 - others)
    return float(np.sum(pmf * np.maximum(1.0, (1.0 + others) / cores)))


def passes_in_flight(scenario) -> int:
    """Passes that can be in the pipeline at once (the analytical engine's ``slots`` before the
    cap at the stages): a continuous batch moves as one pass (``schedule.micro_batches`` of
    them, else one); otherwise one per request in flight (:func:`wansim.serving.micro_batching.
    serving_slots`), times ``schedule.max_inflight_blocks`` under the async schedule."""
    from wansim.serving.micro_batching import serving_slots

    sched = scenario.schedule
    if sched.batching == "continuous":
        return int(sched.micro_batches or 1)
    slots = int(np.max(serving_slots(scenario)))
    return slots * (int(sched.max_inflight_blocks) if sched.kind == "async" else 1)
