"""Build the pipeline and run it: ``simulate(scenario, *, timeline=False) -> Result``.

Components: P stage servers (:mod:`wansim.sim.stage`: P - 1 relay stages, S0 first, then the
last stage, where the verifier sits; closed form before the last stage in
the sync schedule, processes otherwise), P :class:`~wansim.sim.link.Link`
hops (hop i carries S_i's output to S_(i+1); hop P-1 is the return hop to S0; with P = 1 the
ring is the return hop alone), one :class:`~wansim.sim.verifier.Verifier` at the last stage and
a :class:`~wansim.sim.request.RequestSource`. The run ends when every request has finished.

Random streams: ``np.random.SeedSequence(scenario.seed).spawn(4 + 2P)``
(:func:`wansim.links.draws.ring_seeds`, which the link emulator shares) gives independent
generators, by position: 0 acceptance draws, 1 per-request difficulty, 2 arrivals, then for
each hop i: 3 + 2i propagation jitter, 4 + 2i losses; the last child (3 + 2P) seeds the block
schedule's bets, one stream per request. Same seed -> identical run.

With ``schedule.kind: async`` or ``drafter.overlap: true`` (chains) the stages run the block
schedule of :mod:`wansim.sim.async_speculation` (bets, cancellation, the overlapped drafter).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc

import numpy as np
import simpy

from wansim import speculation
from wansim.config.scenario import Scenario, hop_name
from wansim.errors import ScenarioError
from wansim.links.draws import hop_streams, ring_seeds
from wansim.links.nonstationary import network_modulation
from wansim.links.tcp import tcp_params
from wansim.links.wire_bytes import forward_bytes, tree_mask_bytes
from wansim.results.result import Result
from wansim.serving.micro_batching import micro_batched, serving_slots
from wansim.serving.workload import plan_requests
from wansim.sim import lone_async, lone_ring
from wansim.sim.async_speculation import Scheduler, TreeRounds, guess_rates
from wansim.sim.faults import FaultInjector, fault_seed
from wansim.sim.host import SharedHost
from wansim.sim.host_idle import HostIdleClock
from wansim.sim.kernel import Kernel, Reference
from wansim.sim.link import Link
from wansim.sim.messages import PREFILL, Pass
from wansim.sim.metrics import (
    NO_FINISHED,
    PERCENTILE_CI_METHOD,
    UNBOUNDED_PERCENTILE_CI,
    UNDEFINED_PERCENTILE_CI,
    ci_method,
    compute_metrics,
    warmup_requests,
)
from wansim.sim.micro_batches import MicroBatcher
from wansim.sim.record import RunRecord, Timeline, build_record
from wansim.sim.request import Request, RequestSource
from wansim.sim.stage import LastStage, RelayStage, Stage
from wansim.sim.verifier import Verifier
from wansim.speculation import return_message_bytes
from wansim.speculation.block_schedule import bet_draft_ms, uses_blocks
from wansim.speculation.hybrid_rounds import (
    check_tree_rounds,
    confident_fraction,
    is_hybrid,
    tree_scenario,
)
from wansim.stages import idle_cost
from wansim.stages.compute import (
    drafter_tree_ms,
    stage_overheads_ms,
    stage_pass_ms,
    stage_sequence_costs_ms,
)
from wansim.stages.slowdown import StageSlowdown, stage_rng

# bounded work: a run simulates requests x output_tokens tokens (~1e5-1e6 a second)
MAX_TOKENS = 100_000_000


def check_supported(scenario: Scenario) -> None:
    """The DES runs the sync schedule with any speculation policy, and the block schedule
    (async, overlapped drafter: :mod:`wansim.sim.async_speculation`) with chains; the rest is
    refused. At most :data:`MAX_TOKENS` output tokens over all requests."""
    sched = scenario.schedule
    wl = scenario.workload
    if wl.requests * wl.output_tokens > MAX_TOKENS:
        raise ScenarioError(
            "workload.requests",
            f"x output_tokens ({wl.output_tokens}) is {wl.requests * wl.output_tokens:.2g} tokens"
            f" to simulate, more than the DES's {MAX_TOKENS:.0e} (lower them, or use"
            " --engine analytical)",
            wl.requests,
        )
    if wl.mix and scenario.speculation.policy == "tree":
        raise ScenarioError(
            "workload.mix", "mixes acceptance rows per request for chains; trees are not", "tree"
        )
    if wl.mix and uses_blocks(scenario):
        raise ScenarioError(
            "workload.mix",
            "mixes acceptance rows per request in the sync schedule; the block schedule (async,"
            " overlapped drafter) is not",
            [r.workload for r in wl.mix],
        )
    if wl.lengths.kind in ("trace", "empirical"):
        from wansim.serving.workload import read_trace

        most = wl.requests * int(read_trace(wl.trace).output_tokens.max())
        if most > MAX_TOKENS:
            raise ScenarioError(
                "workload.trace",
                f"requests x the longest output is {most:.2g} tokens to simulate, more than the"
                f" DES's {MAX_TOKENS:.0e} (fewer requests, or --engine analytical)",
                wl.trace,
            )
    if not uses_blocks(scenario):
        return
    check_tree_rounds(scenario)
    field = "schedule.kind" if sched.kind == "async" else "drafter.overlap"
    value = sched.kind if sched.kind == "async" else True
    if scenario.speculation.policy == "tree":
        raise ScenarioError(
            field, "bets on a chain's drafts; trees are not simulated with it by the DES", value
        )
    if sched.hedge_branches:
        raise ScenarioError(
            field,
            "bets on a chain's drafts; hedge branches are not simulated with it by the DES",
            value,
        )


def _hop_forward_bytes(payload, hidden_size: int, hop: int, stages: int, n: int) -> float:
    return float(forward_bytes(payload, hidden_size, n, hop, stages))


def _cached(fn):
    """n tokens -> float, memoised (compute models are numpy functions; passes repeat sizes)."""
    cache: dict[int, float] = {}

    def get(n: int) -> float:
        v = cache.get(n)
        if v is None:
            v = cache[n] = float(fn(n))
        return v

    return get


@dataclasses.dataclass
class Pipeline:
    """The wired components of one run (before it runs): what :func:`build` returns."""

    scenario: Scenario
    env: Kernel | simpy.Environment
    stages: list[Stage]
    links: list[Link]
    verifier: Verifier
    source: RequestSource
    scheduler: Scheduler | None
    timeline: Timeline | None
    faults: FaultInjector | None = None


def build(scenario: Scenario, *, timeline: bool = False, reference: bool = False) -> Pipeline:
    """Wire the stages, links, verifier, request source (and block schedule) of a scenario, on
    the sim's event loop (:class:`~wansim.sim.kernel.Kernel`), or with ``reference=True`` on
    ``simpy.Environment`` (the same order of events: the reference the loop is tested against).
    A shared host (``model.host_cores``: :mod:`wansim.sim.host`, whose stages wait on its
    events in their SimPy processes) always runs on SimPy's loop."""
    # a float clock from the start (times are floats)
    simpy_loop = reference or scenario.model.host_cores is not None
    env = Reference(0.0) if simpy_loop else Kernel(0.0)
    p_stages = scenario.stages
    # the block schedule's bets come from one more child, after the documented streams
    seeds = ring_seeds(scenario.seed, p_stages)
    streams = [np.random.default_rng(s) for s in seeds[:-1]]
    blocks = uses_blocks(scenario)
    difficulty_copy = copy.deepcopy(streams[1]) if blocks else None
    tree_difficulty = copy.deepcopy(streams[1]) if is_hybrid(scenario) else None
    tl = (
        Timeline(
            stage_names=[f"S{i}" for i in range(p_stages)],
            link_names=[hop_name(i, p_stages) for i in range(p_stages)],
        )
        if timeline
        else None
    )
    plan = plan_requests(scenario.workload, streams[2])
    verifier = Verifier(scenario, streams[0], streams[1], tl.verify_log if tl else None, plan)
    # the policy's costs (wansim.speculation): a drafter pass per batch plus the tree's width per
    # sequence, the tree mask per verified sequence on forward hops, and the verdict (with the
    # next tree when drafted on the last stage) per sequence on the return hop
    pol = verifier.policy
    tree_nodes = pol.nodes if pol.kind == "tree" else 0
    draft = float(drafter_tree_ms(scenario.drafter, pol.depth, pol.nodes, 0))
    draft_per_sequence = float(drafter_tree_ms(scenario.drafter, pol.depth, pol.nodes, 1)) - draft
    # a batched drafter pass: each sequence beyond the first (drafter.sequence_ms per pass)
    draft_sequence = (
        float(drafter_tree_ms(scenario.drafter, pol.depth, pol.nodes, 2)) - draft
    ) - 2 * draft_per_sequence
    first_stage = scenario.drafter.placement == "first_stage"
    overlap = blocks and scenario.drafter.overlap  # drafting on its own device
    computes = [  # (n tokens, sequences=) -> ms
        functools.partial(stage_pass_ms, m, o, sequence_ms=c)
        for m, o, c in zip(
            scenario.stage_compute_models(),
            stage_overheads_ms(scenario),
            stage_sequence_costs_ms(scenario),
            strict=True,
        )
    ]
    # hop i's forward message of n tokens (per hop with payload.extra_tensors) and the return
    # message per sequence (wansim.links.wire_bytes)
    payload, hidden = scenario.payload, scenario.model.hidden_size
    if payload.extra_tensors:
        fwd_bytes = [
            _cached(functools.partial(_hop_forward_bytes, payload, hidden, i, p_stages))
            for i in range(p_stages)
        ]
    else:
        fwd_bytes = [_cached(lambda n: forward_bytes(payload, hidden, n))] * p_stages
    ret_bytes = float(
        return_message_bytes(scenario, tree_nodes, 1, pol.tokens_per_pass(), pol.nodes)
    )

    # every stage on one host of model.host_cores cores (wansim.sim.host): only where computes
    # can overlap (one request in flight in the sync ring never does: the same run without it)
    cores = scenario.model.host_cores
    host = (
        SharedHost(env, cores, p_stages)
        if cores is not None and (blocks or int(np.max(serving_slots(scenario))) > 1)
        else None
    )

    # a pass after an idle costs more (wansim.stages.idle_cost): per stage, None when off
    idle_extra = [
        None if t is None else idle_cost.scalar_extra(*t)
        for t in idle_cost.stage_tables(scenario.model, p_stages)
    ]
    # ... after the host's idle (model.idle_follows host): one clock every stage marks
    idle_clock = (
        HostIdleClock()
        if scenario.model.idle_follows == "host" and any(x is not None for x in idle_extra)
        else None
    )

    def shared(i: int) -> dict:
        """What every stage role takes: batching, the timeline, its compute noise/stragglers;
        S0 its drafter duty (placement first_stage: drafting before its compute)."""
        duties = {
            "batching": scenario.schedule.batching == "continuous",
            "timeline": tl.stage_slices if tl else None,
            "host": host,
            "idle_extra": idle_extra[i],
            "idle_clock": idle_clock,
            "slowdown": (
                StageSlowdown(scenario.model, i, stage_rng(scenario.seed, i))
                if StageSlowdown.enabled(scenario.model, i)
                else None
            ),
        }
        if i == 0:
            duties["draft_before_ms"] = draft if first_stage and not overlap else 0.0
            duties["draft_before_per_sequence_ms"] = draft_per_sequence if first_stage else 0.0
        return duties

    last = p_stages - 1
    stages: list[Stage] = [
        RelayStage(
            env,
            i,
            computes[i],
            fwd_bytes[i],
            mask_bytes_per_sequence=float(tree_mask_bytes(tree_nodes)),
            **shared(i),
        )
        for i in range(last)
    ]
    stages.append(
        LastStage(
            env,
            last,
            computes[last],
            ret_bytes,
            verifier=verifier,
            draft_after_ms=draft if not first_stage and not overlap else 0.0,
            draft_after_per_sequence_ms=draft_per_sequence if not first_stage else 0.0,
            **shared(last),
        )
    )
    if not overlap:
        stages[0 if first_stage else last].draft_sequence_ms = draft_sequence
    micro = None
    if micro_batched(scenario):  # several batches in flight (wansim.serving.micro_batching)
        micro = MicroBatcher(
            scenario.schedule.micro_batches,
            scenario.schedule.prefill_chunk_tokens,
            stages[0].receive,
        )
        for stage in stages:
            stage.micro = micro
    scheduler = None
    tree_rounds = None
    if tree_difficulty is not None:  # the per-round hybrid's tree rounds
        tree_rounds = _tree_rounds(scenario, tree_difficulty)
        stages[0].tree_draft_ms = float(
            drafter_tree_ms(scenario.drafter, tree_rounds.depth, tree_rounds.nodes, 1)
        )
        for stage in stages[:last]:
            stage.tree_mask_bytes = float(tree_mask_bytes(tree_rounds.nodes))
    if blocks:
        bet_draft = float(bet_draft_ms(scenario, pol.depth, pol.nodes, 0))
        if first_stage and not overlap:  # S0 drafts its bets before computing them
            stages[0].draft_bet_extra_ms = bet_draft - draft
        scheduler = Scheduler(
            env,
            scenario,
            verifier,
            stages,
            p_guess=guess_rates(pol, difficulty_copy, scenario.workload.requests),
            bet_seed=seeds[-1],
            draft_ms=draft,
            bet_draft_ms=bet_draft,
            cancel_bytes=float(scenario.payload.cancel_bytes),
            tree_rounds=tree_rounds,
        )
        for stage in stages:
            stage.hooks = scheduler
    tcp = tcp_params(scenario.network)
    drift = network_modulation(scenario.network)  # drift and trace replay, or None
    # a message after its hop idled costs more (network.idle_cost), None when off
    hop_table = idle_cost.table(scenario.network.idle_cost)
    hop_idle_extra = None if hop_table is None else idle_cost.scalar_extra(*hop_table)
    faults = (
        FaultInjector(env, scenario.faults, stages, fault_seed(scenario.seed, p_stages))
        if scenario.faults.events
        else None
    )
    if faults is not None:
        faults.micro = micro
    links = [
        Link(
            env,
            i,
            hop,
            scheduler.deliver((i + 1) % p_stages)
            if blocks
            else (
                faults.deliver(stages[(i + 1) % p_stages].receive)
                if faults
                else stages[(i + 1) % p_stages].receive
            ),
            *hop_streams(seeds, i),
            tl.transfers if tl else None,
            tcp,
            drift,
            hop_idle_extra,
        )
        for i, hop in enumerate(scenario.resolved_hops())
    ]

    def admit(req: Request) -> None:
        verifier.prepare(req)
        if scheduler is not None:
            scheduler.prepare(req)
        if micro is not None:
            micro.admit(req)
            return
        stages[0].receive([Pass(req, PREFILL, 0, req.prompt_tokens)])

    source = RequestSource(
        env, scenario.workload, plan, faults.admit if faults else admit, _slots(scenario)
    )
    if faults is not None:
        faults.wire(source, admit)
        if scheduler is not None:
            faults.scheduler = scheduler
            scheduler.faults = True
    if tl is not None:  # the WAN physics' own slices (wansim.sim.perfetto)
        for stage in stages:
            stage.slowdowns = tl.slowdowns
        for link in links:
            link.keep_costs(tl.software, tl.window_stalls)
    for stage, link in zip(stages, links, strict=True):
        stage.link_out = link
        stage.source = source
    return Pipeline(scenario, env, stages, links, verifier, source, scheduler, tl, faults)


def _tree_rounds(scenario: Scenario, rng_difficulty: np.random.Generator) -> TreeRounds:
    """The hybrid's tree rounds (:mod:`wansim.speculation.hybrid_rounds`): the tree policy of
    ``speculation.tree`` with each request's rates drawn from (a copy of) the difficulty
    stream, its survival under the sync commit rule and its verdict's bytes."""
    sc = tree_scenario(scenario)
    pol = speculation.policy(sc)
    rates = pol.request_rates(rng_difficulty, scenario.workload.requests)
    survival = speculation.commit_survival(sc, pol.survival(rates))
    tokens = pol.tokens_per_pass()
    ret = float(return_message_bytes(sc, pol.nodes, 1, tokens, pol.nodes))
    return TreeRounds(
        float(confident_fraction(scenario)),
        int(tokens),
        np.asarray(survival, dtype=float),
        ret,
        int(pol.depth),
        int(pol.nodes),
    )


def _slots(scenario: Scenario) -> int:
    """Requests in flight at most: ``workload.concurrency``, fewer when micro-batches cap them
    (:func:`wansim.serving.micro_batching.serving_slots`; the warm-up wave is that many too)."""
    if not micro_batched(scenario):
        return scenario.workload.concurrency
    return max(int(serving_slots(scenario)), 1)


def run_events(pipe: Pipeline) -> RunRecord:
    """Run the built pipeline event by event (SimPy) to its end; the record of the run."""
    for stage in pipe.stages:
        stage.start()
    pipe.source.start()
    if pipe.faults is not None:
        pipe.faults.start()
    # A kept timeline grows by a tuple per slice; the cyclic garbage collector would walk those
    # ever-longer lists again and again (most of the timeline's cost, measured): it pauses for
    # the run (the run's cycles are collected when it resumes).
    paused = pipe.timeline is not None and gc.isenabled()
    if paused:
        gc.disable()
    try:
        pipe.env.run()
    finally:
        if paused:
            gc.enable()
    events = _events_scheduled(pipe.env)
    return build_record(
        pipe.source.requests,
        pipe.stages,
        pipe.links,
        pipe.verifier,
        _slots(pipe.scenario),
        events,
        pipe.timeline,
        pipe.scheduler,
        pipe.faults.log if pipe.faults is not None else None,
    )


def simulate(scenario: Scenario, *, timeline: bool = False, per_event: bool = False) -> Result:
    """Run the discrete-event simulation; ``timeline=True`` also keeps every slice (Perfetto).

    A lone request in the sync ring (concurrency 1, closed arrivals, and only mechanisms on
    :mod:`wansim.sim.lone_ring`'s whitelist) is computed lap by lap in vectorised blocks: the
    same arithmetic as the events, the same record (and kept timeline) to the bit, no event
    scheduled. A lone request under async in-pipe speculation with the drafter on S0
    (:mod:`wansim.sim.lone_async`'s whitelist) is computed pass by pass: the same record to
    the bit, no event scheduled (a tie beyond its order hands the run to the events). Every other run goes event by event on :class:`~wansim.sim.kernel.Kernel`
    (SimPy's order of events in a lighter loop). ``per_event=True`` runs every scenario event by event on SimPy's own loop
    (the reference both are tested against).
    """
    check_supported(scenario)
    pipe = build(scenario, timeline=timeline, reference=per_event)
    record = None
    if not per_event and lone_ring.applies(pipe):
        record = lone_ring.run(pipe)  # None where its event-step check gives up: events then
        if record is None:
            pipe = build(scenario, timeline=timeline)
    elif not per_event and lone_async.applies(pipe):
        record = lone_async.run(pipe)  # None where two events tie beyond its order: events then
        if record is None:
            pipe = build(scenario, timeline=timeline)
    if record is None:
        record = run_events(pipe)
    unfinished = int(np.isnan(record.finish_ms).sum())
    if unfinished:  # cannot happen with a correct engine; never report partial metrics
        raise RuntimeError(f"DES ended with {unfinished} unfinished requests")
    wl = scenario.workload
    method = ci_method(record)
    undefined = {"tokens_per_s_ci95": method} if method.startswith("undefined") else {}
    details = {
        "record": record,
        "timeline": record.timeline,
        "makespan_ms": record.makespan_ms,
        "events": record.events,
        "ci_method": method,
        "percentile_ci_method": PERCENTILE_CI_METHOD,
        # metric -> why it is null in the JSON (wansim.results.result.Result.to_json)
        "undefined": undefined,
        "warmup_requests": warmup_requests(_slots(scenario), wl.requests),
        "verify_passes": record.verify_passes,
    }
    if wl.kv_capacity_tokens is not None:
        details["kv"] = {
            "capacity_tokens": wl.kv_capacity_tokens,
            "peak_tokens": pipe.source.kv_peak,
            "policy": "queue FIFO, context reserved at admission, never preempted",
        }
    scheduler = pipe.scheduler
    if scheduler is not None:
        details["blocks"] = {
            "bets_won": scheduler.bets_won,
            "bets_lost": scheduler.bets_lost,
            "cancelled_blocks": scheduler.cancelled_blocks,
            "dropped_unstarted": scheduler.dropped_unstarted,
            "cancelled_stage_tokens": scheduler.cancelled_stage_tokens,
            "cancel_messages": scheduler.cancel_messages,
            "drafter_busy_ms": scheduler.drafter_busy_ms,
            "drafter_passes": scheduler.drafter_passes,
            "drafter_wasted_blocks": scheduler.drafter_wasted_blocks,
        }
        if scheduler.tree_rounds is not None:
            details["blocks"]["confident_rounds"] = scheduler.confident_rounds
            details["blocks"]["tree_rounds"] = scheduler.tree_round_count
    if pipe.faults is not None:
        details["faults"] = pipe.faults.log
    host = pipe.stages[0].host
    if host is not None:  # the shared host's processor sharing (wansim.sim.host)
        details["host"] = {
            "cores": host.cores,
            "peak_jobs": host.peak_jobs,
            "wait_ms_per_job": host.wait_ms_per_job(),
        }
    metrics = compute_metrics(record, wl.slo, scenario.seed)
    if method == NO_FINISHED:  # every request failed in a fault
        details["undefined"].update({k: NO_FINISHED for k, v in metrics.items() if v is None})
    for name, value in metrics.items():
        if name.endswith("_ci95") and name != "tokens_per_s_ci95":
            if value is None:
                details["undefined"].setdefault(name, UNDEFINED_PERCENTILE_CI)
            elif None in value:
                details["undefined"].setdefault(name, UNBOUNDED_PERCENTILE_CI)
    return Result(scenario=scenario, engine="des", metrics=metrics, details=details)


def _events_scheduled(env: Kernel | simpy.Environment) -> int:
    """Events the environment scheduled (SimPy numbers them with a counter)."""
    counter = getattr(env, "_eid", None)
    return int(next(counter)) if counter is not None else -1
