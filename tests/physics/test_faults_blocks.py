"""Faults under the block schedule (async in-pipe speculation, the overlapped drafter): a failure
loses every block, verdict and cancellation of the requests in the ring (their generation is
renewed, :mod:`wansim.sim.faults`), the schedule issues nothing for them until the re-prefill's
first token (:meth:`wansim.sim.async_speculation.Scheduler.lost_in_failure`), and then starts a
new chain; in the analytical engine the failover's restart costs the chain's first lap where
the interrupted chain would have given its residual lap (:mod:`wansim.analytical.faults`).

Hand-worked: with every draft and guess accepted and no jitter a lone request's run is
deterministic, and after a failover the ring is empty, so the run after the outage is a fresh
run of the re-prefilled prompt (prompt + c committed tokens) for the tokens left."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.physics.faults_agreement import agrees_with_des_mean
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.sim import simulate

# 4 stages, 10 ms a hop, 5 ms a pass, K = 3 with every draft accepted (per-position rates 1:
# each block commits 4 tokens, every bet wins), 4 blocks in flight
ALL_ACCEPTED = {
    "stages": 4,
    "model": {"hidden_size": 256, "compute": {"kind": "linear", "base_ms": 5.0, "per_token_ms": 0}},
    "network": {"latency_ms": 10.0, "bandwidth_mbps": 1e5},
    "drafter": {
        "kind": "draft_model",
        "placement": "first_stage",
        "draft_ms": 1.0,
        "acceptance": {"per_position": [1.0, 1.0, 1.0, 1.0], "extrapolate": True},
    },
    "speculation": {"policy": "chain", "k": 3},
    "schedule": {"kind": "async", "max_inflight_blocks": 4},
    "workload": {"requests": 1, "prompt_tokens": 16, "output_tokens": 101},
}
OVERLAP_LAST = {
    "drafter": {**ALL_ACCEPTED["drafter"], "placement": "last_stage", "overlap": True},
    "schedule": {"kind": "sync"},
}
FAILURE = {"detection_s": 0.25, "events": [{"stage": 1, "at_s": 0.3}]}


def run(data: dict, faults: dict | None = None, **workload):
    data = {**data, "workload": {**data["workload"], **workload}}
    if faults:
        data["faults"] = faults
    return simulate(load_scenario(data=data))


@pytest.mark.parametrize("variant", [{}, OVERLAP_LAST], ids=["async", "overlap-last-stage"])
def test_failover_hand_worked(variant):
    """Failure at 300 ms, 250 ms down: the run is 550 ms plus a fresh run of the request's
    prompt and committed tokens c for its 100 - c decode tokens left."""
    data = {**ALL_ACCEPTED, **variant}
    plain = run(data)
    res = run(data, FAILURE)
    log = res.details["faults"]
    c = log.reprefill_tokens - 16
    assert log.reprefills == 1 and 0 < c < 100
    assert c % 4 == 0  # blocks of K + 1 = 4 tokens each, every one committed in full
    # c: the tokens the plain run had committed by 300 ms (its laps, from the first token on)
    first = plain.details["record"].first_token_ms[0]
    verdicts = first + np.cumsum(plain.details["record"].laps_ms)
    assert c == 4 * int((verdicts <= 300.0).sum())
    fresh = run(data, prompt_tokens=16 + c, output_tokens=101 - c)
    assert res.details["makespan_ms"] == pytest.approx(
        550.0 + fresh.details["makespan_ms"], abs=1e-9
    )
    assert res.metrics["availability"] == pytest.approx(1 - 250 / res.details["makespan_ms"])
    # the lap across the failure carries it; the first token time is the first prefill's
    assert res.details["record"].first_token_ms[0] == first
    assert sum(res.details["record"].laps_ms) == pytest.approx(
        res.details["makespan_ms"] - first, abs=1e-9
    )


def test_fail_hand_worked():
    """recovery: fail: the request in the ring fails at 300 ms; the next one starts when the
    ring serves again (550 ms) and runs as the plain run's first request did."""
    two = run(ALL_ACCEPTED, {**FAILURE, "recovery": "fail"}, requests=2)
    one = run(ALL_ACCEPTED)
    m = two.metrics
    assert m["failed_requests"] == 1
    assert two.details["makespan_ms"] == pytest.approx(550.0 + one.details["makespan_ms"])
    assert m["goodput_tokens_per_s"] == pytest.approx(1e3 * 101 / two.details["makespan_ms"])


@pytest.mark.parametrize(
    "schedule,drafter",
    [
        ({"kind": "async", "max_inflight_blocks": 4}, {"placement": "first_stage"}),
        ({"kind": "sync"}, {"placement": "first_stage", "overlap": True}),
        ({"kind": "sync"}, {"placement": "last_stage", "overlap": True}),
        (
            {"kind": "async", "max_inflight_blocks": 3, "batching": "continuous"},
            {"placement": "first_stage"},
        ),
    ],
    ids=["async", "overlap-first", "overlap-last", "async-batched"],
)
def test_failover_is_lossless(schedule, drafter):
    """No acceptance draw or bet is consumed by a lost block: every request commits the same
    tokens in the same passes, and wins and loses the same bets, as without failures."""
    base = {
        "stages": 5,
        "seed": 3,
        "network": {"latency_ms": 5, "jitter": {"kind": "normal", "std_ms": 1}},
        "drafter": {
            "kind": "draft_model",
            "draft_ms": 1.0,
            "acceptance": {"alpha": 0.7},
            **drafter,
        },
        "speculation": {"policy": "chain", "k": 3},
        "schedule": schedule,
        "workload": {"requests": 12, "concurrency": 3, "output_tokens": 60, "prompt_tokens": 32},
    }
    plain = simulate(load_scenario(data=base))
    faulty = {
        **base,
        "faults": {"detection_s": 0.05, "events": [{"link": 2, "rate_per_hour": 36000}]},
    }
    res = simulate(load_scenario(data=faulty))
    assert len(res.details["faults"].outages) >= 3
    assert res.details["faults"].reprefills >= 3
    record, calm = res.details["record"], plain.details["record"]
    assert np.array_equal(record.passes, calm.passes)
    assert np.array_equal(record.lap_tokens, calm.lap_tokens)
    assert res.metrics["tau"] == plain.metrics["tau"]
    bets = res.details["blocks"]
    assert (bets["bets_won"], bets["bets_lost"]) == (
        plain.details["blocks"]["bets_won"],
        plain.details["blocks"]["bets_lost"],
    )


def test_a_failure_after_the_run_changes_nothing():
    plain = run(ALL_ACCEPTED, requests=3)
    late = run(ALL_ACCEPTED, {"events": [{"stage": 0, "at_s": 1000}]}, requests=3)
    assert late.details["makespan_ms"] == plain.details["makespan_ms"]
    assert late.metrics["availability"] == 1.0


# a 6-stage ring at 20 ms a hop, K = 3, alpha 0.75, 4 blocks in flight; 20 requests of 200
# tokens, a stage failing 120 times an hour (2 s down): ~0.3 failures per request
RING = {
    "stages": 6,
    "model": {
        "hidden_size": 4096,
        "compute": {"kind": "linear", "base_ms": 6.0, "per_token_ms": 0.05},
    },
    "network": {
        "latency_ms": 20.0,
        "bandwidth_mbps": 200,
        "jitter": {"kind": "lognormal", "std_ms": 2},
    },
    "drafter": {
        "kind": "draft_model",
        "placement": "first_stage",
        "draft_ms": 2.0,
        "acceptance": {"alpha": 0.75},
    },
    "speculation": {"policy": "chain", "k": 3},
    "schedule": {"kind": "async", "max_inflight_blocks": 4},
    "workload": {"requests": 20, "prompt_tokens": 256, "output_tokens": 200},
    "faults": {"detection_s": 2.0, "events": [{"stage": 2, "rate_per_hour": 120}]},
}


@pytest.mark.parametrize(
    "case,over,tokens_rel",
    [
        ("async failover", {}, 0.05),
        ("async fail", {"faults": {**RING["faults"], "recovery": "fail"}}, 0.05),
        (
            "overlapped drafter at the last stage",
            {
                "drafter": {**RING["drafter"], "placement": "last_stage", "overlap": True},
                "schedule": {"kind": "sync"},
            },
            0.05,
        ),
        # the loaded block schedule's own error without faults is -3% here (docs/approximations.md)
        (
            "async, 4 requests in flight",
            {"workload": {**RING["workload"], "concurrency": 4, "requests": 40}},
            0.08,
        ),
    ],
)
def test_analytical_against_the_des_mean(case, over, tokens_rel):
    """Measured (these 4 seeds, 2026-12-04): tokens/s -2.2%, -0.2%, -2.2%, -5.3%; goodput
    -1.8%, -9.0% (failed requests are few: the DES's standard error there is 3-4%), -2.5%,
    -3.7%; availability 0.012-0.019 below the DES's (the same ring synchronous: 0.009-0.016)."""
    scenario = load_scenario(data={**RING, **over})
    ana = agrees_with_des_mean(scenario, case, 4, tokens_rel, 0.1, 0.03)
    assert not ana.approximation["validated"] and "faults" in ana.approximation["regime"]


def test_the_restart_lap_is_what_a_failover_adds():
    """The ring time a failover adds (makespan less the downtimes and the same seed's run
    without failures, per failure), DES against the model's: 8 stages at 30 ms, alpha 0.9,
    8 blocks in flight, so a chain's verdicts come 8 ms apart and a restart's a whole lap
    (293 ms) after it. Measured (these 5 seeds): DES 596 ms (standard error 8 ms); the model
    627 ms (+5.3%); without the restart term and the laps' own residual (the sync model's,
    a lap of the mean length) 531 ms (-10.8%: fails the bound)."""
    data = {
        **RING,
        "stages": 8,
        "network": {"latency_ms": 30.0, "bandwidth_mbps": 1000},
        "drafter": {**RING["drafter"], "acceptance": {"alpha": 0.9}},
        "schedule": {"kind": "async", "max_inflight_blocks": 8},
        "workload": {"requests": 20, "prompt_tokens": 64, "output_tokens": 400},
        "faults": {"detection_s": 0.5, "events": [{"stage": 2, "rate_per_hour": 600}]},
    }
    scenario = load_scenario(data=data)
    calm = load_scenario(data={**data, "faults": {}})
    added = []
    for seed in range(5):
        res = simulate(dataclasses.replace(scenario, seed=seed))
        log = res.details["faults"]
        plain = simulate(dataclasses.replace(calm, seed=seed)).details["makespan_ms"]
        added.append((res.details["makespan_ms"] - log.down_ms(np.inf) - plain) / len(log.outages))
    model = analyze(scenario).details["faults"]["added_ring_ms_per_failover"]
    assert model == pytest.approx(float(np.mean(added)), rel=0.08)


def test_the_per_round_hybrid_with_faults_runs_in_the_des():
    """(The analytical engine's answer: tests/physics/test_faults_hybrid.py.)"""
    data = {
        **RING,
        "drafter": {
            **RING["drafter"],
            "kind": "ngram",
            "acceptance": {"alpha": 0.75, "sibling_logit_offsets": [1.0, 1.8]},
        },
        "speculation": {
            "policy": "chain",
            "k": 3,
            "tree": {"kind": "static", "branching": [3, 2, 1]},
        },
        "schedule": {"kind": "async", "max_inflight_blocks": 4, "hybrid_confident_fraction": 0.6},
    }
    res = simulate(load_scenario(data=data))
    assert res.metrics["availability"] < 1 and res.details["faults"].reprefills >= 1


def test_the_failover_what_if_with_async():
    """scenarios/ring-stage-failover.yaml's async variant (its comment): goodput 10.6 tok/s in
    the DES, 10.5 analytically, against 9.0 in the DES synchronous."""
    path = "scenarios/ring-stage-failover.yaml"
    sets = ["schedule.kind=async", "schedule.max_inflight_blocks=4"]
    des = simulate(load_scenario(path, sets)).metrics
    ana = analyze(load_scenario(path, sets)).metrics
    sync = simulate(load_scenario(path)).metrics
    assert des["goodput_tokens_per_s"] == pytest.approx(10.6, abs=0.05)
    assert ana["goodput_tokens_per_s"] == pytest.approx(10.5, abs=0.05)
    assert sync["goodput_tokens_per_s"] == pytest.approx(9.0, abs=0.05)
