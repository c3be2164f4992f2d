"""The sim's event loop (``wansim.sim.kernel.Kernel``, stage servers as callbacks) against
SimPy's (``simulate(..., per_event=True)``, stage servers as generator processes): the same
run to the bit.

Equality is of every metric, every array of the run record, the events scheduled and the block
schedule's counters, over random scenarios of both schedules (async and overlapped drafters,
windows of 1-8 blocks, hybrid rounds), concurrency, continuous batching, micro-batches, either
drafter placement, jitter of every kind and none (ties between events are then common: the
loops must order them alike), zero latency, losses; and by example, faults and a kept timeline.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.conftest import REFERENCE
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.sim import kernel, stage
from wansim.sim.engine import build, check_supported, run_events
from wansim.sim.kernel import Kernel
from wansim.sim.metrics import compute_metrics

COMPONENTS = [kernel, stage]  # (kernel: Reference.call makes its Timeout there)

BASE = {
    "name": "kernel-equality",
    "model": {
        "hidden_size": 512,
        "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.1},
    },
    "drafter": {"draft_ms": 1.5, "kind": "draft_model", "acceptance": {"alpha": 0.75}},
    "speculation": {"policy": "chain", "k": 3},
    "workload": {"prompt_tokens": 32},
}
JITTERS = [
    {"kind": "none"},
    {"kind": "normal", "std_ms": 3.0},
    {"kind": "lognormal", "std_ms": 2.0},
    {"kind": "lognormal", "std_ms": 30.0},  # (larger than most latencies: ties, see below)
    {"kind": "empirical", "samples_ms": [0.0, 0.5, 4.0]},
]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@contextlib.contextmanager
def simpy_events():
    """The components make SimPy's own Timeout and Event (not the kernel's lighter ones that
    push the same key), so the reference is SimPy's throughout: loop, events and processes."""
    simpy_kinds = {"Timeout": simpy.events.Timeout, "Event": simpy.events.Event}
    saved = [(m, n, getattr(m, n)) for m in COMPONENTS for n in simpy_kinds if hasattr(m, n)]
    try:
        for module, name, _ in saved:
            setattr(module, name, simpy_kinds[name])
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def assert_same_run(scenario, timeline: bool = False) -> None:
    """Both loops run the scenario event by event (the lone ring bypassed: run_events)."""
    fast_pipe = build(scenario, timeline=timeline)
    a = run_events(fast_pipe)
    with simpy_events():
        slow_pipe = build(scenario, timeline=timeline, reference=True)
        b = run_events(slow_pipe)
    assert isinstance(fast_pipe.env, Kernel) and isinstance(slow_pipe.env, simpy.Environment)
    assert kernel.Timeout is not simpy.events.Timeout  # (restored after the reference ran)
    assert a.events == b.events > 0
    for name, value in vars(b).items():
        if name != "timeline":
            assert _same(getattr(a, name), value), name
    slo = scenario.workload.slo
    assert _same(compute_metrics(a, slo, scenario.seed), compute_metrics(b, slo, scenario.seed))
    if fast_pipe.scheduler is not None:
        for name in ("cancelled_blocks", "cancelled_stage_tokens", "dropped_unstarted"):
            assert getattr(fast_pipe.scheduler, name) == getattr(slow_pipe.scheduler, name)
        for name in ("cancel_messages", "bets_won", "bets_lost", "drafter_busy_ms"):
            assert getattr(fast_pipe.scheduler, name) == getattr(slow_pipe.scheduler, name)
        for name in ("drafter_passes", "drafter_wasted_blocks", "confident_rounds"):
            assert getattr(fast_pipe.scheduler, name) == getattr(slow_pipe.scheduler, name)
    if timeline:
        ta, tb = fast_pipe.timeline, slow_pipe.timeline
        assert len(ta.stage_slices) > 0 and len(ta.transfers) > 0
        # the passes themselves are each run's own objects: their count and labels
        assert _same(_slices(ta.stage_slices), _slices(tb.stage_slices))
        assert _same(_slices(ta.transfers), _slices(tb.transfers))
        assert _same(ta.verify_log, tb.verify_log)


def _slices(rows: list[tuple]) -> list[tuple]:
    return [(*row[:-1], [_label(p) for p in _passes(row[-1])]) for row in rows]


def _passes(x) -> list:
    return list(getattr(x, "passes", x))


def _label(p) -> tuple:
    label = getattr(p, "label", None)
    return (label(),) if callable(label) else (p.request.rid, p.kind, p.step, p.n)


scenarios = st.fixed_dictionaries(
    {
        "stages": st.integers(1, 6),
        "speculation.k": st.integers(1, 6),
        "network.latency_ms": st.sampled_from([0.0, 0.4, 10.0, 60.0]),
        "network.bandwidth_mbps": st.sampled_from([5.0, 100.0, 10_000.0]),
        "network.jitter": st.sampled_from(JITTERS),
        "workload.requests": st.integers(1, 24),
        "workload.concurrency": st.integers(1, 12),
        "workload.output_tokens": st.integers(2, 60),
        "seed": st.integers(0, 2**16),
    },
    optional={
        "schedule.kind": st.just("async"),
        "schedule.max_inflight_blocks": st.integers(1, 8),
        "drafter.overlap": st.just(True),
        "drafter.placement": st.sampled_from(["first_stage", "last_stage"]),
        "schedule.batching": st.just("continuous"),
        "schedule.micro_batches": st.integers(1, 3),
        "schedule.hybrid_confident_fraction": st.sampled_from([0.0, 0.6]),
        "network.loss_rate": st.sampled_from([0.05, 0.3]),
        "network.per_message_ms": st.sampled_from([0.0, 0.5]),
        "model.overhead_ms": st.sampled_from([0.3, 2.0]),
        "model.idle_cost": st.just({"points": [[0.0, 0.0], [30.0, 1.5]]}),
        "network.idle_cost": st.just({"points": [[0.0, 0.0], [30.0, 0.7]]}),
        "workload.arrival": st.just({"kind": "poisson", "rate_per_s": 40.0}),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_kernel_equals_simpy_to_the_bit(overrides):
    if "schedule.hybrid_confident_fraction" in overrides:
        overrides["speculation.tree"] = {"kind": "static", "branching": [2, 1]}
        overrides["drafter.acceptance.sibling_logit_offsets"] = [1.0]
    try:
        sc = load_scenario(data=BASE, overrides=overrides)
        check_supported(sc)
    except ScenarioError:
        assume(False)
    assert_same_run(sc)


def test_reference_async_case_to_the_bit():
    """The benchmark's async case (K = 3, 8 blocks in flight, drafter on S0), shortened."""
    over = [
        "drafter.placement=first_stage",
        "drafter.kind=draft_model",
        "speculation.k=3",
        "schedule.kind=async",
        "schedule.max_inflight_blocks=8",
        "workload.requests=4",
        "workload.concurrency=2",
    ]
    assert_same_run(load_scenario(REFERENCE, over))


def test_a_kept_timeline_to_the_bit():
    over = {"stages": 4, "schedule.kind": "async", "drafter.placement": "first_stage"}
    over.update({"workload.requests": 5, "workload.concurrency": 3, "workload.output_tokens": 30})
    assert_same_run(load_scenario(data=BASE, overrides=over), timeline=True)


@pytest.mark.parametrize(
    "schedule",
    [
        {"kind": "sync"},
        {"kind": "async", "max_inflight_blocks": 3},
        {"kind": "sync", "batching": "continuous", "micro_batches": 2, "prefill_chunk_tokens": 16},
    ],
    ids=["sync", "async", "micro-batches"],
)
def test_faults_to_the_bit(schedule):
    """Stage failures mid-run, the requests in flight re-prefilled (sync; the block schedule,
    whose lost blocks, verdicts and cancellations the failure drops; micro-batches, lost whole
    and re-formed from their members' re-prefills)."""
    data = {
        **BASE,
        "stages": 4,
        "network": {"latency_ms": 5.0, "jitter": {"kind": "normal", "std_ms": 1.0}},
        "drafter": {**BASE["drafter"], "placement": "first_stage"},
        "schedule": schedule,
        "workload": {"prompt_tokens": 32, "requests": 8, "concurrency": 3, "output_tokens": 40},
        "faults": {
            "detection_s": 0.05,
            "events": [{"stage": 1, "at_s": 0.3}, {"link": 2, "rate_per_hour": 20000}],
        },
    }
    assert_same_run(load_scenario(data=data))


def test_simultaneous_deliveries_to_the_bit():
    """Jitter as large as the latency: a message clamped to the one before it on its hop (no
    overtaking) arrives at the same instant, so a stage's wake-up and the next delivery tie;
    continuous batching then batches one or both, by the loops' order of those ties."""
    for kind in ("sync", "async"):
        over = {
            "stages": 4,
            "network.latency_ms": 5.0,
            "network.jitter": {"kind": "lognormal", "std_ms": 8.0},
            "schedule.kind": kind,
            "schedule.batching": "continuous",
            "drafter.placement": "first_stage",
            "workload.requests": 24,
            "workload.concurrency": 8,
            "workload.output_tokens": 60,
        }
        assert_same_run(load_scenario(data=BASE, overrides=over))
