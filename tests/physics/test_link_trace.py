"""Time-varying links: a replayed trace (network.trace_file) and the drift, in the DES (per
message) and in the analytical engine (quasi-static pieces), against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from wansim.analytical import analyze
from wansim.analytical.nonstationary import stationary_at
from wansim.config.network import Drift
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.links import nonstationary
from wansim.links.nonstationary import Modulation, pieces, read_trace
from wansim.sim import simulate


def write(tmp_path, text: str, name: str = "trace.csv") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def ring(tmp_path, trace: str | None = None, **over) -> dict:
    net = {"latency_ms": 20.0, "bandwidth_mbps": 1e4}
    if trace is not None:
        net["trace_file"] = write(tmp_path, trace)
    data = {
        "stages": 4,
        "model": {
            "hidden_size": 256,
            "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.0},
        },
        "network": net,
        "speculation": {"policy": "none"},
        "workload": {"requests": 40, "prompt_tokens": 8, "output_tokens": 20},
    }
    data.update(over)
    return data


STEP = "t_ms,latency_factor,bandwidth_factor\n0,1,1\n2000,3,1\n"


def test_sample_and_hold_and_with_drift():
    trace = ((0.0, 100.0, 300.0), (1.0, 2.0, 4.0), (1.0, 0.5, 0.25))
    mod = Modulation(None, trace)
    assert mod.at(-5.0) == (1.0, 1.0)
    assert mod.at(99.9) == (1.0, 1.0)
    assert mod.at(100.0) == (2.0, 0.5)
    assert mod.at(1e9) == (4.0, 0.25)  # the last sample holds
    both = Modulation(Drift(latency_factor=2.0, bandwidth_factor=1.0, over_ms=200.0), trace)
    assert both.at(100.0) == pytest.approx((2.0 * 1.5, 0.5))  # drift x1.5 at half its ramp


def test_pieces_time_average_latency_harmonic_bandwidth(tmp_path, monkeypatch):
    """Merged into 2 pieces of 200 ms: [0, 200) holds samples (1, 1) for 100 ms and (2, 0.5)
    for 100 ms: latency factor 1.5, bandwidth 200 / (100 / 1 + 100 / 0.5) = 2/3."""
    text = "t_ms,latency_factor,bandwidth_factor\n0,1,1\n100,2,0.5\n200,4,0.25\n400,1,1\n"
    sc = load_scenario(data=ring(tmp_path, text))
    monkeypatch.setattr(nonstationary, "MAX_PIECES", 2)
    got = pieces(sc.network)
    assert got[0] == pytest.approx((0.0, 1.5, 2.0 / 3.0))
    assert got[1] == pytest.approx((200.0, 4.0, 0.25))  # [200, 400): one sample
    assert got[-1] == pytest.approx((400.0, 1.0, 1.0))  # the last holds forever


def test_des_replays_the_trace_lap_by_lap(tmp_path):
    """Latency x3 from 2000 ms: laps before are 4 x 2 + 4 x 20 ms (+ serialisation), laps
    whose every message starts after 2000 ms pay 4 x 60 ms."""
    sc = load_scenario(data=ring(tmp_path, STEP))
    rec = simulate(sc).details["record"]
    wire = (3 * (64 + 256 * 2) + 50) * 8 / 1e7
    laps = np.asarray(rec.laps_ms)
    assert laps[0] == pytest.approx(8.0 + 80.0 + wire, rel=1e-12)
    assert laps[-1] == pytest.approx(8.0 + 240.0 + wire, rel=1e-12)
    assert set(np.round(laps, 6)) <= {
        round(8.0 + 80.0 + wire + 40.0 * k, 6) for k in range(5)
    }  # a lap straddling 2000 ms: some of its hops at x3


def test_analytical_walks_the_pieces_by_hand(tmp_path):
    """Two pieces: theta_1 tokens/ms for 2000 ms, then theta_2 until W = 40 x 20 tokens:
    T = 2000 + (W - 2000 theta_1) / theta_2, throughput W / T; the DES within 1%."""
    sc = load_scenario(data=ring(tmp_path, STEP))
    an = analyze(sc)
    th1 = analyze(stationary_at(sc, 1.0, 1.0)).metrics["throughput_tokens_per_s"] / 1e3
    th2 = analyze(stationary_at(sc, 3.0, 1.0)).metrics["throughput_tokens_per_s"] / 1e3
    total = 40 * 20
    makespan = 2000 + (total - 2000 * th1) / th2
    assert an.metrics["throughput_tokens_per_s"] == pytest.approx(1e3 * total / makespan)
    assert an.details["makespan_ms"] == pytest.approx(makespan)
    assert not an.approximation["validated"]
    des = simulate(sc).metrics
    assert an.metrics["throughput_tokens_per_s"] == pytest.approx(
        des["throughput_tokens_per_s"], rel=0.01
    )
    assert an.metrics["lap_ms_mean"] == pytest.approx(des["lap_ms_mean"], rel=0.01)


def test_drift_both_engines_agree():
    """The shipped 1.3x drift scenario, shortened to 150 requests (about half the ramp)."""
    sc = load_scenario("scenarios/ring-drift-1.3x.yaml", ["workload.requests=150"])
    des, an = simulate(sc).metrics, analyze(sc).metrics
    for key in ("tokens_per_s", "throughput_tokens_per_s", "lap_ms_mean", "ttft_ms_mean"):
        assert an[key] == pytest.approx(des[key], rel=0.015), key


def test_a_constant_trace_changes_nothing(tmp_path):
    flat = "t_ms,latency_factor,bandwidth_factor\n0,1,1\n"
    with_trace = simulate(load_scenario(data=ring(tmp_path, flat))).metrics
    without = simulate(load_scenario(data=ring(tmp_path))).metrics
    assert with_trace == without


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("t,lat,bw\n0,1,1\n", "line 1: the header must be t_ms,latency_factor,bandwidth_factor"),
        ("t_ms,latency_factor,bandwidth_factor\n", "has no samples"),
        ("t_ms,latency_factor,bandwidth_factor\n0,1\n", "line 2 needs 3 comma-separated"),
        ("t_ms,latency_factor,bandwidth_factor\n0,1,x\n", "line 2 is not 3 numbers"),
        ("t_ms,latency_factor,bandwidth_factor\n0,1,0\n", "line 2: factors must be > 0"),
        ("t_ms,latency_factor,bandwidth_factor\n5,1,1\n5,1,1\n", "line 3: t_ms must be >= 0"),
        ("t_ms,latency_factor,bandwidth_factor\n0,1,inf\n", "line 2: values must be finite"),
    ],
)
def test_bad_traces_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(ScenarioError) as err:
        load_scenario(data=ring(tmp_path, text))
    assert str(err.value).startswith(f"network.trace_file: {message}")
    assert "\n" not in str(err.value)


def test_missing_trace_file(tmp_path):
    data = ring(tmp_path)
    data["network"]["trace_file"] = "nowhere.csv"
    with pytest.raises(ScenarioError, match=r"^network.trace_file: file not found"):
        load_scenario(data=data)


def test_read_trace_columns(tmp_path):
    path = write(tmp_path, "# a comment\nt_ms,latency_factor,bandwidth_factor\n0,1,1\n\n7,2,0.5\n")
    assert read_trace(path) == ((0.0, 7.0), (1.0, 2.0), (1.0, 0.5))
