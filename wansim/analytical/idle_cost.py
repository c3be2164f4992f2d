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

from wansim.analytical.path import hop_bytes
from wansim.analytical.regime import unvalidated
from wansim.analytical.sync import forward_sizes, lap_parts
from wansim.config.model import IdleCost
from wansim.config.network import HopOverride
from wansim.config.scenario import Scenario
from wansim.links.delivery import busy_ms
from wansim.links.expected_delay import hop_mean
from wansim.results.result import Result
from wansim.speculation.block_schedule import uses_blocks
from wansim.stages import idle_cost
from wansim.stages.compute import stage_ms_each

MAX_STEPS = 200
UNDAMPED = 20
TOLERANCE_MS = 1e-9


def with_extras(scenario: Scenario, extras, hop_extras=None) -> Scenario:
    """The scenario without its idle costs, each stage's fixed cost per pass raised by its
    extra ms (``model.stage_overhead_ms``, which ``host_cpu_factor`` multiplies) and, with
    ``hop_extras``, each hop's ``per_message_ms`` by its own."""
    m = scenario.model
    base = m.stage_overhead_ms or (m.overhead_ms,) * int(scenario.stages)
    overheads = tuple(
        float(o) + float(e) / m.host_cpu_factor for o, e in zip(base, extras, strict=True)
    )
    model = dataclasses.replace(
        m, stage_overhead_ms=overheads, idle_cost=IdleCost(), stage_idle_cost=()
    )
    net = scenario.network
    if hop_extras is not None:
        over = net.hops or (HopOverride(),) * int(scenario.stages)
        hops = tuple(
            dataclasses.replace(o, per_message_ms=h.per_message_ms + float(e))
            for o, h, e in zip(over, scenario.resolved_hops(), hop_extras, strict=True)
        )
        net = dataclasses.replace(net, hops=hops, idle_cost=IdleCost())
    return dataclasses.replace(scenario, model=model, network=net)


def busy_per_pass_ms(scenario: Scenario, parts: dict | None = None) -> np.ndarray:
    """Per stage, its mean busy ms per pass: a verify pass of the batch's tokens, plus the
    drafting on the stage that drafts (none for an overlapped drafter). ``parts``: the
    scenario's :func:`lap_parts`, where already at hand."""
    parts = lap_parts(scenario) if parts is None else parts
    b, n = float(np.asarray(parts["batch"])), float(np.asarray(parts["tokens"]))
    busy = np.array([float(np.asarray(c)) for c in stage_ms_each(scenario, b * n, sequences=b)])
    if not (uses_blocks(scenario) and scenario.drafter.overlap):
        at = 0 if scenario.drafter.placement == "first_stage" else len(busy) - 1
        busy[at] += float(np.asarray(parts["draft_ms"]))
    return busy


def message_busy_ms(scenario: Scenario, parts: dict | None = None) -> np.ndarray:
    """Per hop, how long a verify pass's message holds its sender (the delivery rule's busy
    without losses: per-message cost, codec, one serialisation). ``parts``: as
    :func:`busy_per_pass_ms`."""
    parts = lap_parts(scenario) if parts is None else parts
    hops = scenario.resolved_hops()
    return np.asarray(
        [
            busy_ms(size, hop.bandwidth_mbps, hop.per_message_ms, hop.codec_ms_per_mb, 0)
            for hop, size in zip(hops, message_bytes(parts, len(hops)), strict=True)
        ],
        dtype=float,
    )


def message_bytes(parts: dict, hops: int) -> list[float]:
    """Per hop, the bytes of a verify pass's message (``parts``: :func:`lap_parts`): the
    forward message on hops 0 .. P - 2 (each its own with ``payload.extra_tensors``), the
    return message on the last."""
    fwd = forward_sizes(parts)
    return [
        float(np.asarray(parts["return_bytes"] if h == hops - 1 else hop_bytes(fwd, h)))
        for h in range(hops)
    ]


def pass_interval_ms(busy_ms: np.ndarray, utilisation) -> np.ndarray:
    """Per stage, the mean time between the starts of its passes: busy / rho (inf where rho
    = 0). A stage idles it less its own busy time, ``busy (1 - rho) / rho``; hop i, which
    carries one message per pass of stage i, idles it less its message's busy time."""
    rho = np.clip(np.asarray(utilisation, dtype=float), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(rho > 0, busy_ms / np.where(rho > 0, rho, 1.0), np.inf)


def host_idle(
    scenario: Scenario, parts: dict, stage_idle: np.ndarray, utilisation
) -> tuple[np.ndarray, np.ndarray]:
    """Per stage, with ``model.idle_follows: host`` (every stage on one host): (the host's
    idle before the stage's pass when nothing else runs, the chance ``q`` that nothing else
    runs as it starts). The idle: the incoming hop's mean time (:func:`hop_mean`; with one
    pass in flight the host has no other work while the message travels), at most the stage's
    own idle. ``q = prod_{j != i} (1 - rho_j (N - 1) / N)``, N the passes in flight (requests
    times blocks): the other N - 1 occupy the other stages independently (N = 1: q = 1)."""
    from wansim.analytical.engine import in_flight

    hops = scenario.resolved_hops()
    stages = len(hops)
    sizes = message_bytes(parts, stages)
    # the hop into stage i: hop i - 1 (stage 0: the return hop)
    travel = np.array(
        [float(np.asarray(hop_mean(hops[i - 1], sizes[i - 1]))) for i in range(stages)]
    )
    idle = np.minimum(travel, stage_idle)
    blocks = scenario.schedule.max_inflight_blocks if uses_blocks(scenario) else 1
    n = max(1, in_flight(scenario) * int(blocks))
    busy_others = np.clip(np.asarray(utilisation, dtype=float), 0.0, 1.0) * (n - 1) / n
    free = 1.0 - busy_others
    q = np.array([np.prod(np.delete(free, i)) for i in range(stages)])
    return idle, q


def fixed_point(scenario: Scenario, analyze) -> tuple[Scenario, Result, dict]:
    """(the scenario with the fixed point's extras, its answer by ``analyze``, the details:
    per stage idle ms and extra ms, per hop with ``network.idle_cost``, steps, converged).
    One vector iterates: the stages' extras, then the hops' where they pay one."""
    stages = int(scenario.stages)
    hop_table = idle_cost.table(scenario.network.idle_cost)
    tables = idle_cost.stage_tables(scenario.model, stages)
    if hop_table is not None:
        tables = tables + [hop_table] * stages

    follows_host = scenario.model.idle_follows == "host"

    def step(x: np.ndarray):
        scaled = with_extras(scenario, x[:stages], None if hop_table is None else x[stages:])
        result = analyze(scaled)
        parts = lap_parts(scaled)
        busy = busy_per_pass_ms(scaled, parts)
        util = result.metrics["stage_utilization"]
        every = pass_interval_ms(busy, util)
        idle = every - busy
        # the chance each idle is the one paid (else 0 ms: the host is working)
        weight = np.ones(len(tables))
        if follows_host:
            idle, weight[:stages] = host_idle(scaled, parts, idle, util)
        if hop_table is not None:
            idle = np.concatenate([idle, np.maximum(every - message_busy_ms(scaled, parts), 0.0)])
        return scaled, result, idle, weight

    extras = np.zeros(len(tables))
    steps, converged = 0, False
    while steps < MAX_STEPS:
        steps += 1
        scaled, result, idle, weight = step(extras)
        new = np.array(
            [
                0.0
                if t is None
                else w * float(idle_cost.extra_ms(g, *t))
                + (1.0 - w) * float(idle_cost.extra_ms(0.0, *t))
                for g, t, w in zip(idle, tables, weight, strict=True)
            ]
        )
        if steps > UNDAMPED:
            new = 0.5 * (new + extras)
        if np.max(np.abs(new - extras)) <= TOLERANCE_MS:  # (the answer is the one at these extras)
            converged = True
            break
        extras = new
    if not converged:
        scaled, result, idle, weight = step(extras)

    def listed(values) -> list:
        return [float(v) if np.isfinite(v) else None for v in values]

    details = {
        "idle_follows": scenario.model.idle_follows,
        "idle_ms": listed(idle[:stages]),
        "extra_ms": [float(e) for e in extras[:stages]],
        "steps": steps,
        "converged": converged,
    }
    if hop_table is not None:
        details["hop_idle_ms"] = listed(idle[stages:])
        details["hop_extra_ms"] = [float(e) for e in extras[stages:]]
    return scaled, result, details


def analyze_idle_cost(scenario: Scenario, analyze) -> Result:
    """``analyze`` (scenario -> Result, no idle cost) at the fixed point's extras."""
    _, res, details = fixed_point(scenario, analyze)
    appr = unvalidated(
        res.approximation,
        "idle cost (mean idle per stage and hop)",
        "a pass after an idle costs more: each stage's extra at its mean idle, a fixed point"
        " (wansim/analytical/idle_cost.py), checked against the DES in"
        " tests/physics/test_idle_cost.py, not on the approximation-error grid",
    )
    return dataclasses.replace(
        res, scenario=scenario, details={**res.details, "idle_cost": details}, approximation=appr
    )
