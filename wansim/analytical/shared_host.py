"""Stages sharing a host's cores (``model.host_cores``): the mean-value fixed point of
:mod:`wansim.stages.host_cpu`.

With ``slots`` = min(passes in flight, stages) <= cores no compute ever waits for a core and
the scenario is answered as if the host were unlimited. Otherwise every CPU cost on a stage
(its compute model, fixed overhead and cost per sequence, and the drafting where it runs on
that stage; an overlapped drafter is on its own device) is scaled by that stage's stretch
``s_i`` (:func:`scaled`), the engine answers the scaled scenario, its stage utilisations rho
(the stretch included) give each stage's stretch (:func:`wansim.stages.host_cpu.
stage_stretches`: the other passes computing at the other stages), and ``s`` solves
s = stretches(rho(s)) by iteration from s = 1 (damped once it stops shrinking its step; at
most :data:`MAX_STEPS`). A grid (``stages`` an array) takes one stretch for every stage,
s = mean_stretch(m(s)) on [1, slots / cores] (Brent). The answer is that of the scaled
scenario, with ``details.shared_host`` (cores, slots, stretch: the computing passes' mean,
stage_stretch, computing, steps, converged) and the approximation marked unvalidated
(agreement with the DES is tested on a few cases, not measured across a regime).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.analytical.regime import unvalidated
from wansim.config.model import LinearCompute, MoeCompute, RooflineCompute, TableCompute
from wansim.config.scenario import Scenario
from wansim.numerics.brentq import brentq
from wansim.results.result import Result
from wansim.speculation.block_schedule import uses_blocks
from wansim.stages.host_cpu import mean_stretch, passes_in_flight, stage_stretches

MAX_STEPS = 200
TOLERANCE = 1e-6  # the largest change of a stage's stretch at the fixed point (Brent's xtol before)


def shared_host_slots(scenario: Scenario) -> int:
    """Passes that can compute at once: min(passes in flight, stages)."""
    return min(passes_in_flight(scenario), int(np.max(scenario.stages)))


def contended(scenario: Scenario) -> bool:
    """Whether computes can overlap beyond the host's cores."""
    cores = scenario.model.host_cores
    return cores is not None and shared_host_slots(scenario) > cores


def scaled_compute(model, factor: float):
    """A compute model whose every pass costs ``factor`` times as long (exactly)."""
    if isinstance(model, LinearCompute):
        return dataclasses.replace(
            model, base_ms=model.base_ms * factor, per_token_ms=model.per_token_ms * factor
        )
    if isinstance(model, (RooflineCompute, MoeCompute)):  # overhead + max(memory, flops) times
        return dataclasses.replace(
            model,
            overhead_ms=model.overhead_ms * factor,
            mem_bandwidth_gbs=model.mem_bandwidth_gbs / factor,
            peak_tflops=model.peak_tflops / factor,
        )
    if isinstance(model, TableCompute):
        return dataclasses.replace(model, points=tuple((n, ms * factor) for n, ms in model.points))
    raise TypeError(f"unknown compute model {model!r}")


def scaled(scenario: Scenario, factor) -> Scenario:
    """The scenario with every CPU cost on the host ``factor`` times as long (a number: every
    stage; a sequence: per stage) and no shared host left (module docstring)."""
    each = np.atleast_1d(np.asarray(factor, dtype=float))
    m = scenario.model
    drafter = scenario.drafter
    on_stage = not (uses_blocks(scenario) and drafter.overlap)  # the drafter runs on a stage
    if each.size == 1 or np.all(each == each[0]):
        f = float(each[0])
        model = dataclasses.replace(
            m,
            compute=scaled_compute(m.compute, f),
            stage_compute=tuple(scaled_compute(c, f) for c in m.stage_compute),
            host_cpu_factor=m.host_cpu_factor * f,  # the fixed overheads
            host_cores=None,
        )
        draft_f = f
    else:
        stages = len(each)
        over = m.stage_overhead_ms or (m.overhead_ms,) * stages
        seq = m.stage_sequence_ms or (m.sequence_ms,) * stages
        model = dataclasses.replace(
            m,
            stage_compute=tuple(
                scaled_compute(c, f)
                for c, f in zip(scenario.stage_compute_models(), each, strict=True)
            ),
            stage_overhead_ms=tuple(float(o * f) for o, f in zip(over, each, strict=True)),
            stage_sequence_ms=tuple(float(c * f) for c, f in zip(seq, each, strict=True)),
            host_cores=None,
        )
        draft_f = float(each[0] if drafter.placement == "first_stage" else each[-1])
    if on_stage:
        drafter = dataclasses.replace(
            drafter, draft_ms=drafter.draft_ms * draft_f, width_ms=drafter.width_ms * draft_f
        )
    return dataclasses.replace(scenario, model=model, drafter=drafter)


def analyze_shared_host(scenario: Scenario, analyze) -> Result:
    """``analyze`` (scenario -> Result, no shared host) at the fixed-point stretches."""
    cores = int(scenario.model.host_cores)
    slots = shared_host_slots(scenario)
    answers: dict[tuple, Result] = {}

    def answer(s) -> Result:
        key = tuple(float(x) for x in np.atleast_1d(s))
        if len(set(key)) == 1:  # every stage alike: one scenario (scaled), one key
            key = key[:1]
        if key not in answers:
            answers[key] = analyze(scaled(scenario, np.asarray(key)))
        return answers[key]

    def utilization(s) -> np.ndarray:
        return np.asarray(answer(s).metrics["stage_utilization"], dtype=float)

    if np.ndim(scenario.stages) == 0:
        stretch, steps, converged = _stage_fixed_point(utilization, slots, cores)
    else:
        stretch, steps, converged = _one_stretch(utilization, slots, cores), 0, True
    res = answer(stretch)
    rho = utilization(stretch)
    appr = unvalidated(
        res.approximation,
        "shared host (mean-value processor sharing)",
        "computes share the host's cores: a mean-value fixed point, its error against the "
        "DES not measured across a regime",
    )
    each = np.atleast_1d(stretch)
    details = {
        **res.details,
        "shared_host": {
            "cores": cores,
            "slots": slots,
            # the mean stretch a computing pass sees (its stage's, by the stages' loads)
            "stretch": float(np.sum(rho * each) / np.sum(rho)) if np.sum(rho) > 0 else 1.0,
            "stage_stretch": [float(x) for x in each],
            "computing": float(np.sum(rho)),
            "steps": steps,
            "converged": converged,
        },
    }
    return dataclasses.replace(res, scenario=scenario, details=details, approximation=appr)


def _stage_fixed_point(utilization, slots: int, cores: int):
    """s = stage_stretches(rho(s)) from s = 1: plain steps while they shrink, then halved
    (the stages' stretches pull against each other through the throughput)."""
    s = np.ones(len(utilization(1.0)))
    step_size, last = 1.0, np.inf
    for steps in range(1, MAX_STEPS + 1):
        target = stage_stretches(utilization(s), slots, cores)
        change = float(np.max(np.abs(target - s)))
        if change <= TOLERANCE:
            return target, steps, True
        if change >= last:
            step_size *= 0.5
        last = change
        s = s + step_size * (target - s)
    return s, MAX_STEPS, False


def _one_stretch(utilization, slots: int, cores: int) -> float:
    """s = mean_stretch(m(s)) on [1, slots / cores] (Brent; a grid's every stage alike)."""

    def gap(s: float) -> float:
        return mean_stretch(float(np.sum(utilization(s))), slots, cores) - s

    top = slots / cores
    if gap(1.0) <= 0.0:
        return 1.0
    if gap(top) >= 0.0:
        return top
    return brentq(gap, 1.0, top, xtol=1e-6)
