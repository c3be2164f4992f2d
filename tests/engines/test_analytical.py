"""The analytical engine against hand-worked laps, Monte Carlo and its own grid evaluation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import NO_SPEC, REFERENCE
from wansim.acceptance.model import acceptance_model
from wansim.acceptance.sampler import sample_accepted
from wansim.analytical import analyze, evaluate_grid
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.links.expected_delay import jitter_dist, sample_losses
from wansim.links.wire_bytes import serialise_ms

SMALL = {
    "stages": 3,
    "model": {
        "hidden_size": 1024,
        "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.1},
    },
    "network": {"latency_ms": 10, "bandwidth_mbps": 100},
    "payload": {"activation_bits": 16, "header_bytes": 64, "return_bytes": 50},
    "drafter": {"draft_ms": 1.0, "acceptance": {"alpha": 0.5}},
    "speculation": {"policy": "chain", "k": 3},
    "workload": {"prompt_tokens": 16, "output_tokens": 1_000_001},
}


def test_hand_computed_lap_and_rate():
    r = analyze(load_scenario(data=SMALL))
    stage = 2.0 + 0.1 * 4  # n = K + 1 = 4 tokens per pass
    fwd_hop = 10 + (64 + 4 * 2048) * 8 / (100 * 1000)
    ret_hop = 10 + 50 * 8 / (100 * 1000)
    lap = 1.0 + 3 * stage + 2 * fwd_hop + ret_hop
    tau = (1 - 0.5**4) / (1 - 0.5)
    assert r.metrics["lap_ms_mean"] == pytest.approx(lap, rel=1e-12)
    assert r.metrics["lap_ms_p50"] == pytest.approx(lap) and r.metrics[
        "lap_ms_p99"
    ] == pytest.approx(lap)
    assert r.metrics["tau"] == pytest.approx(tau, rel=1e-5)
    assert r.metrics["tokens_per_s"] == pytest.approx(1000 * tau / lap, rel=1e-5)
    # renewal-reward: tokens/s = tau / E[T_lap] with the tau the engine reports (long output)
    assert r.metrics["tokens_per_s"] == pytest.approx(
        1000 * r.metrics["tau"] / r.metrics["lap_ms_mean"], rel=1e-5
    )
    assert r.metrics["wasted_token_fraction"] == pytest.approx(1 - tau / 4, rel=1e-5)
    assert r.metrics["bytes_per_token"] == pytest.approx((2 * (64 + 4 * 2048) + 50) / tau, rel=1e-5)


def test_utilisation_hand_worked():
    data = dict(SMALL, workload={"prompt_tokens": 16, "output_tokens": 101})
    sc = load_scenario(data=data)
    r = analyze(sc)
    passes = r.details["passes_per_request"]
    prefill = 3 * (2.0 + 0.1 * 16) + 2 * (10 + float(serialise_ms(64 + 16 * 2048, 100)))
    duration = prefill + passes * r.metrics["lap_ms_mean"]
    busy = (2.0 + 1.6) + passes * 2.4
    util = r.metrics["stage_utilization"]
    assert util[0] == pytest.approx(busy / duration) and util[2] == pytest.approx(
        (busy + passes * 1.0) / duration
    )
    assert r.metrics["bubble_fraction"] == pytest.approx(1 - np.mean(util))
    assert r.metrics["ttft_ms_mean"] == pytest.approx(prefill)


JITTERY = {
    "stages": 4,
    "network": {
        "latency_ms": 20,
        "bandwidth_mbps": 200,
        "jitter": {"kind": "lognormal", "std_ms": 4},
        "hops": [
            {"jitter": {"kind": "normal", "std_ms": 15}},
            {"loss_rate": 0.05, "jitter": {"kind": "none"}},
            {},
            {"jitter": {"kind": "pareto", "std_ms": 5, "shape": 3.5}},
        ],
        "retransmit_ms": 60,
    },
    "drafter": {"acceptance": {"alpha": 0.7}},
    "speculation": {"k": 4},
}


def monte_carlo_laps(sc, n, rng):
    r = analyze(sc)
    parts = r.details["lap_breakdown_ms"]
    constant = parts["draft"] + parts["stage_compute"]
    from wansim.links.wire_bytes import forward_bytes, return_bytes

    total = np.full(n, constant)
    hops = sc.resolved_hops()
    for i, hop in enumerate(hops):
        size = (
            return_bytes(sc.payload)
            if i == len(hops) - 1
            else forward_bytes(sc.payload, sc.model.hidden_size, sc.k + 1)
        )
        ser = float(serialise_ms(size, hop.bandwidth_mbps))
        prop = np.maximum(0, hop.latency_ms + jitter_dist(hop.jitter).sample(rng, n))
        g = sample_losses(rng, hop.loss_rate, n)
        total += ser * (1 + g) + g * hop.retransmit_ms + prop
    return r, total


def test_lap_percentiles_match_monte_carlo():
    sc = load_scenario(data=JITTERY)
    r, laps = monte_carlo_laps(sc, 1_000_000, np.random.default_rng(5))
    assert r.metrics["lap_ms_mean"] == pytest.approx(laps.mean(), rel=2e-3)
    assert r.metrics["lap_ms_p50"] == pytest.approx(np.quantile(laps, 0.5), rel=2e-3)
    assert r.metrics["lap_ms_p99"] == pytest.approx(np.quantile(laps, 0.99), rel=5e-3)


def test_tpot_percentiles_match_monte_carlo():
    """Decode whole requests: difficulty per request, accepted per pass, a jittery lap per pass."""
    sc = load_scenario(REFERENCE, ["workload.output_tokens=201"])
    r = analyze(sc)
    rng = np.random.default_rng(11)
    model = acceptance_model(sc.drafter.acceptance)
    rates = model.request_rates(rng, 4000, 7)
    lap = r.metrics["lap_ms_mean"]
    jitter = jitter_dist(sc.network.jitter)
    tpots = []
    for row in rates:
        a = sample_accepted(rng, row, 200)
        passes = int(np.searchsorted(np.cumsum(a + 1), 200)) + 1
        hop_noise = jitter.sample(rng, passes * 10).sum() - passes * 10 * jitter.mean()
        tpots.append((passes * lap + hop_noise) / 200)
    tpots = np.array(tpots)
    assert r.metrics["tpot_ms_p50"] == pytest.approx(np.quantile(tpots, 0.5), rel=0.02)
    assert r.metrics["tpot_ms_p99"] == pytest.approx(np.quantile(tpots, 0.99), rel=0.05)
    assert r.metrics["tokens_per_s"] == pytest.approx(np.mean(1000 / tpots), rel=0.02)


def test_grid_agrees_with_one_at_a_time():
    sc = load_scenario(REFERENCE)
    grid = {
        "speculation.k": [1, 4, 7],
        "network.latency_ms": [5.0, 80.0],
        "payload.activation_bits": [4, 16],
        "stages": [2, 10],
    }
    frame = evaluate_grid(sc, grid)
    assert len(frame) == 24
    for row in frame.itertuples(index=False):
        one = analyze(
            load_scenario(
                REFERENCE,
                {
                    "speculation.k": int(row[frame.columns.get_loc("speculation.k")]),
                    "network.latency_ms": float(row[frame.columns.get_loc("network.latency_ms")]),
                    "payload.activation_bits": int(
                        row[frame.columns.get_loc("payload.activation_bits")]
                    ),
                    "stages": int(row[frame.columns.get_loc("stages")]),
                },
            )
        )
        for name in (
            "tokens_per_s",
            "tau",
            "lap_ms_mean",
            "bytes_per_token",
            "bubble_fraction",
            "throughput_tokens_per_s",
        ):
            assert getattr(row, name) == pytest.approx(one.metrics[name], rel=1e-9), name


def test_grid_validates_every_value_first():
    sc = load_scenario(REFERENCE)
    with pytest.raises(ScenarioError, match=r"speculation.k"):
        evaluate_grid(sc, {"speculation.k": [1, 3, 9]})
    with pytest.raises(ScenarioError, match=r"network.bandwidth_mbps: must be > 0"):
        evaluate_grid(sc, {"network.bandwidth_mbps": [10.0, -1.0]})
    with pytest.raises(ScenarioError, match="cannot vary"):
        evaluate_grid(sc, {"speculation.policy": ["none"]})


@settings(max_examples=30)
@given(
    st.floats(0, 150),
    st.floats(0.5, 60),
    st.floats(1, 1e5),
    st.integers(1, 16),
    st.integers(1, 7),
    st.sampled_from([3, 4, 8, 16]),
)
def test_monotone_in_latency_bandwidth_and_bits(latency, extra, bandwidth, stages, k, bits):
    sc = load_scenario(REFERENCE, {"stages": stages, "speculation.k": k})
    grid = evaluate_grid(sc, {"network.latency_ms": [latency, latency + extra]}, validate=False)
    assert grid.tokens_per_s[1] < grid.tokens_per_s[0]
    grid = evaluate_grid(sc, {"network.bandwidth_mbps": [bandwidth, bandwidth * 2]}, validate=False)
    assert grid.tokens_per_s[1] >= grid.tokens_per_s[0]
    grid = evaluate_grid(sc, {"payload.activation_bits": [3, bits]}, validate=False)
    assert grid.bytes_per_token[0] <= grid.bytes_per_token[1]


def test_speculation_speed_up_on_the_reference():
    spec = analyze(load_scenario(REFERENCE)).metrics
    plain = analyze(load_scenario(NO_SPEC)).metrics
    assert plain["tau"] == 1.0 and plain["wasted_token_fraction"] == 0.0
    speed_up = spec["tokens_per_s"] / plain["tokens_per_s"]
    # the lap barely grows (8 tokens instead of 1), so the gain is close to tau
    assert 0.9 * spec["tau"] < speed_up < 1.1 * spec["tau"] + 0.3


def test_unsupported_schedules_are_errors_not_answers():
    # what the approximations of wansim.analytical.blocks/concurrent still leave out
    async_ = ["drafter.placement=first_stage", "drafter.kind=draft_model", "schedule.kind=async"]
    with pytest.raises(ScenarioError, match=r"schedule\.kind.*trees"):
        analyze(load_scenario(REFERENCE, [*async_, "speculation.policy=tree"]))
    overlapped = [*async_, "drafter.overlap=true", "schedule.batching=continuous"]
    with pytest.raises(ScenarioError, match=r"schedule\.batching: an overlapped drafter"):
        analyze(load_scenario(REFERENCE, overlapped))


def test_grid_on_an_open_mesh_equals_the_point_by_point_evaluation(monkeypatch):
    """``evaluate_grid`` over a cartesian grid computes each intermediate only over the axes it
    depends on (an open mesh); the values must be those of the flattened points to the bit."""
    from wansim.analytical import grid

    base = load_scenario(REFERENCE, ["drafter.acceptance.extrapolate=true"])
    axes = {
        "speculation.k": np.array([1, 4, 9]),
        "network.latency_ms": np.array([0.0, 12.5, 80.0]),
        "network.bandwidth_mbps": np.array([3.0, 1e3]),
        "payload.activation_bits": np.array([4, 16]),
        "stages": np.array([1, 3, 10]),
    }
    open_mesh = grid.evaluate_grid(base, axes)
    monkeypatch.setattr(grid, "OPEN_MESH", False)
    monkeypatch.setattr(grid, "CHUNK", 17)  # several chunks
    points = grid.evaluate_grid(base, axes)
    pd.testing.assert_frame_equal(open_mesh, points, check_exact=True)
