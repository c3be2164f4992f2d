"""Per-message software costs on links and per-stage pass overheads: hand-worked laps, strict
validation, and the engines against each other and against those hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.sim import simulate


def ring(**over) -> dict:
    data = {
        "stages": 3,
        "model": {
            "hidden_size": 4096,
            "compute": {"kind": "linear", "base_ms": 1.0, "per_token_ms": 0.0},
            "overhead_ms": 0.5,
            "host_cpu_factor": 2.0,
        },
        "network": {
            "latency_ms": 10.0,
            "bandwidth_mbps": 40.0,
            "per_message_ms": 3.0,
            "codec_ms_per_mb": 2.0,
        },
        "payload": {"activation_bits": 16, "header_bytes": 64, "return_bytes": 50},
        "speculation": {"policy": "none"},
        "workload": {"requests": 3, "prompt_tokens": 8, "output_tokens": 20},
    }
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


def hand_lap_ms() -> float:
    # one token a pass: 64 + 4096 * 2 = 8256 bytes forward, 50 back
    fwd = 10.0 + 8256 * 8 / 40e3 + (3.0 + 2.0 * 8256 / 1e6)  # 10 + 1.6512 + 3.016512
    ret = 10.0 + 50 * 8 / 40e3 + (3.0 + 2.0 * 50 / 1e6)  # 10 + 0.01 + 3.0001
    stage = 1.0 + 0.5 * 2.0  # compute + overhead x host factor
    return 3 * stage + 2 * fwd + ret


def test_lap_hand_worked_both_engines():
    sc = load_scenario(data=ring())
    expected = hand_lap_ms()
    assert expected == pytest.approx(48.345524)  # 6 + 2 x 14.667712 + 13.0101
    des = simulate(sc)
    laps = des.details["record"].laps_ms
    assert np.allclose(laps, expected, rtol=1e-12)
    assert analyze(sc).metrics["lap_ms_mean"] == pytest.approx(expected, rel=1e-12)
    assert des.metrics["tokens_per_s"] == pytest.approx(1e3 / expected, rel=1e-9)


def test_per_hop_costs_and_per_stage_overheads_hand_worked():
    hops = [
        {"per_message_ms": 1.0},
        {"per_message_ms": 5.0, "codec_ms_per_mb": 0.0},
        {},  # return hop: the network's defaults
    ]
    data = ring(
        network={"hops": hops},
        model={"stage_overhead_ms": [0.0, 1.0, 4.0], "host_cpu_factor": 1.5},
    )
    sc = load_scenario(data=data)
    fwd0 = 10.0 + 1.6512 + 1.0 + 2.0 * 8256 / 1e6
    fwd1 = 10.0 + 1.6512 + 5.0
    ret = 10.0 + 0.01 + 3.0 + 2.0 * 50 / 1e6
    stages = 3 * 1.0 + 1.5 * (0.0 + 1.0 + 4.0)
    expected = stages + fwd0 + fwd1 + ret
    assert np.allclose(simulate(sc).details["record"].laps_ms, expected, rtol=1e-12)
    assert analyze(sc).metrics["lap_ms_mean"] == pytest.approx(expected, rel=1e-12)


def test_software_cost_queues_back_to_back_messages():
    """Concurrency 2 on one stage: two passes leave S0 together; the second waits for the
    first's software cost and serialisation (the sender is busy), not for its latency."""
    data = ring(
        stages=1,
        network={"per_message_ms": 20.0, "codec_ms_per_mb": 0.0, "latency_ms": 1.0},
        model={"overhead_ms": 0.0},
        workload={"requests": 2, "concurrency": 2, "prompt_tokens": 8, "output_tokens": 3},
    )
    des = simulate(load_scenario(data=data), timeline=True)
    sends = sorted(des.details["timeline"].transfers, key=lambda r: r[2])
    # the first two messages on the one (return) hop: offered together after the prefills
    (_, _, start0, free0, *_), (_, offer1, start1, *_) = sends[:2]
    assert offer1 < free0  # offered while the sender was still busy with the first
    assert start1 == pytest.approx(free0)  # so it waited for the sender
    assert free0 - start0 == pytest.approx(20.0 + 50 * 8 / 40e3)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("network.per_message_ms", -1.0, "network.per_message_ms: must be >= 0, got -1"),
        ("network.codec_ms_per_mb", "x", "network.codec_ms_per_mb: must be a number, got 'x'"),
        ("model.overhead_ms", -0.5, "model.overhead_ms: must be >= 0, got -0.5"),
        ("model.host_cpu_factor", 0, "model.host_cpu_factor: must be > 0, got 0"),
        (
            "model.stage_overhead_ms",
            [1.0, 2.0],
            "model.stage_overhead_ms: needs 3 entries (one per stage; or use model.overhead_ms)",
        ),
    ],
)
def test_bad_values_are_one_line_errors(path, value, message):
    section, field = path.split(".")
    data = ring(**{section: {field: value}})
    with pytest.raises(ScenarioError) as err:
        load_scenario(data=data)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_per_hop_override_is_validated():
    data = ring(network={"hops": [{"per_message_ms": -2.0}, {}, {}]})
    with pytest.raises(ScenarioError, match=r"network.hops\[0\].per_message_ms: must be >= 0"):
        load_scenario(data=data)


@pytest.mark.parametrize("kind", ["mtp", "dspark", "dflash", "eagle"])
def test_hidden_state_head_cannot_draft_ahead_at_s0(kind):
    data = ring(
        drafter={"kind": kind, "placement": "first_stage", "acceptance": {"alpha": 0.8}},
        speculation={"policy": "chain", "k": 3},
        schedule={"kind": "async", "max_inflight_blocks": 2},
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(data=data)
    text = str(err.value)
    assert text.startswith("drafter.kind: reads the last stage's hidden state") and "\n" not in text
    assert text.endswith(f"got '{kind}'")
    for ok in ("draft_model", "ngram"):  # token-id drafters may draft ahead
        load_scenario(data={**data, "drafter": {**data["drafter"], "kind": ok}})
