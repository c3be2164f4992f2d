"""``model.idle_cost``: a pass after an idle costs more (:mod:`wansim.stages.idle_cost`), in the
DES (each pass's own idle) and the analytical engine (each stage's mean idle, a fixed point:
:mod:`wansim.analytical.idle_cost`)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.sim import simulate
from wansim.stages import idle_cost

REFERENCE = ROOT / "scenarios" / "v4pro-dspark-10stage-wan.yaml"
TABLE = "[[0,0],[10,1.0],[60,3.0]]"  # ms: steep, so that the idle matters


def scenario(*over, table=TABLE, requests=300):
    return load_scenario(
        REFERENCE,
        [
            "stages=4",
            "network.latency_ms=5",
            f"workload.requests={requests}",
            f"model.idle_cost.points={table}",
            *over,
        ],
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1e4), min_size=1, max_size=6, unique=True),
    st.lists(st.floats(0, 50), min_size=6, max_size=6),
    st.lists(st.floats(0, 2e4), min_size=1, max_size=20),
)
def test_the_des_scalar_table_is_numpys_interpolation(idle_points, extras, idles):
    """The DES's per-pass function and np.interp (the analytical engine's) agree."""
    xs = np.array(sorted(idle_points))
    ys = np.array(extras[: len(xs)])
    scalar = idle_cost.scalar_extra(xs, ys)
    for g in idles:
        assert scalar(g) == pytest.approx(float(idle_cost.extra_ms(g, xs, ys)), abs=1e-9)


LONE = [  # two identical 2 ms stages, plain decoding, 10 ms links, no jitter
    "stages=2",
    "speculation.policy=none",
    "model.compute.kind=linear",
    "model.compute.base_ms=2.0",
    "model.compute.per_token_ms=0.0",
    "model.overhead_ms=0.0",
    "network.latency_ms=10",
    "network.jitter.kind=none",
    "network.jitter.std_ms=0",
    "workload.requests=4",
]


def test_a_lone_ring_by_hand():
    """Two identical stages without drafting (plain decoding), a table of slope a = 0.01 ms
    per idle ms from 0: each stage idles the lap less its own pass, so with L0 the lap
    without the cost and c a stage's pass, e = a (L0 - c + e) (the other stage's extra
    lengthens the lap by as much as its own shortens the idle): e = a (L0 - c) / (1 - a), and
    the lap is L0 + 2 e. The DES's median lap is that to 1e-9 ms (every decode lap settles
    within two laps); the analytical engine's mean idle counts the prefill among the passes:
    within 0.5%."""
    over = LONE
    off = load_scenario(REFERENCE, over)
    on = load_scenario(REFERENCE, [*over, "model.idle_cost.points=[[0,0],[1000,10]]"])
    base = simulate(off).metrics["lap_ms_p50"]
    a, c = 0.01, 2.0
    e = a * (base - c) / (1 - a)
    lap = base + 2 * e
    assert simulate(on).metrics["lap_ms_p50"] == pytest.approx(lap, abs=1e-9)
    assert analyze(on).metrics["lap_ms_mean"] == pytest.approx(lap, rel=5e-3)
    assert lap > base + 0.3  # (the cost is there: 0.2 ms a stage at 20 ms of idle)


CASES = {
    "one request": [],
    "4 requests": ["workload.concurrency=4"],
    "a batch of 4": ["workload.concurrency=4", "schedule.batching=continuous"],
    "async, window 4": [
        "schedule.kind=async",
        "schedule.max_inflight_blocks=4",
        "drafter.placement=first_stage",
        "drafter.kind=draft_model",
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_fixed_point_agrees_with_the_des_as_without_the_cost(case):
    """With a steep table (1 ms at 10 ms idle, 3 ms from 60 ms; 4 stages, 5 ms links) the
    analytical tokens/s misses the DES's by no more than 2 points beyond its miss without
    the cost (measured, misses without / with: one request -1.2% / -1.2%, 4 requests -4.9% /
    -4.5%, a batch of 4 -2.5% / -3.5%, async -2.6% / -0.4%), and the cost is visible: the
    DES's tokens/s falls by more than 5%."""
    over = CASES[case]
    on, off = scenario(*over), scenario(*over, table="[]")
    des_on, des_off = simulate(on).metrics, simulate(off).metrics
    miss_on = analyze(on).metrics["tokens_per_s"] / des_on["tokens_per_s"] - 1
    miss_off = analyze(off).metrics["tokens_per_s"] / des_off["tokens_per_s"] - 1
    assert abs(miss_on) <= abs(miss_off) + 0.02, (case, miss_on, miss_off)
    assert des_on["tokens_per_s"] < 0.95 * des_off["tokens_per_s"]


def test_a_lone_ring_by_hand_when_the_idle_follows_the_host():
    """``model.idle_follows: host`` (every stage on one host): a pass's idle is the time since
    any stage last worked, in a lone ring the hop into the stage. Two 2 ms stages, a slope a
    = 0.01 ms per idle ms: each pass pays a x its incoming hop, the hops sum to L0 - 2c, so
    the lap is L0 + a (L0 - 2c): the DES's median to 1e-9 ms and the analytical engine's
    (which takes each stage's incoming hop's mean time) to 1e-9 too; the stage's own idle
    (the default) pays more."""
    off = load_scenario(REFERENCE, LONE)
    table = "model.idle_cost.points=[[0,0],[1000,10]]"
    host = load_scenario(REFERENCE, [*LONE, table, "model.idle_follows=host"])
    base, a, c = simulate(off).metrics["lap_ms_p50"], 0.01, 2.0
    lap = base + a * (base - 2 * c)
    assert simulate(host).metrics["lap_ms_p50"] == pytest.approx(lap, abs=1e-9)
    assert analyze(host).metrics["lap_ms_p50"] == pytest.approx(lap, abs=1e-9)
    own = simulate(load_scenario(REFERENCE, [*LONE, table])).metrics["lap_ms_p50"]
    assert own > lap + 0.1


@settings(max_examples=15, deadline=None)
@given(
    st.integers(2, 6),
    st.integers(0, 60),
    st.lists(st.integers(0, 30).map(lambda x: x / 10), min_size=3, max_size=3),
)
def test_a_lone_ring_pays_its_incoming_hops_idle(stages, latency_ms, rises):
    """One request, no jitter, any non-decreasing table: with the host's idle the DES's
    median lap is the lap without the cost plus each stage's extra at its incoming hop's
    time (the analytical engine's answer, to 1e-6 ms), and never above the stage's own."""
    table = [[0, 0], [10, rises[0]], [40, rises[0] + rises[1]], [90, sum(rises)]]
    over = [
        *LONE,
        f"stages={stages}",
        f"network.latency_ms={latency_ms}",
        f"model.idle_cost.points={table}",
    ]
    host = load_scenario(REFERENCE, [*over, "model.idle_follows=host"])
    des = simulate(host).metrics["lap_ms_p50"]
    assert des == pytest.approx(analyze(host).metrics["lap_ms_p50"], abs=1e-6)
    assert des <= simulate(load_scenario(REFERENCE, over)).metrics["lap_ms_p50"] + 1e-9


HOST_CASES = {
    **{case: [*over, "network.latency_ms=20"] for case, over in CASES.items()},
    "4 requests, a host of 2 cores": ["workload.concurrency=4", "model.host_cores=2"],
}


@pytest.mark.parametrize("case", list(HOST_CASES))
def test_the_hosts_idle_agrees_with_the_des_as_without_the_cost(case):
    """``model.idle_follows: host`` with the steep table: the analytical tokens/s (each
    stage's incoming hop as the host's idle, weighted by the chance no other stage is busy)
    misses the DES's by no more than 2.5 points beyond its miss without the cost (measured,
    misses without / with: at 20 ms links one request -1.1% / -1.1%, 4 requests -0.8% /
    -3.2%, a batch of 4 -2.9% / -3.3%, async -3.3% / -5.1%; at 5 ms on a host of 2 cores
    -6.7% / -8.7%: the several requests' overlap is a product of independent chances). In
    the DES the host's idle never exceeds a stage's own: tokens/s at least the default's, and
    below the run without the cost."""
    over = HOST_CASES[case]
    on = scenario(*over, "model.idle_follows=host")
    off = scenario(*over, table="[]")
    des_on, des_off = simulate(on).metrics, simulate(off).metrics
    miss_on = analyze(on).metrics["tokens_per_s"] / des_on["tokens_per_s"] - 1
    miss_off = analyze(off).metrics["tokens_per_s"] / des_off["tokens_per_s"] - 1
    assert abs(miss_on) <= abs(miss_off) + 0.025, (case, miss_on, miss_off)
    own = simulate(scenario(*over)).metrics["tokens_per_s"]
    assert own < des_on["tokens_per_s"] < des_off["tokens_per_s"]
    assert analyze(on).details["idle_cost"]["idle_follows"] == "host"


def test_the_answer_says_how_it_was_reached():
    res = analyze(scenario())
    d = res.details["idle_cost"]
    assert d["converged"] and len(d["extra_ms"]) == 4
    lap = res.metrics["lap_ms_mean"]  # one pass a lap at each stage: each idles most of it
    assert all(60 < g < lap for g in d["idle_ms"]) and d["extra_ms"] == [3.0] * 4
    assert not res.approximation["validated"] and "idle" in res.approximation["why"]


MS = st.integers(0, 2000).map(lambda x: x / 1000)  # 0-2 ms by 1 us


@settings(max_examples=10, deadline=None)
@given(
    MS,
    MS.filter(lambda x: x > 0),
    st.integers(1, 200),
    st.sampled_from([[], ["workload.concurrency=3"]]),
)
def test_more_extra_never_speeds_the_ring_up(extra_ms, more_ms, idle_ms, over):
    """A table raised everywhere never raises the analytical tokens/s (nor the DES's)."""
    low = f"[[0,0],[{idle_ms},{extra_ms}]]"
    high = f"[[0,{more_ms}],[{idle_ms},{extra_ms + more_ms}]]"
    a_low = analyze(scenario(*over, table=low, requests=8)).metrics["tokens_per_s"]
    a_high = analyze(scenario(*over, table=high, requests=8)).metrics["tokens_per_s"]
    assert a_high <= a_low * (1 + 1e-12)
    d_low = simulate(scenario(*over, table=low, requests=8)).metrics["tokens_per_s"]
    d_high = simulate(scenario(*over, table=high, requests=8)).metrics["tokens_per_s"]
    assert d_high <= d_low * (1 + 1e-12)


def test_a_grid_answers_it_point_by_point():
    """A sweep axis over an idle-cost scenario goes one point at a time (the fixed point), the
    same answers as analyze's."""
    from wansim.analytical.engine import point_means

    sc = scenario()
    assert point_means(sc)["tokens_per_s"] == pytest.approx(
        analyze(sc).metrics["tokens_per_s"], rel=1e-12
    )


def test_one_table_per_stage():
    """``model.stage_idle_cost``: a flat 2 ms at stage 0 only lengthens a lone lap by exactly
    2 ms (DES to 1e-9; analytical, whose stage 0 pays 2 ms at any idle, to 1e-9 too); the
    same table for every stage is ``model.idle_cost``; P entries or none."""
    over = ["network.jitter.kind=none", "network.jitter.std_ms=0"]
    off = scenario(*over, table="[]", requests=6)
    one = scenario(
        *over,
        "model.stage_idle_cost=[{points: [[0,2]]}, {points: []}, {points: []}, {points: []}]",
        table="[]",
        requests=6,
    )
    assert simulate(one).metrics["lap_ms_p50"] == pytest.approx(
        simulate(off).metrics["lap_ms_p50"] + 2.0, abs=1e-9
    )
    assert analyze(one).metrics["lap_ms_mean"] == pytest.approx(
        analyze(off).metrics["lap_ms_mean"] + 2.0, abs=1e-9
    )
    same = scenario(
        *over,
        "model.stage_idle_cost=" + str([{"points": [[0, 0], [10, 1.0], [60, 3.0]]}] * 4),
        table="[]",
        requests=6,
    )
    assert simulate(same).metrics == simulate(scenario(*over, requests=6)).metrics
    from wansim.errors import ScenarioError

    with pytest.raises(ScenarioError, match="needs 4 entries"):
        scenario("model.stage_idle_cost=[{points: [[0,2]]}]", table="[]")


def _validate_fails(override: str) -> str:
    """``wansim validate REFERENCE --set OVERRIDE``: exit 2; its stderr, stripped."""
    run = subprocess.run(
        [sys.executable, "-m", "wansim", "validate", str(REFERENCE), "--set", override],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    return run.stderr.strip()


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("[[10,0],[5,1]]", "strictly increasing"),
        ("[[0,-1]]", "extra ms >= 0"),
        ("[[nan,1]]", "must be a number"),
    ],
)
def test_bad_tables_exit_2_naming_the_field(table, says):
    line = _validate_fails(f"model.idle_cost.points={table}")
    assert "\n" not in line and "model.idle_cost.points" in line and says in line


def test_an_unknown_idle_follows_exits_2_naming_the_field():
    line = _validate_fails("model.idle_follows=core")
    assert "\n" not in line and "model.idle_follows" in line and "core" in line
    assert "stage" in line and "host" in line  # what is allowed


HOP_OFF = [*LONE, "network.bandwidth_mbps=1000000"]


def test_a_message_after_an_idle_by_hand():
    """``network.idle_cost``: two hops of nearly free messages (no per-message cost, 10^6
    Mbit/s), a table of slope a = 0.01 from 0: each hop's sender idles the lap less its
    message, e = a (L0 + 2 e - e), e = a L0 / (1 - a), the lap L0 + 2 e; a flat 1 ms adds
    exactly 2 ms. The DES's median lap to 1e-5 ms (the messages' serialisation, ~1e-4 ms,
    which the senders' idles lack, is left out of the hand sum: a x 1e-4 per hop), the analytical mean lap within 0.5% (its idles count the
    prefill among the passes), the flat case to 1e-9 in both."""
    off = load_scenario(REFERENCE, HOP_OFF)
    sloped = load_scenario(REFERENCE, [*HOP_OFF, "network.idle_cost.points=[[0,0],[1000,10]]"])
    flat = load_scenario(REFERENCE, [*HOP_OFF, "network.idle_cost.points=[[0,1]]"])
    base = simulate(off).metrics["lap_ms_p50"]
    a = 0.01
    lap = base + 2 * a * base / (1 - a)
    assert simulate(sloped).metrics["lap_ms_p50"] == pytest.approx(lap, abs=1e-5)
    assert analyze(sloped).metrics["lap_ms_mean"] == pytest.approx(lap, rel=5e-3)
    assert simulate(flat).metrics["lap_ms_p50"] == pytest.approx(base + 2.0, abs=1e-9)
    assert analyze(flat).metrics["lap_ms_mean"] == pytest.approx(
        analyze(off).metrics["lap_ms_mean"] + 2.0, abs=1e-9
    )
    d = analyze(sloped).details["idle_cost"]
    assert d["converged"] and len(d["hop_extra_ms"]) == 2 and d["extra_ms"] == [0.0, 0.0]


@pytest.mark.parametrize("case", list(CASES))
def test_the_hops_fixed_point_agrees_with_the_des_as_without_the_cost(case):
    """A steep table on every hop (as the stages' above): the analytical miss no more than 2
    points beyond its miss without the cost, and the cost visible in the DES (> 5%)."""
    over = [*CASES[case], "network.idle_cost.points=" + TABLE]
    on, off = scenario(*over, table="[]"), scenario(*CASES[case], table="[]")
    des_on, des_off = simulate(on).metrics, simulate(off).metrics
    miss_on = analyze(on).metrics["tokens_per_s"] / des_on["tokens_per_s"] - 1
    miss_off = analyze(off).metrics["tokens_per_s"] / des_off["tokens_per_s"] - 1
    assert abs(miss_on) <= abs(miss_off) + 0.02, (case, miss_on, miss_off)
    assert des_on["tokens_per_s"] < 0.95 * des_off["tokens_per_s"]
