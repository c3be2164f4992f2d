"""The lone-request ring computed in vectorised blocks (``wansim.sim.lone_ring``) against the
per-event engine it stands in for (``simulate(..., per_event=True)``, kept as the reference).

Equality is to the bit: every metric and every array of the run record (per-request times,
laps, stage busy time, wire bytes), over random scenarios with jitter of every kind, losses,
zero latency, trees, hedges, either drafter placement, one to eight stages.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REFERENCE
from wansim.scenario import load_scenario
from wansim.sim import lone_ring, simulate
from wansim.sim.engine import build

BASE = {
    "name": "lone-ring",
    "model": {
        "hidden_size": 512,
        "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.1},
    },
    "drafter": {"draft_ms": 1.5, "acceptance": {"alpha": 0.7}},
    "workload": {"prompt_tokens": 32},
}
RECORD_ARRAYS = (
    "arrival_ms",
    "admitted_ms",
    "first_token_ms",
    "finish_ms",
    "decode_tokens",
    "committed",
    "passes",
    "laps_ms",
    "lap_request",
    "stage_busy_ms",
    "link_messages",
    "link_bytes",
    "link_bytes_decode",
)
JITTERS = [
    {"kind": "normal", "std_ms": 3.0},
    {"kind": "lognormal", "std_ms": 2.0},
    {"kind": "pareto", "shape": 2.5, "std_ms": 1.0},
    {"kind": "empirical", "samples_ms": [0.0, 0.5, 4.0, 11.0]},
]


def identical(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_same_run(scenario) -> None:
    fast = simulate(scenario)
    slow = simulate(scenario, per_event=True)
    assert fast.details["events"] == 0 < slow.details["events"]  # the lone-ring path ran
    assert fast.metrics.keys() == slow.metrics.keys()
    for name, value in slow.metrics.items():
        assert identical(fast.metrics[name], value), (name, fast.metrics[name], value)
    a, b = fast.details["record"], slow.details["record"]
    for name in RECORD_ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape and np.array_equal(x, y), name  # same values, exactly
    for name in ("verify_passes", "tokens_verified", "tokens_committed", "target_exact"):
        assert getattr(a, name) == getattr(b, name), name


scenarios = st.fixed_dictionaries(
    {
        "stages": st.integers(1, 8),
        "speculation.k": st.integers(1, 8),
        "network.latency_ms": st.sampled_from([0.0, 0.3, 7.5, 40.0, 250.0]),
        "network.bandwidth_mbps": st.sampled_from([1.0, 5.0, 100.0, 10_000.0]),
        "workload.requests": st.integers(1, 8),
        "workload.output_tokens": st.integers(2, 80),
        "workload.prompt_tokens": st.integers(1, 300),
        "seed": st.integers(0, 2**16),
    },
    optional={
        "network.jitter": st.sampled_from(JITTERS),
        "network.loss_rate": st.sampled_from([0.02, 0.3]),
        "drafter.placement": st.just("first_stage"),
        "drafter.parallel": st.just(False),
        "speculation.policy": st.sampled_from(["tree", "none"]),
        "schedule.hedge_branches": st.integers(1, 2),
        "schedule.batching": st.just("continuous"),
    },
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_lone_ring_equals_the_per_event_engine_to_the_bit(overrides):
    if overrides.get("speculation.policy") == "tree":
        overrides["speculation.tree"] = {"kind": "static", "branching": [3, 2, 1]}
        overrides["drafter.acceptance.sibling_logit_offsets"] = [1.0, 2.0]
        overrides.pop("schedule.hedge_branches", None)
    if overrides.get("speculation.policy") == "none":
        overrides.pop("schedule.hedge_branches", None)
    if "schedule.hedge_branches" in overrides:
        overrides["drafter.acceptance.sibling_logit_offsets"] = [1.0, 2.0]
    assert_same_run(load_scenario(data=BASE, overrides=overrides))


def test_reference_scenario_to_the_bit_across_blocks(monkeypatch):
    """The reference (10 stages, lognormal jitter, the DSpark profile), with blocks of a few
    hundred passes so the clock and the sums carry across many blocks."""
    monkeypatch.setattr(lone_ring, "ROWS_PER_BLOCK", 300)
    assert_same_run(load_scenario(REFERENCE, ["workload.requests=40"]))


def test_a_correction_of_the_event_step_is_applied_where_simpy_rounds(monkeypatch):
    """A short first hop then a long one (T = 3.x ms, d = 6T): SimPy's T + (d - T) is not d
    there (found by search); the chain must take SimPy's value and still match to the bit."""
    overrides = {
        "stages": 3,
        "network.hops": [{"latency_ms": 0.77}, {"latency_ms": 17.7}, {"latency_ms": 0.3}],
        "workload.requests": 2,
        "workload.output_tokens": 8,
    }
    sc = load_scenario(data=BASE, overrides=overrides)
    assert_same_run(sc)
    monkeypatch.setattr(lone_ring, "MAX_FIXES", 0)  # without the correction: handed back
    assert lone_ring.run(build(sc)) is None
    fallback = simulate(sc)  # ... and simulate() then runs the events
    assert fallback.details["events"] > 0
    assert fallback.metrics == simulate(sc, per_event=True).metrics


def test_only_a_lone_request_in_the_sync_ring_takes_the_vectorised_path():
    def takes(**overrides) -> bool:
        return lone_ring.applies(build(load_scenario(data=BASE, overrides=overrides)))

    assert takes()
    assert takes(**{"schedule.batching": "continuous"})  # one request: never a batch of two
    assert not takes(**{"workload.concurrency": 2})
    assert not takes(**{"workload.arrival": "poisson", "workload.rate_per_s": 1.0})
    assert not takes(**{"schedule.kind": "async", "drafter.placement": "first_stage"})
    assert not lone_ring.applies(build(load_scenario(data=BASE), timeline=True))
