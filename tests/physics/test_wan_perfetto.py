"""Perfetto tracks of the WAN physics: per-message software cost, tcp window stalls and
slowed compute passes, each checked against the run's own record."""

from __future__ import annotations

import numpy as np
import pytest

from wansim.config.scenario import load_scenario
from wansim.links.delivery import software_ms, wire_ms
from wansim.sim import simulate
from wansim.sim.perfetto import trace_events


def run(**extra):
    data = {
        "stages": 3,
        "model": {
            "hidden_size": 8192,
            "compute": {"kind": "linear", "base_ms": 4.0, "per_token_ms": 0.0},
            "noise": {"kind": "gamma", "cv": 0.3},
            "straggler": {"fraction": 0.2, "factor": 3.0, "stages": [1]},
        },
        "network": {
            "latency_ms": 30.0,
            "bandwidth_mbps": 200.0,
            "per_message_ms": 2.0,
            "codec_ms_per_mb": 5.0,
            "transport": "tcp",
        },
        "speculation": {"policy": "chain", "k": 7},
        "drafter": {"acceptance": {"alpha": 0.7}},
        "workload": {"requests": 3, "prompt_tokens": 600, "output_tokens": 30},
    }
    data.update(extra)
    res = simulate(load_scenario(data=data), timeline=True)
    return res, res.details["timeline"], trace_events(res.details["timeline"])


def test_software_slices_match_the_link_rule():
    _, tl, events = run()
    soft = [e for e in events if e.get("cat") == "software"]
    assert len(soft) == len(tl.transfers)  # every message pays 2 ms at least
    for e, (_, _, start, _, _, n_bytes, _, _) in zip(soft, tl.transfers, strict=True):
        assert e["ts"] == pytest.approx(start * 1e3)
        assert e["dur"] == pytest.approx(software_ms(n_bytes, 2.0, 5.0) * 1e3)


def test_window_stalls_fill_a_message_beyond_its_wire_time():
    """tcp: a message holds its sender for software + wire + the stalls inside it (prefill
    messages of ~10 MB on a 60 ms RTT wait for ACKs many times)."""
    _, tl, events = run()
    stalls = [e for e in events if e.get("cat") == "tcp"]
    assert stalls
    for hop, _, start, free, _, n_bytes, _, _ in tl.transfers:
        inside = sum(
            e["dur"] / 1e3
            for e in stalls
            if e["tid"] == hop and start * 1e3 <= e["ts"] < free * 1e3
        )
        expected = software_ms(n_bytes, 2.0, 5.0) + wire_ms(np.ceil(n_bytes), 200.0) + inside
        assert free - start == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_slowed_passes_carry_their_factor():
    _, tl, events = run()
    slowed = [e for e in events if e.get("cat") == "slowdown"]
    assert len(slowed) == len(tl.slowdowns) > 0
    compute = {(s, round(a, 9)): (b - a) for s, a, b, what, _ in tl.stage_slices if what != "draft"}
    for e in slowed:
        f = e["args"]["factor"]
        assert e["dur"] / 1e3 / f == pytest.approx(4.0, rel=1e-9)  # the deterministic pass
        assert compute[(e["tid"], round(e["ts"] / 1e3, 9))] == pytest.approx(e["dur"] / 1e3)
    # stage 1 alone has stragglers: its factors reach 3 x noise, the others' stay noise-sized
    by_stage = {s: [e["args"]["factor"] for e in slowed if e["tid"] == s] for s in range(3)}
    assert max(by_stage[1]) > 2.5 and max(by_stage[0] + by_stage[2]) < 2.5


def test_no_wan_slices_without_the_features():
    _, _, events = run(
        model={"hidden_size": 512}, network={"latency_ms": 5.0}, workload={"requests": 2}
    )
    assert not [e for e in events if e.get("cat") in ("software", "tcp", "slowdown")]
