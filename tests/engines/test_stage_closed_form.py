"""The closed-form stage (a FIFO server without events) against the process it replaces.

Stages before the last in the sync schedule serve in closed form (``wansim.sim.stage``). Forcing
every stage to run as a process must give the same run: the same metrics and the same timeline
(every compute slice and every transfer at the same instants), up to floating-point rounding of
the instants (the two compute a delivery time by different sums).
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wansim.config.scenario import load_scenario
from wansim.sim import simulate
from wansim.sim.stage import RelayStage, Stage

BASE = {
    "name": "closed-form",
    "model": {
        "hidden_size": 512,
        "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.1},
    },
    "drafter": {"draft_ms": 1.5, "acceptance": {"alpha": 0.7}},
    "workload": {"prompt_tokens": 32},
}


def run(overrides: dict, *, processes_only: bool):
    """``simulate`` event by event with the timeline kept; ``processes_only`` turns the closed
    form off."""
    original = RelayStage.serves_in_closed_form
    if processes_only:
        RelayStage.serves_in_closed_form = lambda self: False
    try:
        scenario = load_scenario(data=BASE, overrides=overrides)
        return simulate(scenario, timeline=True, per_event=True)
    finally:
        RelayStage.serves_in_closed_form = original


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def slices(result) -> tuple[list, list]:
    """Compute slices (stage, start, end, what) and transfers (hop, offer, start, busy end,
    delivery, bytes, losses), each in time order."""
    tl = result.details["timeline"]
    compute = sorted(s[:4] for s in tl.stage_slices)
    transfers = sorted(t[:7] for t in tl.transfers)
    return compute, transfers


scenarios = st.fixed_dictionaries(
    {
        "stages": st.integers(1, 8),
        "speculation.k": st.integers(1, 8),
        "network.latency_ms": st.sampled_from([0.0, 1.0, 7.5, 40.0]),
        "network.bandwidth_mbps": st.sampled_from([5.0, 100.0, 10_000.0]),
        "workload.requests": st.integers(1, 6),
        "workload.output_tokens": st.integers(2, 60),
        "workload.concurrency": st.integers(1, 4),
        "seed": st.integers(0, 2**16),
    },
    optional={
        "network.jitter": st.just({"kind": "normal", "std_ms": 3.0}),
        "network.loss_rate": st.just(0.02),
        "drafter.placement": st.just("first_stage"),
        "drafter.kind": st.just("draft_model"),
        "speculation.policy": st.just("tree"),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_closed_form_stages_run_the_same_schedule_as_processes(overrides):
    if overrides.get("speculation.policy") == "tree":
        overrides["speculation.tree"] = {"kind": "static", "branching": [3, 2, 1]}
        overrides["drafter.acceptance.sibling_logit_offsets"] = [1.0, 2.0]
    fast = run(overrides, processes_only=False)
    slow = run(overrides, processes_only=True)
    assert fast.details["events"] < slow.details["events"] or overrides["stages"] == 1
    for name, value in slow.metrics.items():
        assert same(fast.metrics[name], value), name
    fast_compute, fast_transfers = slices(fast)
    slow_compute, slow_transfers = slices(slow)
    assert same(fast_compute, slow_compute)
    assert same(fast_transfers, slow_transfers)


def test_only_stages_before_the_last_in_the_sync_schedule_are_closed_form():
    def kinds(**overrides):
        sc = load_scenario(data=BASE, overrides={"stages": 3, **overrides})
        seen = []
        original = Stage.start

        def spy(self):
            original(self)
            seen.append(self.closed_form)

        Stage.start = spy
        try:
            simulate(sc, per_event=True)  # (a lone request otherwise runs without events)
        finally:
            Stage.start = original
        return seen

    assert kinds() == [True, True, False]
    assert kinds(**{"schedule.batching": "continuous"}) == [False, False, False]
    async_ = {
        "schedule.kind": "async",
        "drafter.placement": "first_stage",
        "drafter.kind": "draft_model",
    }
    assert kinds(**async_) == [False, False, False]
