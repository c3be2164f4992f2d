"""Build the pipeline and run it: ``simulate(scenario, *, timeline=False) -> Result``.

Components: P :class:`~wansim.sim.stage.Stage` processes, P :class:`~wansim.sim.link.Link`
hops (hop i carries S_i's output to S_(i+1); hop P-1 is the return hop to S0; with P = 1 the
ring is the return hop alone), one :class:`~wansim.sim.verifier.Verifier` at the last stage and
a :class:`~wansim.sim.request.RequestSource`. The run ends when every request has finished.

Random streams: ``np.random.SeedSequence(scenario.seed).spawn(3 + 2P)`` gives independent
generators, by position: 0 acceptance draws, 1 per-request difficulty, 2 arrivals, then for
each hop i: 3 + 2i propagation jitter, 4 + 2i losses. Same seed -> identical run.
"""

from __future__ import annotations

import functools

import numpy as np
import simpy

from wansim.compute import drafter_tree_ms, stage_ms
from wansim.errors import ScenarioError
from wansim.result import Result
from wansim.scenario import Scenario, hop_name
from wansim.sim.link import Link
from wansim.sim.messages import PREFILL, Pass
from wansim.sim.metrics import ci_method, compute_metrics, warmup_requests
from wansim.sim.record import Timeline, build_record
from wansim.sim.request import Request, RequestSource
from wansim.sim.stage import Stage
from wansim.sim.verifier import Verifier
from wansim.wire import forward_bytes, tree_mask_bytes, verdict_bytes


def check_supported(scenario: Scenario) -> None:
    """The DES runs the sync schedule with any speculation policy; the rest is refused."""
    sched = scenario.schedule
    refusals = [
        ("schedule.kind", sched.kind, sched.kind == "sync", "only the sync schedule is simulated"),
        (
            "schedule.max_inflight_blocks",
            sched.max_inflight_blocks,
            sched.max_inflight_blocks == 1,
            "the sync schedule keeps one block in flight per request",
        ),
    ]
    for path, value, ok, why in refusals:
        if not ok:
            raise ScenarioError(path, f"{why} by the DES", value)


def _cached(fn):
    """n tokens -> float, memoised (compute models are numpy functions; passes repeat sizes)."""
    cache: dict[int, float] = {}

    def get(n: int) -> float:
        v = cache.get(n)
        if v is None:
            v = cache[n] = float(fn(n))
        return v

    return get


def simulate(scenario: Scenario, *, timeline: bool = False) -> Result:
    """Run the discrete-event simulation; ``timeline=True`` also keeps every slice (Perfetto)."""
    check_supported(scenario)
    env = simpy.Environment()
    p_stages = scenario.stages
    streams = [
        np.random.default_rng(s)
        for s in np.random.SeedSequence(scenario.seed).spawn(3 + 2 * p_stages)
    ]
    tl = (
        Timeline(
            stage_names=[f"S{i}" for i in range(p_stages)],
            link_names=[hop_name(i, p_stages) for i in range(p_stages)],
        )
        if timeline
        else None
    )
    verifier = Verifier(scenario, streams[0], streams[1], tl.verify_log if tl else None)
    # the policy's costs (wansim.speculation): a drafter pass per batch plus the tree's width per
    # sequence, the tree mask per verified sequence on forward hops, and the verdict (with the
    # next tree when drafted on the last stage) per sequence on the return hop
    pol = verifier.policy
    tree_nodes = pol.nodes if pol.kind == "tree" else 0
    draft = float(drafter_tree_ms(scenario.drafter, pol.depth, pol.nodes, 0))
    draft_per_sequence = float(drafter_tree_ms(scenario.drafter, pol.depth, pol.nodes, 1)) - draft
    first_stage = scenario.drafter.placement == "first_stage"
    computes = [functools.partial(stage_ms, m) for m in scenario.stage_compute_models()]
    fwd_bytes = _cached(lambda n: forward_bytes(scenario.payload, scenario.model.hidden_size, n))
    stages = [
        Stage(
            env,
            i,
            p_stages,
            computes[i],
            fwd_bytes,
            float(verdict_bytes(scenario.payload, tree_nodes, not first_stage)),
            batching=scenario.schedule.batching == "continuous",
            draft_before_ms=draft if first_stage and i == 0 else 0.0,
            draft_after_ms=draft if not first_stage and i == p_stages - 1 else 0.0,
            draft_before_per_sequence_ms=draft_per_sequence if first_stage and i == 0 else 0.0,
            draft_after_per_sequence_ms=(
                draft_per_sequence if not first_stage and i == p_stages - 1 else 0.0
            ),
            mask_bytes_per_sequence=float(tree_mask_bytes(tree_nodes)),
            verifier=verifier,
            timeline=tl.stage_slices if tl else None,
        )
        for i in range(p_stages)
    ]
    links = [
        Link(
            env,
            i,
            hop,
            stages[(i + 1) % p_stages].receive,
            streams[3 + 2 * i],
            streams[4 + 2 * i],
            tl.transfers if tl else None,
        )
        for i, hop in enumerate(scenario.resolved_hops())
    ]

    def admit(req: Request) -> None:
        verifier.prepare(req)
        stages[0].receive([Pass(req, PREFILL, 0, req.prompt_tokens)])

    source = RequestSource(env, scenario.workload, streams[2], admit)
    for stage, link in zip(stages, links, strict=True):
        stage.link_out = link
        stage.source = source
    source.start()
    env.run()
    events = _events_scheduled(env)

    wl = scenario.workload
    record = build_record(source.requests, stages, links, verifier, wl.concurrency, events, tl)
    unfinished = int(np.isnan(record.finish_ms).sum())
    if unfinished:  # cannot happen with a correct engine; never report partial metrics
        raise RuntimeError(f"DES ended with {unfinished} unfinished requests")
    details = {
        "record": record,
        "timeline": tl,
        "makespan_ms": record.makespan_ms,
        "events": events,
        "ci_method": ci_method(wl.concurrency),
        "warmup_requests": warmup_requests(wl.concurrency, wl.requests),
        "verify_passes": record.verify_passes,
    }
    return Result(scenario=scenario, engine="des", metrics=compute_metrics(record), details=details)


def _events_scheduled(env: simpy.Environment) -> int:
    """Events the environment scheduled (SimPy numbers them with a counter)."""
    counter = getattr(env, "_eid", None)
    return int(next(counter)) if counter is not None else -1
