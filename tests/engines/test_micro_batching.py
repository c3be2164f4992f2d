"""Micro-batched pipeline parallelism (wansim.serving.micro_batching, wansim.sim.micro_batches,
wansim.analytical.micro_batched).

- a hand-worked deterministic ring (no jitter, no speculation): the analytical cycle
  max(L, N s_max) computed by hand, exactly, in both regimes (latency-bound and
  bottleneck-bound); the DES's steady laps equal the hand-worked decode lap exactly;
- the DES keeps several batches in flight (utilisation grows with the batch count on the
  issue's 8-stage, 64-user ring) and the chunk budget spreads equal-length refills;
- the DES and the analytical engine agree within the regime's band on speculative rings;
- bad input: one line, exit 2, naming the field.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import REFERENCE
from wansim.analytical import analyze
from wansim.analytical.regime import REGIMES, approximation
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.sim import simulate

HIDDEN = 1024  # 16-bit activations: 2048 bytes a token
HEADER, VERDICT = 64, 50  # bytes
BASE_MS, PER_TOKEN_MS = 6.0, 0.02
MBPS = 1000.0  # 1 byte = 8e-6 ms


def ring(micro_batches: int, latency_ms: float, users: int = 8, **schedule) -> dict:
    """4 stages, linear compute, ideal links without jitter, no speculation: one token a pass
    for each sequence, 64 decode passes, prompts of 16 tokens, one wave of ``users``."""
    return {
        "stages": 4,
        "model": {
            "hidden_size": HIDDEN,
            "compute": {"kind": "linear", "base_ms": BASE_MS, "per_token_ms": PER_TOKEN_MS},
            "overhead_ms": 0.0,
        },
        "network": {"latency_ms": latency_ms, "bandwidth_mbps": MBPS, "jitter": {"kind": "none"}},
        "payload": {"activation_bits": 16, "header_bytes": HEADER, "return_bytes": VERDICT},
        "speculation": {"policy": "none"},
        "schedule": {"batching": "continuous", "micro_batches": micro_batches, **schedule},
        "workload": {
            "requests": users,
            "concurrency": users,
            "prompt_tokens": 16,
            "output_tokens": 65,
        },
    }


def hand_lap(tokens: float, records: float, latency_ms: float, batches: int) -> float:
    """The cycle by hand: L = 4 stages + 3 forward hops + the return hop; T = max(L, N s_max)."""
    stage = BASE_MS + PER_TOKEN_MS * tokens
    forward = latency_ms + (HEADER + 2 * HIDDEN * tokens) * 8e-6
    back = latency_ms + VERDICT * records * 8e-6
    lone = 4 * stage + 3 * forward + back
    slowest = max(stage, forward - latency_ms, back - latency_ms)
    return max(lone, batches * slowest)


@pytest.mark.parametrize(
    ("batches", "latency_ms", "bound"),
    [(4, 10.0, "latency"), (8, 0.5, "bottleneck"), (2, 0.5, "latency")],
)
def test_hand_worked_cycle(batches, latency_ms, bound):
    """8 users in ``batches`` micro-batches of b = 8 / batches. A slot's cycle: 1 prompt pass
    + 64 verify passes; the mean pass holds b (64 + 16) / 65 tokens and b 64 / 65 records."""
    b = 8 / batches
    tokens, records = b * 80 / 65, b * 64 / 65
    expected = hand_lap(tokens, records, latency_ms, batches)
    r = analyze(load_scenario(data=ring(batches, latency_ms)))
    assert r.metrics["lap_ms_mean"] == pytest.approx(expected, rel=1e-12)
    assert r.details["bound"] == bound
    # one token a pass: TPOT is the lap, tokens/s its inverse
    assert r.metrics["tpot_ms_p50"] == pytest.approx(expected, rel=1e-9)
    assert r.metrics["tokens_per_s"] == pytest.approx(1e3 / expected, rel=1e-12)
    assert r.approximation["regime"] == "micro-batched"


def test_hand_worked_numbers():
    """The two regimes in numbers. 4 batches of 2 at 10 ms: L = 4 (6 + 0.02 x 2.4615) +
    3 (10 + 0.0404) + (10 + 0.0008) = 64.3202 ms > 4 x 6.0492: latency-bound.
    8 batches of 1 at 0.5 ms: L = 26.16 < 8 x (6 + 0.02 x 1.2308) = 48.197: the stage is the
    bottleneck."""
    assert hand_lap(2 * 80 / 65, 2 * 64 / 65, 10.0, 4) == pytest.approx(64.32023630769, rel=1e-11)
    assert hand_lap(80 / 65, 64 / 65, 0.5, 8) == pytest.approx(8 * (6 + 0.02 * 80 / 65))


@pytest.mark.parametrize(("batches", "latency_ms"), [(4, 10.0), (8, 0.5), (2, 0.5)])
def test_des_steady_lap_is_the_hand_worked_decode_lap(batches, latency_ms):
    """Decode passes alone (b tokens, b records): the DES's median lap is the max-plus cycle
    to the last digit (the prompt pass only perturbs the first laps)."""
    b = 8 // batches
    laps = simulate(load_scenario(data=ring(batches, latency_ms))).details["record"].laps_ms
    assert float(np.median(laps)) == pytest.approx(hand_lap(b, b, latency_ms, batches), rel=1e-12)


def test_more_batches_in_flight_fill_the_issue_ring():
    """The issue's ring: 8 stages, 64 users. One batch leaves the stages idle most of the time;
    8 micro-batches keep several stages busy at once, and deliver more tokens."""
    over = {
        "stages": 8,
        "schedule.batching": "continuous",
        "workload.concurrency": 64,
        "workload.requests": 128,
        "workload.output_tokens": 48,
        "workload.prompt_tokens": 64,
    }
    runs = {
        n: simulate(load_scenario(REFERENCE, {**over, "schedule.micro_batches": n})).metrics
        for n in (1, 8)
    }
    assert runs[1]["bubble_fraction"] > 0.9
    assert runs[8]["bubble_fraction"] < runs[1]["bubble_fraction"] - 0.05
    assert runs[8]["throughput_tokens_per_s"] > 1.5 * runs[1]["throughput_tokens_per_s"]


def test_max_batch_size_caps_the_requests_in_flight():
    data = ring(2, 10.0, users=8, max_batch_size=2)  # 4 in flight, 4 wait
    des = simulate(load_scenario(data=data))
    rec = des.details["record"]
    waited = rec.admitted_ms - rec.arrival_ms
    assert (waited[:4] == 0).all() and (waited[4:] > 0).all()
    ana = analyze(load_scenario(data=data))
    assert ana.details["micro_batch_size"] == 2


def test_chunk_budget_spreads_equal_length_refills():
    """Equal-length requests without speculation finish together. Whole prompts: each
    micro-batch refills as one block and its members stay in lockstep (their first tokens
    coincide). A chunk budget of one prompt a pass serves the waiting prompts one after
    another: the members' first tokens spread a lap apart."""
    data = ring(2, 10.0, users=8)
    data["workload"]["requests"] = 24

    def first_tokens(schedule: dict) -> np.ndarray:
        d = {**data, "schedule": {**data["schedule"], **schedule}}
        rec = simulate(load_scenario(data=d)).details["record"]
        return np.sort(rec.first_token_ms[8:])  # the replacements

    whole = first_tokens({})
    chunked = first_tokens({"prefill_chunk_tokens": 16})
    assert len(np.unique(np.round(whole, 6))) <= 4  # a block per micro-batch and wave
    assert len(np.unique(np.round(chunked, 6))) == 16  # one prompt a pass: all apart


@pytest.mark.parametrize(
    "over",
    [
        {"speculation.k": 4},
        {"speculation.k": 4, "network.latency_ms": 1.0},
        {"speculation.k": 6, "schedule.micro_batches": 2},
    ],
)
def test_des_agrees_within_the_band(over):
    base = {
        "stages": 8,
        "schedule.batching": "continuous",
        "schedule.micro_batches": 8,
        "schedule.prefill_chunk_tokens": 128,
        "workload.concurrency": 64,
        "workload.requests": 192,
        "workload.output_tokens": 128,
        "workload.prompt_tokens": 256,
    }
    sc = load_scenario(REFERENCE, {**base, **over})
    des, ana = simulate(sc).metrics, analyze(sc)
    band = REGIMES["micro-batched"].error_band
    assert ana.approximation["validated"]
    for key in ("tokens_per_s", "throughput_tokens_per_s", "ttft_ms_mean"):
        assert abs(ana.metrics[key] / des[key] - 1) <= band[key], (key, ana.metrics[key], des[key])
    assert abs(ana.metrics["bubble_fraction"] - des["bubble_fraction"]) <= band["bubble_fraction"]


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"schedule.micro_batches": 4}, "schedule.micro_batches"),  # batching: none
        ({"schedule.max_batch_size": 4}, "schedule.max_batch_size"),
        ({"schedule.prefill_chunk_tokens": 64}, "schedule.prefill_chunk_tokens"),
        (
            {"schedule.batching": "continuous", "schedule.micro_batches": 0},
            "schedule.micro_batches",
        ),
        (
            {
                "schedule.batching": "continuous",
                "schedule.micro_batches": 2,
                "schedule.kind": "async",
                "schedule.max_inflight_blocks": 2,
                "drafter.placement": "first_stage",
                "drafter.kind": "draft_model",
            },
            "schedule.micro_batches",
        ),
        (
            {
                "schedule.batching": "continuous",
                "schedule.micro_batches": 2,
                "drafter.overlap": True,
            },
            "schedule.micro_batches",
        ),
    ],
)
def test_bad_input_names_the_field(over, field, run_cli):
    with pytest.raises(ScenarioError) as err:
        load_scenario(REFERENCE, over)
    assert str(err.value).startswith(field)
    sets = [a for k, v in over.items() for a in ("--set", f"{k}={v}")]
    code, _, stderr = run_cli("run", REFERENCE, *sets)
    assert code == 2 and stderr.count("\n") == 1 and field in stderr, stderr


def test_regime_is_named_and_unmeasured_corners_say_so():
    whole = approximation(load_scenario(data=ring(4, 10.0)))
    assert whole.regime == "micro-batched" and not whole.validated
    assert "whole prompts" in whole.why
    over = {
        "schedule.batching": "continuous",
        "schedule.micro_batches": 8,
        "schedule.prefill_chunk_tokens": 128,
        "workload.concurrency": 64,
    }
    assert approximation(load_scenario(REFERENCE, over)).validated
    many = approximation(load_scenario(REFERENCE, {**over, "workload.concurrency": 256}))
    assert not many.validated and "beyond the measured grid" in many.why
    queued = approximation(load_scenario(REFERENCE, {**over, "stages": 4}))
    assert not queued.validated and "more micro-batches than stages" in queued.why
    # 16 users in 8 batches of 2: a 256-token chunk beside 16 verify tokens
    lumpy = approximation(
        load_scenario(
            REFERENCE,
            {**over, "workload.concurrency": 16, "schedule.prefill_chunk_tokens": 256},
        )
    )
    assert not lumpy.validated and "the mean pass" in lumpy.why


def test_grid_gives_what_analyze_gives_point_by_point():
    from wansim.analytical import evaluate_grid

    over = {
        "schedule.batching": "continuous",
        "schedule.micro_batches": 8,
        "schedule.prefill_chunk_tokens": 128,
    }
    grid = {"workload.concurrency": [16, 64], "network.latency_ms": [1, 25]}
    frame = evaluate_grid(load_scenario(REFERENCE, over), grid)
    for _, r in frame.iterrows():
        point = {
            **over,
            "workload.concurrency": int(r["workload.concurrency"]),
            "network.latency_ms": float(r["network.latency_ms"]),
        }
        one = analyze(load_scenario(REFERENCE, point)).metrics
        for key in ("tokens_per_s", "throughput_tokens_per_s", "ttft_ms_mean", "bubble_fraction"):
            assert r[key] == pytest.approx(one[key], rel=1e-12), key
