"""Faults (``faults:``): a stage or link that fails at a time or a rate, fail-over to a spare
with re-prefill or failed requests, in both engines (wansim/sim/faults.py,
wansim/analytical/faults.py).

Hand-worked cases use a ring without speculation or jitter, where every lap and prefill is
deterministic, so the DES's makespan with a failure is known to the microsecond. The
analytical engine's expected value is checked against Monte Carlo over DES seeds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from wansim.analytical import analyze
from wansim.analytical.faults import up_time_ms
from wansim.analytical.regime import FAULTS_BAND
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.results.strict_json import dumps
from wansim.sim import simulate
from wansim.sim.perfetto import trace_events

# 2 stages, 10 ms per hop, 5 ms per pass, no speculation: a lap is 5 + 5 + 10 + 10 ms (one
# token) plus its bytes at 100 Gbit/s, the prefill 5 + 5 + 10 ms plus the prompt's bytes.
DETERMINISTIC = {
    "stages": 2,
    "model": {"hidden_size": 256, "compute": {"kind": "linear", "base_ms": 5.0, "per_token_ms": 0}},
    "network": {"latency_ms": 10.0, "bandwidth_mbps": 1e5},
    "speculation": {"policy": "none"},
    "workload": {"requests": 1, "prompt_tokens": 16, "output_tokens": 11},
}


def hop_ms(tokens: int) -> float:
    """Forward hop time of a pass of ``tokens`` (latency + header and fp16 activations)."""
    return 10.0 + (64 + tokens * 256 * 2) * 8 / 1e8


LAP_MS = 10.0 + hop_ms(1) + 10.0 + 50 * 8 / 1e8  # the return hop carries 50 bytes


def prefill_ms(tokens: int) -> float:
    return 5.0 + 5.0 + hop_ms(tokens)


def scenario(faults: dict, **workload):
    data = {**DETERMINISTIC, "faults": faults}
    data["workload"] = {**DETERMINISTIC["workload"], **workload}
    return load_scenario(data=data)


def test_the_deterministic_ring_is_as_worked():
    res = simulate(scenario({}))
    assert res.metrics["lap_ms_mean"] == pytest.approx(LAP_MS, abs=1e-6)
    assert res.details["makespan_ms"] == pytest.approx(prefill_ms(16) + 10 * LAP_MS, abs=1e-6)
    assert "goodput_tokens_per_s" not in res.metrics  # the fault metrics come with faults


def test_failover_hand_worked():
    """A failure 100 ms in: the prefill took p0 = prefill_ms(16); (100 - p0) // 30 laps were
    done (c tokens committed) and 100 - p0 - 30 c ms of the current lap are lost; after the
    250 ms downtime the request re-prefills 16 + c tokens and decodes its other 10 - c."""
    res = simulate(scenario({"detection_s": 0.25, "events": [{"stage": 1, "at_s": 0.1}]}))
    p0 = prefill_ms(16)
    c = math.floor((100 - p0) / LAP_MS)
    makespan = 100 + 250 + prefill_ms(16 + c) + (10 - c) * LAP_MS
    m = res.metrics
    assert res.details["makespan_ms"] == pytest.approx(makespan, abs=1e-6)
    assert m["availability"] == pytest.approx(1 - 250 / makespan, rel=1e-12)
    assert m["goodput_tokens_per_s"] == pytest.approx(1e3 * 11 / makespan, rel=1e-12)
    assert m["throughput_tokens_per_s"] == m["goodput_tokens_per_s"]
    assert m["failed_requests"] == 0
    log = res.details["faults"]
    assert (log.reprefills, log.reprefill_tokens) == (1, 16 + c)
    # the lap across the failure carries it; the laps still sum to the decode time
    record = res.details["record"]
    assert record.laps_ms.sum() == pytest.approx(record.decode_ms[0], abs=1e-6)
    across = 350 + prefill_ms(16 + c) + LAP_MS - (p0 + c * LAP_MS)
    assert record.laps_ms[c] == pytest.approx(across, abs=1e-6)
    assert np.delete(record.laps_ms, c) == pytest.approx(LAP_MS, abs=1e-6)


def test_link_failure_during_prefill_keeps_the_first_token_time_of_the_reprefill():
    """A link failure 5 ms in (during the prefill): the prefill is lost and starts again after
    the downtime; the first token comes at 5 + 100 + p0."""
    res = simulate(scenario({"detection_s": 0.1, "events": [{"link": 0, "at_s": 0.005}]}))
    p0 = prefill_ms(16)
    assert res.metrics["ttft_ms_mean"] == pytest.approx(105 + p0, abs=1e-6)
    assert res.details["makespan_ms"] == pytest.approx(105 + p0 + 10 * LAP_MS, abs=1e-6)


def test_fail_hand_worked():
    """Two requests, recovery fail, a failure 100 ms in with a 250 ms downtime: the first
    request fails at 100 ms having produced its first token and c decode tokens; the second
    arrives then, waits for the ring, and runs alone."""
    res = simulate(
        scenario(
            {"recovery": "fail", "detection_s": 0.25, "events": [{"link": 1, "at_s": 0.1}]},
            requests=2,
        )
    )
    p0 = prefill_ms(16)
    c = math.floor((100 - p0) / LAP_MS)
    makespan = 350 + p0 + 10 * LAP_MS
    m = res.metrics
    assert res.details["makespan_ms"] == pytest.approx(makespan, abs=1e-6)
    assert m["failed_requests"] == 1
    assert m["goodput_tokens_per_s"] == pytest.approx(1e3 * 11 / makespan, rel=1e-12)
    assert m["throughput_tokens_per_s"] == pytest.approx(1e3 * (11 + 1 + c) / makespan, rel=1e-12)
    assert m["availability"] == pytest.approx(1 - 250 / makespan, rel=1e-12)
    assert m["ttft_ms_mean"] == pytest.approx(250 + p0, abs=1e-6)  # the finished one waited


def test_every_request_failed_gives_null_with_a_reason():
    res = simulate(scenario({"recovery": "fail", "events": [{"stage": 0, "at_s": 0.1}]}))
    out = json.loads(dumps(res.to_json()))
    assert out["metrics"]["failed_requests"] == 1
    assert out["metrics"]["goodput_tokens_per_s"] == 0
    assert out["metrics"]["tokens_per_s"] is None
    assert "no request finished" in out["undefined"]["tokens_per_s"]


def test_a_failure_after_the_run_changes_nothing():
    plain = simulate(scenario({}, requests=3))
    late = simulate(scenario({"events": [{"stage": 0, "at_s": 1000}]}, requests=3))
    assert late.details["makespan_ms"] == plain.details["makespan_ms"]
    assert late.metrics["availability"] == 1.0
    assert late.metrics["goodput_tokens_per_s"] == plain.metrics["throughput_tokens_per_s"]


def test_failover_is_lossless():
    """A lost pass consumes no acceptance draw: every request commits the same tokens in the
    same passes as without failures (same seed), only later."""
    base = {
        "stages": 4,
        "seed": 3,
        "network": {"latency_ms": 5, "jitter": {"kind": "normal", "std_ms": 1}},
        "drafter": {"acceptance": {"alpha": 0.7}},
        "workload": {"requests": 12, "output_tokens": 40, "prompt_tokens": 32},
    }
    plain = simulate(load_scenario(data=base)).details["record"]
    faulty = load_scenario(
        data={
            **base,
            "faults": {"detection_s": 0.05, "events": [{"link": 2, "rate_per_hour": 36000}]},
        }
    )
    res = simulate(faulty)
    assert len(res.details["faults"].outages) >= 3
    record = res.details["record"]
    assert np.array_equal(record.passes, plain.passes)
    assert np.array_equal(record.lap_tokens, plain.lap_tokens)


def test_outages_on_the_perfetto_track():
    res = simulate(
        scenario({"detection_s": 0.25, "events": [{"stage": 1, "at_s": 0.1}]}), timeline=True
    )
    events = trace_events(res.details["timeline"], res.details["faults"])
    outages = [e for e in events if e.get("cat") == "outage"]
    assert len(outages) == 1
    assert outages[0]["name"] == "stage 1 down"
    assert (outages[0]["ts"], outages[0]["dur"]) == (pytest.approx(1e5), pytest.approx(2.5e5))
    assert outages[0]["args"]["requests_hit"] == 1


@pytest.mark.parametrize(
    ("faults", "path", "words"),
    [
        ({"events": [{"stage": 2, "at_s": 1}]}, "faults.events[0].stage", "must be < stages (2"),
        ({"events": [{"link": 5, "at_s": 1}]}, "faults.events[0].link", "must be < stages"),
        (
            {"events": [{"stage": 0, "link": 0, "at_s": 1}]},
            "faults.events[0]",
            "exactly one of stage, link",
        ),
        ({"events": [{"stage": 0}]}, "faults.events[0]", "exactly one of at_s, rate_per_hour"),
        (
            {"events": [{"stage": 0, "at_s": 1, "rate_per_hour": 1}]},
            "faults.events[0]",
            "exactly one of at_s",
        ),
        ({"events": [{"stage": 0, "rate_per_hour": 0}]}, "faults.events[0].rate_per_hour", "> 0"),
        (
            {"events": [{"stage": 0, "at_s": 1, "downtime_s": -1}]},
            "faults.events[0].downtime_s",
            ">= 0",
        ),
        ({"recovery": "retry"}, "faults.recovery", "failover | fail"),
        ({"detection_s": -2}, "faults.detection_s", ">= 0"),
        ({"events": [{"stage": 0, "at_s": 1, "when": 3}]}, "faults.events[0].when", "unknown key"),
    ],
)
def test_bad_fault_fields_name_the_field(faults, path, words):
    with pytest.raises(ScenarioError) as info:
        scenario(faults)
    line = str(info.value)
    assert line.startswith(path + ":") and words in line and "\n" not in line


def test_combinations_once_refused_run_in_both_engines(tmp_path):
    """Faults with micro-batches (refused by both engines once; tests/physics/
    test_faults_micro_batched.py), with requests that differ, on drift, on the block schedule
    (and the per-round hybrid with requests that differ: tests/physics/test_faults_hybrid.py)."""
    path = tmp_path / "micro.yaml"
    path.write_text(
        "stages: 3\nschedule: {kind: sync, batching: continuous, micro_batches: 2}\n"
        "workload: {requests: 4, concurrency: 4}\nfaults: {events: [{stage: 1, at_s: 1}]}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "wansim", "run", str(path), "--engine", "both", "--json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for engine in ("des", "analytical"):
        assert out[engine]["availability"] < 1
    varied = {
        **DETERMINISTIC,
        "faults": {"events": [{"stage": 1, "at_s": 1}]},
        "workload": {"requests": 4, "lengths": {"kind": "lognormal", "output_cv": 0.5}},
    }
    assert analyze(load_scenario(data=varied)).metrics["availability"] < 1  # modelled since
    drifting = {
        **varied,
        "network": {**varied.get("network", {}), "drift": {"latency_factor": 1.2}},
    }
    assert analyze(load_scenario(data=drifting)).metrics["availability"] < 1  # and on drift
    async_ring = {
        **varied,
        "drafter": {"kind": "draft_model", "placement": "first_stage", "draft_ms": 1.0},
        "speculation": {"policy": "chain", "k": 2},
        "schedule": {"kind": "async"},
    }
    for result in (
        analyze(load_scenario(data=async_ring)),
        simulate(load_scenario(data=async_ring)),
    ):
        assert result.metrics["availability"] < 1  # the block schedule too (test_faults_blocks.py)


def test_analytical_null_with_a_reason_when_failures_outpace_recovery():
    res = analyze(scenario({"detection_s": 1, "events": [{"stage": 0, "rate_per_hour": 360000}]}))
    out = json.loads(dumps(res.to_json()))
    assert out["metrics"]["goodput_tokens_per_s"] is None
    assert "faster than the ring recovers" in out["undefined"]["goodput_tokens_per_s"]
    assert out["approximation"]["validated"] is False


# ----------------------------------------------------------------------------- Monte Carlo
MC_BASE = {
    "stages": 4,
    "network": {"latency_ms": 10, "jitter": {"kind": "normal", "std_ms": 2}},
    "drafter": {"acceptance": {"alpha": 0.8}},
    "workload": {"requests": 30, "output_tokens": 48, "prompt_tokens": 256},
}
SEEDS = 24
METRICS = ("goodput_tokens_per_s", "throughput_tokens_per_s", "availability", "failed_requests")


@pytest.mark.parametrize("recovery", ["failover", "fail"])
@pytest.mark.parametrize(
    "events",
    [[{"stage": 2, "at_s": 3.0}], [{"link": 3, "rate_per_hour": 900}]],
    ids=["fixed", "rate"],
)
def test_expected_value_model_against_monte_carlo(recovery, events):
    """The analytical expected value against the mean of 24 seeded DES runs: within 5
    standard errors of that mean plus 2% (the model's approximations: the failure's phase
    taken uniform over the fault-free request cycle, measured at <= 3% on these cases; the
    run-to-run spread comes from the failure's phase and, for rates, the number of failures,
    so 5 SE keeps a correct model's chance of failing below 1e-6)."""
    data = {**MC_BASE, "faults": {"recovery": recovery, "detection_s": 0.5, "events": events}}
    ana = analyze(load_scenario(data=data))
    runs = [simulate(load_scenario(data={**data, "seed": s})).metrics for s in range(SEEDS)]
    for name in METRICS:
        x = np.array([r[name] for r in runs], dtype=float)
        se = x.std(ddof=1) / np.sqrt(SEEDS)
        value = ana.metrics[name]
        assert abs(value - x.mean()) <= 5 * se + 0.02 * abs(x.mean()) + 1e-9, (
            name,
            value,
            x.mean(),
            se,
        )


def test_reference_failover_scenario():
    """scenarios/ring-stage-failover.yaml: both engines agree on goodput and availability
    within the regime's band, and the failure costs goodput against the same ring without it."""
    sc = load_scenario("scenarios/ring-stage-failover.yaml")
    des, ana = simulate(sc), analyze(sc)
    trust = ana.approximation
    assert trust["regime"] == "sync+faults" and trust["validated"]  # the error study's grid
    assert trust["error_band"] == FAULTS_BAND
    link = load_scenario(
        "scenarios/ring-stage-failover.yaml", ["faults.events=[{link: 2, at_s: 8}]"]
    )
    trust = analyze(link).approximation  # link failures: Monte Carlo only, not on the grid
    assert not trust["validated"] and "link failures" in trust["why"]
    for name in ("goodput_tokens_per_s", "throughput_tokens_per_s"):
        assert ana.metrics[name] == pytest.approx(des.metrics[name], rel=0.03)
    down = 5e3 / des.details["makespan_ms"]
    assert des.metrics["availability"] == pytest.approx(1 - down, rel=1e-12)
    assert ana.metrics["availability"] == pytest.approx(des.metrics["availability"], abs=1e-3)
    assert des.details["faults"].reprefills == 1
    clean = load_scenario("scenarios/ring-stage-failover.yaml", ["faults.events[0].at_s=100000"])
    assert simulate(clean).metrics["goodput_tokens_per_s"] > des.metrics["goodput_tokens_per_s"]


def _restarted_up_time(rng, work, fixed_at, rate, x):
    """One run of the process :func:`wansim.analytical.faults.up_time_ms` models: ``work`` ms
    of ring time, failures at the work positions ``fixed_at`` and at ``rate`` per up ms; each
    failure needs ``x`` ms without a failure, restarted by any failure inside it."""
    up, done, fixed = 0.0, 0.0, sorted(fixed_at)
    while True:
        gap = rng.exponential(1.0 / rate)
        to_fixed = fixed[0] - done if fixed else np.inf
        step = min(gap, work - done, to_fixed)
        up += step
        done += step
        if done >= work:
            return up
        if fixed and step == to_fixed:
            fixed.pop(0)
        while True:  # the failure's x, restarted by the failures inside it
            inside = rng.exponential(1.0 / rate)
            if inside >= x:
                up += x
                break
            up += inside


@pytest.mark.parametrize("rate_x", [0.05, 0.5, 0.9])
def test_up_time_with_restarted_re_prefills_against_monte_carlo(rate_x):
    """20,000 runs of the restart process (independent of the formula): the mean up time
    within 4 standard errors of W e^(lambda x) + F (e^(lambda x) - 1) / lambda, and far from
    the linear (W + F x) / (1 - lambda x) where lambda x is not small."""
    rng = np.random.default_rng(11)
    work, x, fixed_at = 1000.0, 50.0, [200.0, 700.0]
    rate = rate_x / x
    runs = np.array([_restarted_up_time(rng, work, fixed_at, rate, x) for _ in range(20_000)])
    mean, se = runs.mean(), runs.std(ddof=1) / np.sqrt(len(runs))
    formula = up_time_ms(work, 2, rate, x)
    assert abs(mean - formula) < 4 * se, (mean, se, formula)
    linear = (work + 2 * x) / (1 - rate_x)
    if rate_x >= 0.5:
        assert abs(mean - linear) > 20 * se
    assert up_time_ms(work, 2, 0.0, x) == work + 2 * x
