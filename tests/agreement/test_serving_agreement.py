"""Agreement of the DES and the analytical engine on the serving mechanisms (hypothesis):
micro-batches with chunked prefill, KV capacity below the users' need (alone and with
micro-batches), and trace workloads (the shipped trace's rows in order, or drawn: empirical).

Every drawn scenario runs in both engines, each seeded (the default profile is derandomised, so
the examples are the same every run). The tolerance is the documented band plus twice the DES's
own 95% half-width h (its moving-block interval on tokens/s):

    |analytical - DES| <= band x DES + 2 h

on tokens/s, and on throughput with the same h relative to tokens/s (the DES gives no interval
on throughput; both come from the same requests). Trace workloads (lengths that differ) hold
throughput to the mean of 4 seeded runs with h their t-interval's half-width (a run's makespan,
so its throughput, moves with which requests come last), and the tail likewise (a p99 of a few
dozen requests is about their maximum, which the DES's own interval cannot bound from above). The band is the one the analytical result
carries where it says ``validated: true``; trace workloads outside the validated domain are
held to the worst the approximation-error table measured for them over all its points
(``UNVALIDATED_TRACE_BAND``); other unvalidated draws are skipped
(``assume``). Where the band names a tail (TPOT p99 with varied lengths), it is checked too. Several mechanisms per example keep the DES cost near a few seconds each.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.conftest import REFERENCE
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.sim import simulate
from wansim.studies.approximation_error import TRACE

# trace workloads outside the validated domain (continuous batches that would split in
# groups): the worst the "varied lengths" group measured over all its points, validated or not
# (docs/approximations.csv: 16.3% on tokens/s, 45.2% on throughput), rounded up
UNVALIDATED_TRACE_BAND = {"tokens_per_s": 0.20, "throughput_tokens_per_s": 0.50}
PROMPT = 512  # the reference scenario's prompt_tokens
T975_3DF = 3.182  # Student's t, 97.5th percentile, 3 degrees of freedom (4 runs)
OUTPUT = 128


MECHANISMS = ("micro", "kv", "micro+kv", "trace", "empirical")


@st.composite
def serving_scenarios(draw, mech: str) -> tuple[str, dict]:
    stages = draw(st.integers(4, 10))
    over: dict = {
        "seed": draw(st.integers(0, 2**31 - 1)),
        "stages": stages,
        "speculation.k": draw(st.integers(3, 7)),
        "workload.output_tokens": OUTPUT,
        "schedule.batching": "continuous",
    }
    if mech in ("trace", "empirical"):
        users = draw(st.sampled_from([1, 4, 8, 16, 32]))
        over.update(
            {
                "workload.lengths.kind": mech,
                "workload.trace": TRACE,
                "workload.concurrency": users,
                "workload.requests": min(max(4 * users, 32), 96),
                "schedule.batching": draw(st.sampled_from(["none", "continuous"])),
            }
        )
        return mech, over
    users = draw(st.integers(8, 64))
    over.update({"workload.concurrency": users, "workload.requests": 4 * users})
    if "micro" in mech:
        over["schedule.micro_batches"] = draw(st.integers(2, stages))
        over["schedule.prefill_chunk_tokens"] = draw(st.integers(128, 256))
    if "kv" in mech:
        slots = draw(st.integers(max(users // 4, 1), users - 1))
        over["workload.kv_capacity_tokens"] = slots * (PROMPT + OUTPUT)
    return mech, over


def check(mech: str, over: dict) -> None:
    sc = load_scenario(REFERENCE, over)
    assert sc.workload.prompt_tokens == PROMPT
    ana = analyze(sc)
    trust = ana.approximation
    if mech in ("trace", "empirical") and not trust["validated"]:
        band = UNVALIDATED_TRACE_BAND
    else:
        assume(trust["validated"])
        band = trust["error_band"]
        if "kv" in mech:
            assert "KV admission queue" in trust["regime"]
    des = simulate(sc).metrics
    low, high = des["tokens_per_s_ci95"]
    d = des["tokens_per_s"]
    half_rel = (high - low) / 2 / d
    a, b = ana.metrics["tokens_per_s"], d
    allowed = (band["tokens_per_s"] + 2 * half_rel) * b
    assert abs(a - b) <= allowed, (mech, "tokens_per_s", a, b, band, half_rel, over)
    seeded = [des]
    if mech in ("trace", "empirical") or "tpot_ms_p99" in band:
        # a run's throughput is its requests over its makespan, and with lengths that differ the
        # makespan is set by the last few requests (a 1189-token request drawn last ran alone
        # for half of one 32-request run: 56 tokens/s where 15 seeds average 106); a p99 of a
        # few dozen requests is about their maximum (32 requests: sd 29% over seeds, where the
        # DES's own interval is unbounded above). Their noise is the run-to-run spread,
        # measured over 4 seeded runs, not the laps' interval
        seeded += [
            simulate(load_scenario(REFERENCE, {**over, "seed": over["seed"] + i})).metrics
            for i in (1, 2, 3)
        ]
    checked = ["throughput_tokens_per_s"] + (["tpot_ms_p99"] if "tpot_ms_p99" in band else [])
    for key in checked:
        if len(seeded) > 1 and (mech in ("trace", "empirical") or key == "tpot_ms_p99"):
            runs = [m[key] for m in seeded]
            b, half = float(np.mean(runs)), T975_3DF * float(np.std(runs, ddof=1)) / 2.0
            assert abs(ana.metrics[key] - b) <= band[key] * b + 2 * half, (mech, key, runs, over)
        else:
            a, b = ana.metrics[key], des[key]
            allowed = (band[key] + 2 * half_rel) * b
            assert abs(a - b) <= allowed, (mech, key, a, b, band[key], half_rel, over)


@pytest.mark.parametrize("mech", MECHANISMS)
@settings(
    max_examples=3,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_engines_agree_on_serving_within_band_and_des_noise(mech, data):
    check(*data.draw(serving_scenarios(mech)))


@pytest.mark.slow
@pytest.mark.parametrize("mech", MECHANISMS)
@settings(
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_engines_agree_on_serving_within_band_and_des_noise_many(mech, data):
    check(*data.draw(serving_scenarios(mech)))
