"""A pass after an idle costs more (``model.idle_cost``): the analytical engine's fixed point.

Each stage's mean idle before a pass is ``s (1 - rho) / rho``: its mean busy time per pass
``s`` (a verify pass of the batch's tokens, plus the drafting where the drafter runs on the
stage) at its utilisation ``rho`` (one request in the sync schedule: the lap less the stage's
busy time; ``rho = 0``: the end of the table). The extra of that idle
(:func:`wansim.stages.idle_cost.extra_ms`) joins the stage's fixed cost per pass
(``model.stage_overhead_ms``), the scenario is answered without the idle cost, its
utilisations give the next idles, and so on to a fixed point (plain iteration, averaged with
the previous step after :data:`UNDAMPED` steps). Assumption: every pass idles the stage's mean
(the extra of the mean idle, not the mean of the extras; prefills and queued passes are not
told apart), so the answer is ``validated: false``; its agreement with the DES is tested in
tests/physics/test_idle_cost.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.analytical.regime import unvalidated
from wansim.analytical.sync import lap_parts
from wansim.config.scenario import IdleCost, Scenario
from wansim.results.result import Result
from wansim.speculation.block_schedule import uses_blocks
from wansim.stages import idle_cost
from wansim.stages.compute import stage_ms_each

MAX_STEPS = 200
UNDAMPED = 20
TOLERANCE_MS = 1e-9


def with_extras(scenario: Scenario, extras) -> Scenario:
    """The scenario without its idle cost, each stage's fixed cost per pass raised by its
    extra ms (``model.stage_overhead_ms``, which ``host_cpu_factor`` multiplies)."""
    m = scenario.model
    base = m.stage_overhead_ms or (m.overhead_ms,) * int(scenario.stages)
    overheads = tuple(
        float(o) + float(e) / m.host_cpu_factor for o, e in zip(base, extras, strict=True)
    )
    model = dataclasses.replace(
        m, stage_overhead_ms=overheads, idle_cost=IdleCost(), stage_idle_cost=()
    )
    return dataclasses.replace(scenario, model=model)


def busy_per_pass_ms(scenario: Scenario) -> np.ndarray:
    """Per stage, its mean busy ms per pass: a verify pass of the batch's tokens, plus the
    drafting on the stage that drafts (none for an overlapped drafter)."""
    parts = lap_parts(scenario)
    b, n = float(np.asarray(parts["batch"])), float(np.asarray(parts["tokens"]))
    busy = np.array([float(np.asarray(c)) for c in stage_ms_each(scenario, b * n)])
    if not (uses_blocks(scenario) and scenario.drafter.overlap):
        at = 0 if scenario.drafter.placement == "first_stage" else len(busy) - 1
        busy[at] += float(np.asarray(parts["draft_ms"]))
    return busy


def mean_idle_ms(busy_ms: np.ndarray, utilisation) -> np.ndarray:
    """Per stage, the mean idle before a pass: busy (1 - rho) / rho (inf where rho = 0)."""
    rho = np.clip(np.asarray(utilisation, dtype=float), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(rho > 0, busy_ms * (1.0 - rho) / np.where(rho > 0, rho, 1.0), np.inf)


def fixed_point(scenario: Scenario, analyze) -> tuple[Scenario, Result, dict]:
    """(the scenario with the fixed point's extras, its answer by ``analyze``, the details:
    per stage idle ms and extra ms, steps, converged)."""
    stages = int(scenario.stages)
    tables = idle_cost.stage_tables(scenario.model, stages)

    def extras_at(idle: np.ndarray) -> np.ndarray:
        return np.array(
            [
                0.0 if t is None else float(idle_cost.extra_ms(g, *t))
                for g, t in zip(idle, tables, strict=True)
            ]
        )

    extras = np.zeros(stages)
    steps, converged = 0, False
    while steps < MAX_STEPS:
        steps += 1
        scaled = with_extras(scenario, extras)
        result = analyze(scaled)
        idle = mean_idle_ms(busy_per_pass_ms(scaled), result.metrics["stage_utilization"])
        new = extras_at(idle)
        if steps > UNDAMPED:
            new = 0.5 * (new + extras)
        if np.max(np.abs(new - extras)) <= TOLERANCE_MS:
            converged = True
            extras = new
            break
        extras = new
    scaled = with_extras(scenario, extras)
    result = analyze(scaled)
    idle = mean_idle_ms(busy_per_pass_ms(scaled), result.metrics["stage_utilization"])
    details = {
        "idle_ms": [float(v) if np.isfinite(v) else None for v in idle],
        "extra_ms": [float(e) for e in extras],
        "steps": steps,
        "converged": converged,
    }
    return scaled, result, details


def analyze_idle_cost(scenario: Scenario, analyze) -> Result:
    """``analyze`` (scenario -> Result, no idle cost) at the fixed point's extras."""
    _, res, details = fixed_point(scenario, analyze)
    appr = unvalidated(
        res.approximation,
        "idle cost (mean idle per stage)",
        "a pass after an idle costs more: each stage's extra at its mean idle, a fixed point"
        " (wansim/analytical/idle_cost.py), checked against the DES in"
        " tests/physics/test_idle_cost.py, not on the approximation-error grid",
    )
    return dataclasses.replace(
        res, scenario=scenario, details={**res.details, "idle_cost": details}, approximation=appr
    )
