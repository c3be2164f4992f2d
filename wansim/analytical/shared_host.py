"""Stages sharing a host's cores (``model.host_cores``): the mean-value fixed point of
:mod:`wansim.stages.host_cpu`.

With ``slots`` = min(passes in flight, stages) <= cores no compute ever waits for a core and
the scenario is answered as if the host were unlimited. Otherwise every CPU cost on the host
(each stage's compute model and fixed overhead, and the drafting on a stage; an overlapped
drafter is on its own device) is scaled by a stretch ``s`` (:func:`scaled`), the engine answers
the scaled scenario, the sum of its stage utilisations is ``m`` (passes computing at once, the
stretch included), and ``s`` solves s = mean_stretch(m(s)) on [1, slots / cores] (Brent: the
left end is never below the right side, the right end never above). The answer is that of the
scaled scenario, with ``details.shared_host`` (cores, slots, stretch, computing) and the
approximation marked unvalidated (agreement with the DES is tested on a few cases, not
measured across a regime).
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
from wansim.stages.host_cpu import mean_stretch, passes_in_flight


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


def scaled(scenario: Scenario, factor: float) -> Scenario:
    """The scenario with every CPU cost on the host ``factor`` times as long and no shared
    host left (module docstring)."""
    m = scenario.model
    model = dataclasses.replace(
        m,
        compute=scaled_compute(m.compute, factor),
        stage_compute=tuple(scaled_compute(c, factor) for c in m.stage_compute),
        host_cpu_factor=m.host_cpu_factor * factor,  # the fixed overheads
        host_cores=None,
    )
    drafter = scenario.drafter
    if not (uses_blocks(scenario) and drafter.overlap):  # the drafter runs on a stage
        drafter = dataclasses.replace(
            drafter, draft_ms=drafter.draft_ms * factor, width_ms=drafter.width_ms * factor
        )
    return dataclasses.replace(scenario, model=model, drafter=drafter)


def analyze_shared_host(scenario: Scenario, analyze) -> Result:
    """``analyze`` (scenario -> Result, no shared host) at the fixed-point stretch."""
    cores = int(scenario.model.host_cores)
    slots = shared_host_slots(scenario)
    answers: dict[float, Result] = {}

    def answer(s: float) -> Result:
        if s not in answers:
            answers[s] = analyze(scaled(scenario, s))
        return answers[s]

    def computing(s: float) -> float:
        return float(np.sum(answer(s).metrics["stage_utilization"]))

    def gap(s: float) -> float:
        return mean_stretch(computing(s), slots, cores) - s

    top = slots / cores
    if gap(1.0) <= 0.0:
        stretch = 1.0
    elif gap(top) >= 0.0:
        stretch = top
    else:
        stretch = brentq(gap, 1.0, top, xtol=1e-6)
    res = answer(stretch)
    appr = unvalidated(
        res.approximation,
        "shared host (mean-value processor sharing)",
        "computes share the host's cores: a mean-value fixed point, its error against the "
        "DES not measured across a regime",
    )
    details = {
        **res.details,
        "shared_host": {
            "cores": cores,
            "slots": slots,
            "stretch": stretch,
            "computing": computing(stretch),
        },
    }
    return dataclasses.replace(res, scenario=scenario, details=details, approximation=appr)
