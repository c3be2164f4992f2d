"""Agreement of the DES and the closed form over micro-batched rings (hypothesis).

- exact: on random deterministic rings (no jitter, no loss, no speculation, one wave of users,
  heterogeneous stage overheads, per-sequence costs of a batched pass and hops), the DES's steady lap (the median over every lap)
  equals the max-plus cycle max(L, N s_max) of :mod:`wansim.analytical.micro_batched` for the
  decode pass, to floating point, in both the latency-bound and the bottleneck-bound regime;
- within the band: on random speculative rings with chunked prefill, where the analytical
  result says it is validated, tokens/s and throughput lie within the regime's documented band
  of the DES (the band is measured, so this checks that the validated domain is not wider
  than the measurements behind it). One run's throughput has a heavy lower tail: its makespan
  is set by the last request, and a hard prompt admitted last decodes nearly alone (seed 128 of
  6 stages, 6 micro-batches, 76 users, math: one run 1091 tokens/s, 12 other seeds 1262 +- 32,
  the analytical 1340). Where the first run lies outside the band, ``RETRY_SEEDS`` more seeds
  decide, by the mean of all the runs: a model biased beyond the band still fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from wansim.analytical import analyze
from wansim.analytical.micro_batched import cycle_ms, ring
from wansim.analytical.path import hop_service_ms
from wansim.analytical.regime import REGIMES
from wansim.analytical.sync import lap_parts
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.sim import simulate


def ms(low: float, high: float):
    """Floats rounded to the microsecond (no subnormal values: the loader refuses them)."""
    return st.floats(low, high).map(lambda x: round(x, 3))


@st.composite
def deterministic_rings(draw) -> dict:
    stages = draw(st.integers(1, 8))
    batches = draw(st.integers(1, 8))
    per_batch = draw(st.integers(1, 4))
    users = batches * per_batch
    model = {
        "hidden_size": draw(st.sampled_from([256, 1024, 4096])),
        "compute": {
            "kind": "linear",
            "base_ms": draw(ms(0.5, 20)),
            "per_token_ms": draw(ms(0, 0.2)),
        },
        "overhead_ms": 0.0,
    }
    if draw(st.booleans()):  # heterogeneous stages
        model["stage_overhead_ms"] = draw(st.lists(ms(0, 10), min_size=stages, max_size=stages))
    if draw(st.booleans()):  # a batched pass's cost per sequence beyond the first
        model["sequence_ms"] = draw(ms(0, 3))
        if draw(st.booleans()):
            model["stage_sequence_ms"] = draw(st.lists(ms(0, 3), min_size=stages, max_size=stages))
    network = {
        "latency_ms": draw(ms(0, 60)),
        "bandwidth_mbps": round(10 ** draw(st.floats(1, 5)), 3),
        "jitter": {"kind": "none"},
        "per_message_ms": draw(st.sampled_from([0.0, 0.0, 0.7])),
    }
    if draw(st.integers(0, 3)) == 0:  # per-hop links
        network["hops"] = [
            {
                "latency_ms": draw(ms(0, 60)),
                "bandwidth_mbps": round(10 ** draw(st.floats(1, 5)), 3),
            }
            for _ in range(stages)
        ]
    return {
        "seed": draw(st.integers(0, 2**31)),
        "stages": stages,
        "model": model,
        "network": network,
        "payload": {"activation_bits": draw(st.sampled_from([4, 8, 16]))},
        "speculation": {"policy": "none"},
        "schedule": {"batching": "continuous", "micro_batches": batches},
        "workload": {
            "requests": users,
            "concurrency": users,
            "prompt_tokens": draw(st.integers(1, 64)),
            "output_tokens": draw(st.integers(40, 80)),
        },
    }


def station_services_ms(sc, decode) -> list[float]:
    """Every station's service for the decode pass: the stages, each hop's sender."""
    p = sc.stages
    out = [float(s) for s in decode.stage_ms[:p]]
    hop = (lambda i: i) if sc.network.hops else (lambda i: 0)
    out += [float(hop_service_ms(sc, hop(i), decode.forward_bytes)) for i in range(p - 1)]
    return [*out, float(hop_service_ms(sc, hop(p - 1), decode.return_bytes))]


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(deterministic_rings())
def test_des_steady_lap_is_the_max_plus_cycle(data):
    """Near a tie the run never reaches the periodic regime: the first passes leave a backlog
    at a station a fraction slower or faster than the cycle needs, and it drains by that
    fraction a pass (a stage 0.6% faster than the bottleneck kept the laps at its pace for the
    whole 40-pass run: 42.0 against the cycle's 42.252 ms). Ties within 2% are left out."""
    sc = load_scenario(data=data)
    b = sc.workload.concurrency // sc.schedule.micro_batches
    decode = ring(
        sc,
        np.asarray(float(b)),
        np.asarray(float(b)),
        np.asarray(float(b)),
        lap_parts(sc),
        np.asarray(float(b)),
    )
    n = sc.schedule.micro_batches
    lone, slowest = float(decode.lone_lap_ms), float(decode.bottleneck_ms)
    assume(abs(lone - n * slowest) > 0.02 * max(lone, n * slowest))
    if n > 1 and n * slowest > lone:  # bottleneck-bound: the runner-up station paces nothing
        services = sorted(station_services_ms(sc, decode))
        assume(services[-2] < 0.98 * services[-1])
    expected = float(cycle_ms(decode.lone_lap_ms, decode.bottleneck_ms, sc.schedule.micro_batches))
    laps = simulate(sc).details["record"].laps_ms
    assert float(np.median(laps)) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@st.composite
def speculative_rings(draw) -> dict:
    """Mostly inside the measured box (the grid's ranges, other combinations and values
    between the grid's), sometimes beyond it (then the result must say it is unvalidated and
    the example is skipped)."""
    users = draw(st.integers(12, 128))
    return {
        "seed": draw(st.integers(0, 2**31)),
        "stages": draw(st.integers(4, 10)),
        "network": {"latency_ms": draw(ms(1, 30))},
        "speculation": {"policy": "chain", "k": draw(st.integers(3, 7))},
        "drafter": {"acceptance": {"workload": draw(st.sampled_from(["math", "code", "chat"]))}},
        "schedule": {
            "batching": "continuous",
            "micro_batches": draw(st.integers(2, 10)),
            "prefill_chunk_tokens": draw(st.integers(128, 256)),
        },
        "workload": {
            "requests": 3 * users,
            "concurrency": users,
            "prompt_tokens": draw(st.integers(256, 512)),
            "output_tokens": draw(st.integers(128, 192)),
        },
    }


RETRY_SEEDS = 3

# the last wave (wansim/analytical/micro_batched.py): 71 users in 2 micro-batches, 213 requests
LAST_WAVE = {
    "seed": 3,
    "stages": 10,
    "network": {"latency_ms": 3.0},
    "speculation": {"policy": "chain", "k": 3},
    "drafter": {"acceptance": {"workload": "math"}},
    "schedule": {"batching": "continuous", "micro_batches": 2, "prefill_chunk_tokens": 229},
    "workload": {"requests": 213, "concurrency": 71, "prompt_tokens": 274, "output_tokens": 143},
}


def check_band(data: dict) -> None:
    from tests.conftest import REFERENCE

    flat = _flat(data)
    try:
        sc = load_scenario(REFERENCE, flat)
    except ScenarioError:
        assume(False)
    ana = analyze(sc)
    assume(ana.approximation["validated"])
    band = REGIMES["micro-batched"].error_band
    keys = ("tokens_per_s", "throughput_tokens_per_s")
    runs = [simulate(sc).metrics]

    def errors() -> dict:
        return {k: ana.metrics[k] / np.mean([r[k] for r in runs]) - 1 for k in keys}

    if any(abs(e) > band[k] for k, e in errors().items()):
        runs += [
            simulate(load_scenario(REFERENCE, {**flat, "seed": sc.seed + i})).metrics
            for i in range(1, RETRY_SEEDS + 1)
        ]
    for key, err in errors().items():
        assert abs(err) <= band[key], (key, err, ana.metrics[key], [r[key] for r in runs])


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and k not in ("acceptance",):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, dict):
            out.update({f"{prefix}{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[f"{prefix}{k}"] = v
    return out


@example(LAST_WAVE)  # half the measured requests drain the ring (steady rate alone -20%)
@settings(
    max_examples=6,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(speculative_rings())
def test_des_agrees_within_the_band_where_validated(data):
    check_band(data)


@pytest.mark.slow
@example(  # one run's makespan 5 sds long (module docstring): decided by the mean of four
    {
        "seed": 128,
        "stages": 6,
        "network": {"latency_ms": 1.0},
        "speculation": {"policy": "chain", "k": 3},
        "drafter": {"acceptance": {"workload": "math"}},
        "schedule": {"batching": "continuous", "micro_batches": 6, "prefill_chunk_tokens": 128},
        "workload": {
            "requests": 228,
            "concurrency": 76,
            "prompt_tokens": 256,
            "output_tokens": 128,
        },
    }
)
@settings(
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(speculative_rings())
def test_des_agrees_within_the_band_where_validated_many(data):
    check_band(data)
