"""A lone request under async in-pipe speculation computed pass by pass
(``wansim.sim.lone_async``) against the per-event engine it stands in for
(``simulate(..., per_event=True)``, SimPy's loop, kept as the reference).

Equality is to the bit: every metric, every array of the run record and the block schedule's
counters, over random scenarios: two to six stages, K 1-6, windows of 1-8 blocks, one to four
requests in flight (several only where no cancellation goes round), both async
protocols (cancel on divergence, flush on full acceptance), the overlapped drafter (async, and
sync: a window of one), jitter of
every kind and none, zero latency (instants that tie: ordered as the loop orders them, or the
run handed to the events), losses, per-hop links with per-message and codec costs, acceptance
from near-certain to poor. Eligibility is a whitelist: anything else runs event by event.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REFERENCE
from tests.engines import same_run
from wansim.config.scenario import load_scenario
from wansim.sim import lone_async, simulate
from wansim.sim.engine import build

BASE = {
    "name": "lone-async",
    "model": {
        "hidden_size": 512,
        "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.1},
    },
    "drafter": {
        "kind": "draft_model",
        "placement": "first_stage",
        "draft_ms": 1.5,
        "acceptance": {"alpha": 0.75},
    },
    "speculation": {"policy": "chain", "k": 3},
    "schedule": {"kind": "async", "max_inflight_blocks": 4},
    "workload": {"prompt_tokens": 32},
}
COUNTERS = (
    "bets_won",
    "bets_lost",
    "cancelled_blocks",
    "dropped_unstarted",
    "cancelled_stage_tokens",
    "cancel_messages",
    "drafter_busy_ms",
    "drafter_passes",
    "drafter_wasted_blocks",
)
# (larger than most latencies: deliveries clamped to the one before, instants that tie)
JITTERS = [*same_run.JITTERS, {"kind": "lognormal", "std_ms": 30.0}]


def assert_same_run(scenario) -> bool:
    """Equal to the events' run to the bit; True when the pass-by-pass path computed it (it
    hands a run whose instants tie beyond its order to the events)."""
    fast = simulate(scenario)
    slow = simulate(scenario, per_event=True)
    assert slow.details["events"] > 0
    same_run.assert_same_result(fast, slow)
    for name in COUNTERS:
        assert fast.details["blocks"][name] == slow.details["blocks"][name], name
    return fast.details["events"] == 0


hop = same_run.hops(JITTERS)
scenarios = st.fixed_dictionaries(
    {
        "stages": st.integers(2, 6),
        "speculation.k": st.integers(1, 6),
        "schedule.max_inflight_blocks": st.integers(1, 8),
        "drafter.acceptance.alpha": st.sampled_from([0.3, 0.75, 0.97]),
        "network.latency_ms": st.sampled_from([0.0, 0.4, 7.5, 40.0]),
        "network.bandwidth_mbps": st.sampled_from([5.0, 100.0, 10_000.0]),
        "workload.requests": st.integers(1, 6),
        "workload.output_tokens": st.integers(2, 90),
        "seed": st.integers(0, 2**16),
    },
    optional={
        "network.jitter": st.sampled_from(JITTERS),
        "network.loss_rate": st.sampled_from([0.02, 0.3]),
        "network.per_message_ms": st.sampled_from([0.25, 4.0]),
        "network.codec_ms_per_mb": st.sampled_from([1.0, 40.0]),
        "network.hops": st.lists(hop, min_size=6, max_size=6),
        "model.overhead_ms": st.sampled_from([0.3, 2.0]),
        "payload.cancel_bytes": st.sampled_from([1, 5000]),
        "drafter.draft_ms": st.sampled_from([0.0, 9.0]),
        "schedule.async_protocol": st.just("flush_on_full_acceptance"),
        "drafter.overlap": st.just(True),
        "schedule.kind": st.just("sync"),  # (with the overlapped drafter: a window of one)
        "workload.concurrency": st.integers(2, 4),
    },
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_lone_async_equals_the_per_event_engine_to_the_bit(overrides):
    if "network.hops" in overrides:
        overrides["network.hops"] = overrides["network.hops"][: overrides["stages"]]
    if "schedule.async_protocol" in overrides:  # (it commits K drafts or one token: K >= 2)
        overrides["speculation.k"] = max(overrides["speculation.k"], 2)
    if overrides.get("schedule.kind") == "sync":  # the block schedule of one block in flight
        overrides.update({"drafter.overlap": True, "schedule.max_inflight_blocks": 1})
        overrides.pop("schedule.async_protocol", None)
    sc = load_scenario(data=BASE, overrides=overrides)
    several = overrides.get("workload.concurrency", 1) > 1  # only where nothing is cancelled:
    cancels = sc.schedule.kind == "async" and "schedule.async_protocol" not in overrides
    assert lone_async.applies(build(sc)) == (not several or not cancels or sc.stages == 2)
    assert_same_run(sc)


def test_the_benchmark_async_case_to_the_bit_without_an_event():
    """The reference (10 stages, 25 ms hops, lognormal jitter) with the benchmark's async
    case (K = 3, 8 blocks in flight, drafter on S0): hundreds of lost bets, cancellations
    catching stale blocks at every stage."""
    over = [
        "drafter.placement=first_stage",
        "drafter.kind=draft_model",
        "speculation.k=3",
        "schedule.kind=async",
        "schedule.max_inflight_blocks=8",
        "workload.requests=12",
    ]
    sc = load_scenario(REFERENCE, over)
    assert assert_same_run(sc)
    blocks = simulate(sc).details["blocks"]
    assert blocks["bets_lost"] > 100 and blocks["cancel_messages"] > 500
    assert blocks["dropped_unstarted"] > 0  # some caught waiting in a mailbox


def test_jittered_rings_run_without_events():
    """Where no two events share an instant the pass-by-pass path computes every run."""
    for seed in range(6):
        over = {
            "seed": seed,
            "stages": 2 + seed,
            "network.latency_ms": 4.0,
            "network.jitter": JITTERS[seed % 2],
            "schedule.max_inflight_blocks": 1 + seed,
            "workload.requests": 3,
            "workload.output_tokens": 70,
        }
        assert assert_same_run(load_scenario(data=BASE, overrides=over)), seed


def test_instants_that_tie_are_ordered_as_the_loop_orders_them():
    """Zero latency and deterministic service: a cancellation reaches a stage at the instant a
    stale block arrives or ends there, a verdict reaches S0 as it ends a pass. Each tie is
    ordered by when its events were scheduled, or the run is handed to the events; either
    way the run is the events' to the bit (and some of these run without events)."""
    computed = 0
    for stages in (2, 3, 5):
        for window in (2, 5):
            for alpha in (0.3, 0.9):
                over = {
                    "stages": stages,
                    "network.latency_ms": 0.0,
                    "network.bandwidth_mbps": 10_000.0,
                    "schedule.max_inflight_blocks": window,
                    "drafter.acceptance.alpha": alpha,
                    "workload.requests": 3,
                    "workload.output_tokens": 40,
                }
                computed += assert_same_run(load_scenario(data=BASE, overrides=over))
    assert computed > 0


# found by search (random scenarios against the rules mutated); each fails if its rule is
INVERTED_DELIVERIES = {  # loss: five blocks held behind one retransmission, clamped to one
    "seed": 1294,  # delivery, whose event instants now + (delivery - now) round out of order
    "stages": 2,
    "speculation.k": 2,
    "schedule.max_inflight_blocks": 6,
    "drafter.acceptance.alpha": 0.97,
    "drafter.draft_ms": 9.0,
    "model.overhead_ms": 2.0,
    "network.latency_ms": 0.4,
    "network.bandwidth_mbps": 10000.0,
    "network.loss_rate": 0.3,
    "network.per_message_ms": 0.25,
    "network.codec_ms_per_mb": 40.0,
    "network.jitter": {"kind": "lognormal", "std_ms": 2.0},
    "network.hops": [
        {"per_message_ms": 0.7, "jitter": {"kind": "normal", "std_ms": 3.0}},
        {"codec_ms_per_mb": 0.0, "per_message_ms": 0.7, "bandwidth_mbps": 2.0},
    ],
    "payload.cancel_bytes": 5000,
    "workload.requests": 2,
    "workload.output_tokens": 34,
}
CANCEL_AS_A_PASS_ENDS = {  # zero latency: a cancellation reaches a stage as a stale block's
    "seed": 452,  # pass there ends (forwarded or not: which event was scheduled first)
    "stages": 6,
    "speculation.k": 3,
    "schedule.max_inflight_blocks": 5,
    "drafter.acceptance.alpha": 0.3,
    "model.overhead_ms": 2.0,
    "network.latency_ms": 0.0,
    "network.bandwidth_mbps": 100.0,
    "network.loss_rate": 0.3,
    "network.codec_ms_per_mb": 40.0,
    "network.hops": [
        {
            "bandwidth_mbps": 300.0,
            "loss_rate": 0.0,
            "jitter": {"kind": "pareto", "shape": 2.5, "std_ms": 1.0},
            "codec_ms_per_mb": 0.0,
        },
        {"latency_ms": 2.5},
        {},
        {},
        {
            "jitter": {"kind": "lognormal", "std_ms": 2.0},
            "codec_ms_per_mb": 0.0,
            "latency_ms": 0.0,
            "per_message_ms": 0.7,
            "loss_rate": 0.1,
            "bandwidth_mbps": 300.0,
        },
        {},
    ],
    "workload.requests": 4,
    "workload.output_tokens": 73,
}


def test_deliveries_whose_event_instants_round_out_of_order_go_to_the_events():
    sc = load_scenario(data=BASE, overrides=INVERTED_DELIVERIES)
    assert lone_async.run(build(sc)) is None  # handed back ...
    assert not assert_same_run(sc)  # ... and simulate() then runs the events


def test_a_cancellation_arriving_as_a_stale_pass_ends_to_the_bit():
    assert assert_same_run(load_scenario(data=BASE, overrides=CANCEL_AS_A_PASS_ENDS))


def takes(**overrides) -> bool:
    return lone_async.applies(build(load_scenario(data=BASE, overrides=overrides)))


def test_only_a_lone_async_request_with_the_drafter_on_s0_takes_the_path():
    assert takes()
    assert not takes(**{"workload.concurrency": 2})  # a cancellation would hold others up
    assert takes(**{"workload.concurrency": 2, "stages": 2})  # ... but none goes round here
    assert takes(
        **{"workload.concurrency": 3, "schedule.async_protocol": "flush_on_full_acceptance"}
    )
    assert not takes(**{"workload.arrival": "poisson", "workload.rate_per_s": 1.0})
    assert not takes(**{"stages": 1})
    assert takes(**{"drafter.overlap": True})
    sync = {"schedule.kind": "sync", "schedule.max_inflight_blocks": 1}
    assert takes(**sync, **{"drafter.overlap": True})
    assert not takes(**sync, **{"drafter.overlap": True, "drafter.placement": "last_stage"})
    assert takes(**{"schedule.async_protocol": "flush_on_full_acceptance"})
    assert not takes(**{"schedule.batching": "continuous"})
    assert not takes(**{"model.host_cores": 2})
    assert not takes(**{"network.transport": "tcp"})
    assert not takes(**{"model.noise": {"kind": "lognormal", "cv": 0.1}})
    assert not takes(**{"faults": {"events": [{"stage": 1, "at_s": 0.1}]}})
    assert not takes(**{"schedule.kind": "sync", "schedule.max_inflight_blocks": 1})
    sc = load_scenario(data=BASE)
    assert not lone_async.applies(build(sc, timeline=True))


def test_a_foreign_event_tied_on_both_instants_hands_the_run_to_the_events():
    """An arrival computed ahead by the ring is pushed before its time, so its place among
    events of the same instant scheduled at the same instant is unknown: the run goes to the
    events. Otherwise the clock runs events by instant, then by when they were scheduled."""
    ran = []
    clock = lone_async._Clock(build(load_scenario(data=BASE)).env, None, None)
    clock.push(5.0, 2.0, lambda _e: ran.append("b"), False)
    clock.push(5.0, 1.0, lambda _e: ran.append("a"), True)
    clock.push(4.0, 3.0, lambda _e: clock.call(1.0, lambda _e: ran.append("c")), False)
    clock.run()
    assert ran == ["a", "b", "c"] and clock.now == 5.0  # (c: scheduled at 4, after a and b)
    clock.push(7.0, 6.0, lambda _e: ran.append("d"), False)
    clock.push(7.0, 6.0, lambda _e: ran.append("e"), True)
    with pytest.raises(lone_async._Tie):
        clock.run()
