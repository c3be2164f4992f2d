"""The last wave of a micro-batched run (wansim/analytical/micro_batched.py, ``last_wave``):
the requests in flight at the last admission decode through a ring nobody refills, faster
than the steady ones. Checked against a request-by-request sum and against the DES."""

from __future__ import annotations

import numpy as np
import pytest

from tests.agreement.test_micro_batching_agreement import LAST_WAVE, _flat
from tests.conftest import REFERENCE
from wansim.analytical import analyze
from wansim.analytical.micro_batched import cycle_ms, last_wave, pass_tokens, ring
from wansim.analytical.sync import lap_parts
from wansim.config.scenario import load_scenario
from wansim.serving.micro_batching import active_batches
from wansim.sim import simulate

SATURATED = LAST_WAVE  # the chunk budget saturated: every pass rides 229 prompt tokens
UNSATURATED = {  # 4 micro-batches of 4, 512-token prompts in 4 chunks each
    "stages": 10,
    "network": {"latency_ms": 1.0},
    "speculation": {"policy": "chain", "k": 7},
    "schedule": {"batching": "continuous", "micro_batches": 4, "prefill_chunk_tokens": 128},
    "workload": {"requests": 64, "concurrency": 16, "output_tokens": 128},
}


def request_by_request(scenario, lap_ms: float, hol_ms: float, requests: int = 3000):
    """``requests`` requests at phases (i + 1/2) / requests of their cycle, each counted in
    the pass it is in at every one of 3000 steps after the last admission (decoding,
    riding a chunk, or left), the pass's lap from those counts, a request's decode time the
    laps over its own decode passes (the steady lap before the last admission)."""
    parts = lap_parts(scenario)
    mean = pass_tokens(scenario, parts)
    slots, c, cycle = (float(mean[k]) for k in ("slots", "c", "cycle"))
    passes, v = float(parts["passes"]), float(parts["tokens"])
    prompt = float(scenario.workload.prompt_tokens)
    batches = float(active_batches(scenario))
    end = (1.0 - (np.arange(requests) + 0.5) / requests) * cycle  # passes left to do
    start = end - passes
    ds = cycle / 3000
    s = (np.arange(3000) + 0.5) * ds
    weight = slots / requests
    decoding = weight * ((start[None, :] <= s[:, None]) & (s[:, None] < end[None, :])).sum(1)
    chunk = (start[None, :] - c <= s[:, None]) & (s[:, None] < start[None, :])
    prefilling = weight * chunk.sum(1)
    left = weight * (s[:, None] < end[None, :]).sum(1)
    active = np.clip(left, 1.0, batches)
    dec, pre, stay = decoding / active, prefilling / active, left / active
    r = ring(
        scenario,
        dec * v + pre * prompt / c,
        dec,
        stay * (cycle - 1) / cycle,
        parts,
        np.maximum(dec + pre, 1.0),
    )
    laps = cycle_ms(r.lone_lap_ms + hol_ms, r.bottleneck_ms, active)
    inside = (np.maximum(start, 0.0)[None, :] <= s[:, None]) & (s[:, None] < end[None, :])
    decode_ms = lap_ms * np.maximum(-start, 0.0) + (laps[:, None] * inside).sum(0) * ds
    return float(np.mean(1.0 / decode_ms)), float(np.mean(decode_ms))


@pytest.mark.parametrize("data", [SATURATED, UNSATURATED], ids=["saturated", "unsaturated"])
def test_last_wave_is_the_request_by_request_sum(data):
    sc = load_scenario(REFERENCE, _flat(data))
    parts = lap_parts(sc)
    lap, hol = 500.0, 7.0
    wave = last_wave(sc, parts, pass_tokens(sc, parts), np.asarray(lap), np.asarray(hol))
    inverse, decode = request_by_request(sc, lap, hol)
    assert float(wave["inverse_ms"]) == pytest.approx(inverse, rel=0.01)
    assert float(wave["decode_ms"]) == pytest.approx(decode, rel=0.01)
    assert float(wave["decode_ms"]) < lap * float(parts["passes"])  # the drain is faster


def test_the_last_wave_in_tokens_per_s_against_the_des():
    """71 users in 2 micro-batches, 213 requests: the DES measures the 142 past the warm-up,
    71 of them in the last wave, whose passes lose the saturated budget's prompts and then
    their finished sequences: 7.5-14 tokens/s against 6.2 steady. The steady rate alone
    said 6.06 tokens/s (-20%, beyond the regime's band); with the last wave +0.5%."""
    sc = load_scenario(REFERENCE, _flat(SATURATED))
    des = simulate(sc).metrics["tokens_per_s"]
    ana = analyze(sc)
    steady = 1e3 * float(lap_parts(sc)["rate_factor"]) / ana.metrics["lap_ms_mean"]
    assert ana.metrics["tokens_per_s"] / des - 1 == pytest.approx(0.0, abs=0.04)
    assert steady / des - 1 < -0.15


def test_one_wave_has_no_last_wave():
    """Fewer than 2 U requests: nothing is measured at the steady lap (the DES measures them
    all), and tokens/s stays the steady rate."""
    one = {**UNSATURATED, "workload": {**UNSATURATED["workload"], "requests": 16}}
    sc = load_scenario(REFERENCE, _flat(one))
    ana = analyze(sc)
    rate = 1e3 * float(lap_parts(sc)["rate_factor"]) / ana.metrics["lap_ms_mean"]
    assert ana.metrics["tokens_per_s"] == pytest.approx(rate, rel=1e-12)
