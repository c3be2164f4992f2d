"""What the analytical engine answers, and how: a grid in one vectorised call, point by point
(:func:`needs_points`: a fixed point or an expectation that does not broadcast), or refused
with one line naming the field (:func:`check_supported`; the DES answers the rest).

The list of what is modelled is :func:`check_supported`'s docstring; each refusal names why
(the measured miss that keeps it out is in the module that would answer it, e.g.
:mod:`wansim.analytical.transport` for tcp)."""

from __future__ import annotations

from typing import Any

import numpy as np

from wansim.config.scenario import Scenario
from wansim.errors import ScenarioError
from wansim.speculation.block_schedule import uses_blocks
from wansim.speculation.hybrid_rounds import check_tree_rounds, is_hybrid
from wansim.stages import idle_cost


def check_supported(scenario: Scenario) -> None:
    """What the analytical engine models:

    - the sync schedule, one request at a time (closed forms), any policy (none, chain, tree,
      a chain with hedge branches) and verifier rule;
    - continuous batching of ``workload.concurrency`` sequences (``schedule.batching:
      continuous``, sync): the lockstep batch plus its admissions in steady state
      (:mod:`wansim.analytical.batched`), or with ``schedule.micro_batches`` several batches
      in flight (:mod:`wansim.analytical.micro_batched`);
    - N concurrent requests without batching (``batching: none``): the closed-network
      approximation of :mod:`wansim.analytical.concurrent`;
    - the block schedule - async in-pipe speculation and the overlapped drafter (max(.) law) -
      with chains, one request or N without batching (:mod:`wansim.analytical.blocks`);
    - open arrivals (poisson, gamma, onoff, trace) of like requests over any of these: the
      closed model at each number in service as a birth-death queue
      (:mod:`wansim.analytical.open_arrivals`).

    The rest is refused with a one-line error."""
    sched = scenario.schedule
    blocks = uses_blocks(scenario)
    field = "schedule.kind" if sched.kind == "async" else "drafter.overlap"
    value = sched.kind if sched.kind == "async" else True
    wl = scenario.workload
    closed = wl.arrival == "closed"
    unsupported = [
        (
            "workload.arrival",
            wl.arrival,
            closed or all(np.ndim(v) == 0 for v in (wl.concurrency, wl.requests, wl.rate_per_s)),
            "open arrivals on a grid (one point at a time) are",
        ),
        (
            field,
            value,
            not (blocks and scenario.speculation.policy == "tree"),
            "bets on a chain's drafts; trees are",
        ),
        (
            field,
            value,
            not (blocks and sched.hedge_branches),
            "bets on a chain; hedge branches are",
        ),
        (
            "schedule.batching",
            sched.batching,
            not (blocks and sched.batching == "continuous" and scenario.drafter.overlap),
            "an overlapped drafter with continuous batching is",
        ),
    ]
    if is_hybrid(scenario):
        check_tree_rounds(scenario)
    net = scenario.network
    if net.transport == "tcp":
        scalar = all(
            np.ndim(v) == 0
            for v in (
                scenario.stages,
                net.latency_ms,
                net.loss_rate,
                net.bandwidth_mbps,
                scenario.workload.concurrency,
                scenario.workload.requests,
                scenario.k,
            )
        )
        unsupported.append(
            (
                "network.transport",
                "tcp",
                scalar,
                "tcp on a grid (one point at a time) is",
            )
        )
    if scenario.faults.events:
        scalar = all(np.ndim(v) == 0 for v in (wl.requests, wl.concurrency, scenario.stages))
        unsupported.append(
            (
                "faults.events",
                f"{len(scenario.faults.events)} events",
                scalar,
                "faults on a grid are",
            )
        )
    for path, value, ok, what in unsupported:
        if not ok:
            why = f"{what} not modelled by the analytical engine" if what else "not modelled by"
            why = why if what else "not modelled by the analytical engine"
            raise ScenarioError(path, f"{why} (use --engine des)", value)


def concurrent(scenario: Scenario) -> bool:
    """N > 1 requests without batching (the closed-network approximation)."""
    return scenario.schedule.batching == "none" and bool(
        np.any(np.asarray(scenario.workload.concurrency) > 1)
    )


def check_grid(scenario: Scenario) -> None:
    """What no grid answers, point by point or vectorised (one line, exit 2): open arrivals
    and the per-round hybrid (``wansim run`` evaluates them one scenario at a time)."""
    if scenario.workload.arrival != "closed":
        raise ScenarioError(
            "workload.arrival",
            "open arrivals are evaluated one scenario at a time (wansim run), not on a grid",
            scenario.workload.arrival,
        )
    if is_hybrid(scenario):
        raise ScenarioError(
            "schedule.hybrid_confident_fraction",
            "the per-round hybrid is evaluated one scenario at a time (wansim run), not on a grid",
            scenario.schedule.hybrid_confident_fraction,
        )


def needs_points(scenario: Scenario) -> bool:
    """Whether a grid of the scenario is answered one point at a time (:func:`point_means`):
    TCP's window is a fixed point of the lap, faults an expected value over the whole run, a
    KV capacity an admission limit and its queue, a shared host a fixed point of the compute
    stretch; none of them broadcasts over a grid's values."""
    return point_field(scenario) is not None


def point_field(scenario: Scenario) -> tuple[str, Any] | None:
    """The field (and its value, for error lines) that makes a grid of the scenario go one
    point at a time (:func:`needs_points`), or None."""
    if scenario.faults.events:
        return "faults.events", f"{len(scenario.faults.events)} events"
    if idle_cost.in_scenario(scenario):
        return idle_cost.field_of(scenario), "points"
    if scenario.network.transport == "tcp":
        return "network.transport", "tcp"
    if scenario.workload.kv_capacity_tokens is not None:
        return "workload.kv_capacity_tokens", scenario.workload.kv_capacity_tokens
    if scenario.model.host_cores is not None:
        return "model.host_cores", scenario.model.host_cores
    return None
