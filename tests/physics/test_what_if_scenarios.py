"""Issue 13's what-if scenarios in scenarios/ run in both engines where both model them, and
what each asks is checked against a hand computation (drift: tests/physics/test_link_trace.py;
fail-over: tests/physics/test_faults.py; the hybrid: tests/engines/test_hybrid_rounds.py)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.sim import simulate

CONSUMER = ROOT / "scenarios" / "consumer-gpu-ring-40mbps.yaml"
EAGLE3 = ROOT / "scenarios" / "eagle3-aux-states-ring.yaml"
TCP = ROOT / "scenarios" / "tcp-ring-frame-per-lap.yaml"
FREE = ["network.per_message_ms=0", "network.codec_ms_per_mb=0", "model.overhead_ms=0"]


def _laps(path, over=()) -> tuple[float, float]:
    sc = load_scenario(path, list(over))
    return analyze(sc).metrics["lap_ms_mean"], simulate(sc).metrics["lap_ms_mean"]


def test_consumer_ring_per_message_costs_hand_worked():
    """8 stages, K = 4 (5 tokens a pass): a forward frame is 64 + 5 x 8192 x 2 = 81,984 bytes.
    The costs add per lap 7 x (5 + 4 x 0.081984) ms (forward hops), 5 + 4 x 50e-6 (return) and
    8 x 3 x 1.0 (per-pass overhead x host factor) = 66.295752 ms: the analytical lap to 1e-9,
    the DES's mean lap (lognormal jitter, 32 requests) within 0.5% of the analytical one."""
    hand = 7 * (5.0 + 4.0 * 81_984 / 1e6) + (5.0 + 4.0 * 50 / 1e6) + 8 * 3.0 * 1.0
    assert hand == pytest.approx(66.295752, abs=1e-9)
    ana, des = _laps(CONSUMER)
    ana_free, des_free = _laps(CONSUMER, FREE)
    assert ana - ana_free == pytest.approx(hand, rel=1e-9)
    assert des == pytest.approx(ana, rel=0.005)
    assert des_free == pytest.approx(ana_free, rel=0.005)


def test_eagle3_aux_states_hand_worked():
    """The low layer's states ride hops 1..6, the middle layer's hops 4..6: 9 hop-tensors of
    5 x 8192 x 2 = 81,920 bytes, each 81,920 x 8 / 40e3 ms of serialisation at 40 Mbit/s plus
    4 ms/MB of codec: 150.40512 ms a lap, in the analytical lap to 1e-9 and the DES within 0.5%."""
    per = 81_920 * 8 / 40e3 + 4.0 * 81_920 / 1e6
    ana, des = _laps(EAGLE3)
    ana_without, _ = _laps(EAGLE3, ["payload.extra_tensors=[]"])
    assert ana - ana_without == pytest.approx(9 * per, rel=1e-9)
    assert 9 * per == pytest.approx(150.40512, abs=1e-9)
    assert des == pytest.approx(ana, rel=0.005)


def test_tcp_ring_one_frame_per_lap_vs_pipelined():
    """One request: every 131 kB frame restarts from the initial window (the link idles past
    the RTO), both engines give the same lap; 8 requests pipelined keep the windows open: the
    lap falls to within 10% of the ideal transport's, from over 4x it (the analytical engine:
    the same, from each hop's train of 8 frames a lap, validated: false, and the range from
    every window cold to every window open around the DES's lap); a batch without
    micro-batches is answered as its requests apart, the range around the DES's lap."""
    ana, des = _laps(TCP)
    assert des == pytest.approx(ana, rel=1e-9)
    ideal, _ = _laps(TCP, ["network.transport=ideal"])
    assert ana > 4.0 * ideal
    piped = load_scenario(TCP, ["workload.concurrency=8"])
    lap = simulate(piped).metrics["lap_ms_mean"]
    assert ideal < lap <= 1.10 * ideal
    loaded = analyze(piped)
    assert loaded.metrics["lap_ms_mean"] <= 1.15 * lap and not loaded.approximation["validated"]
    low, high = loaded.approximation["range"]["lap_ms_mean"]
    assert low <= lap * 1.15 and lap <= high
    batch = load_scenario(TCP, ["workload.concurrency=8", "schedule.batching=continuous"])
    apart = analyze(batch)  # its groups drift apart: answered as the requests apart
    lap = simulate(batch).metrics["lap_ms_mean"]
    low, high = apart.approximation["range"]["lap_ms_mean"]
    assert low <= lap * 1.15 and lap <= high * 1.15 and not apart.approximation["validated"]
