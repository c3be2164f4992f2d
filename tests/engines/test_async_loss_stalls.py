"""One request under the block schedule (async, window B > 1) on lossy links: the loss stalls
(``wansim.analytical.blocks.loss_stalls``).

- Regressions against the DES (seeded, deterministic): at 4% loss with near-certain
  acceptance the stalls overlapped too much (the analytical rate +44% above the DES on a
  10-stage ring, hunt seed 287 of the draws before the serving mechanisms: +36%).
- Properties, both engines: more bandwidth, less latency or less loss never lowers tokens/s
  (the analytical engine at all: its stall count had shrunk with the lossless lap, so halving
  latency on a 10-stage overlapped ring at 4% loss lowered it by 5.9%; the DES beyond its
  95% interval). The default suite replays fixed examples; ``-m slow`` draws fresh ones."""

from __future__ import annotations

import copy
import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.sim import simulate
from wansim.studies import agreement_hunt as hunt


def ring(stages=10, latency_ms=5.0, loss=0.04, window=17, alpha=0.999, overlap=False) -> dict:
    """One request on a uniform ring, chain of 3 drafts, 4 ms drafter at S0, 128 tokens."""
    return {
        "name": "async-loss",
        "seed": 1,
        "stages": stages,
        "model": {
            "hidden_size": 4096,
            "compute": {"kind": "linear", "base_ms": 3.0, "per_token_ms": 0.02},
        },
        "network": {
            "latency_ms": latency_ms,
            "bandwidth_mbps": 1000.0,
            "jitter": {"kind": "none"},
            "loss_rate": loss,
        },
        "drafter": {
            "kind": "draft_model",
            "placement": "first_stage",
            "draft_ms": 4.0,
            "overlap": overlap,
            "acceptance": {"alpha": alpha, "dispersion": 0.0, "extrapolate": True},
        },
        "speculation": {"policy": "chain", "k": 3},
        "schedule": {"kind": "async", "max_inflight_blocks": window, "batching": "none"},
        "workload": {
            "requests": 16,
            "concurrency": 1,
            "prompt_tokens": 128,
            "output_tokens": 128,
        },
    }


def _both(data: dict) -> tuple[float, float, float]:
    sc = load_scenario(data=data)
    des = simulate(sc).metrics
    low, high = des["tokens_per_s_ci95"]
    return analyze(sc).metrics["tokens_per_s"], des["tokens_per_s"], (high - low) / 2


@pytest.mark.parametrize(
    "data",
    [
        # before: 129.5 against the DES's 90.2 +- 5.9 (+44%); now +8%
        pytest.param(ring(), id="10-stages-4pct-B17"),
        # hunt seed 287 (10 hops, 4% loss, 17 blocks, every bet won): before +36%, half-width
        # 11%; now -14%
        pytest.param(hunt.base_scenario(287, serving=False), id="hunt-287"),
    ],
)
def test_overlapping_stalls_at_four_percent_loss(data):
    """Within the async band (10%) plus twice the DES's 95% half-width, the hunt's criterion."""
    ana, des, half = _both(data)
    assert abs(ana - des) <= 0.10 * des + 2 * half, (ana, des, half)


def test_stale_counts_do_not_flip_with_the_bandwidth():
    """A window of 2 on a ring without jitter: block g + 2 starts the instant the verdict on
    g arrives, a tie that rounding had decided (the forwarded stale blocks 4.42 <-> 5.31 per
    request as the bandwidth grew, tokens/s 14.90, 14.85, 14.98, 14.87): now monotone."""
    rates = []
    for bandwidth in (1000.0, 3000.0, 10000.0, 100000.0):
        data = ring(alpha=0.95, window=2, latency_ms=25.0)
        data["network"]["bandwidth_mbps"] = bandwidth
        rates.append(analyze(load_scenario(data=data)).metrics["tokens_per_s"])
    assert all(b >= a for a, b in itertools.pairwise(rates)), rates


# ------------------------------------------------------------------------------ properties
def one_async_lossy(seed: int) -> dict:
    """A hunt draw made one request of a drafted chain under the async schedule on lossy
    links (the window, overlap and loss drawn from a stream of their own)."""
    import numpy as np

    data = hunt.base_scenario(seed, serving=False)
    rng = np.random.default_rng([seed, 16])
    wl = data["workload"]
    wl["concurrency"], wl["requests"] = 1, min(wl["requests"], 16)
    data["speculation"] = {"policy": "chain", "k": data["speculation"]["k"]}
    if "profile" not in data["drafter"]["acceptance"]:
        data["drafter"]["acceptance"]["alpha"] = float(rng.choice([0.6, 0.95, 0.999]))
    data["drafter"].update(
        kind="draft_model", placement="first_stage", overlap=bool(rng.random() < 0.4)
    )
    window = int(rng.integers(2, 2 * data["stages"] + 2))
    data["schedule"] = {"kind": "async", "max_inflight_blocks": window, "batching": "none"}
    data["network"]["loss_rate"] = float(rng.choice([0.001, 0.01, 0.04]))
    data["network"]["latency_ms"] = float(rng.choice([0.5, 2.0, 5.0, 25.0, 60.0]))
    return data


BETTER = (("bandwidth_mbps", 4.0), ("latency_ms", 0.5), ("loss_rate", 0.5))


def better(data: dict, field: str, factor: float) -> dict:
    out = copy.deepcopy(data)
    out["network"][field] *= factor
    for hop in out["network"].get("hops", []):
        if field in hop:
            hop[field] *= factor
    return out


def _analytical_monotone(data: dict) -> None:
    base = analyze(load_scenario(data=data)).metrics["tokens_per_s"]
    for field, factor in BETTER:
        faster = analyze(load_scenario(data=better(data, field, factor))).metrics
        # the bisections' tolerance (0.1%, as the hunt's property outside loaded rings)
        assert faster["tokens_per_s"] >= base * (1 - 1e-3), (field, base, faster["tokens_per_s"])


@settings(max_examples=12)
@given(seed=st.integers(0, 10**6))
# halving latency from 2 to 1 ms lowered tokens/s by 5.9% (overlapped drafter, 17 blocks)
@example(seed=-1)
# 1.5x the bandwidth (of 100 Gbit/s) lowered tokens/s by 2.0%: a block's "waited for a verdict"
# flipped as the verdict moved across S0's end of pass by microseconds (found by the fresh run)
@example(seed=16031)
def test_one_async_lossy_request_analytical_is_monotone(seed):
    data = ring(latency_ms=2.0, overlap=True) if seed < 0 else one_async_lossy(seed)
    _analytical_monotone(data)


@pytest.mark.slow
@settings(max_examples=150, derandomize=False)
@given(seed=st.integers(0, 10**6))
def test_one_async_lossy_request_analytical_is_monotone_fresh(seed):
    _analytical_monotone(one_async_lossy(seed))


def _des_monotone(data: dict) -> None:
    base = simulate(load_scenario(data=data)).metrics
    low = base["tokens_per_s_ci95"][0]
    for field, factor in BETTER:
        faster = simulate(load_scenario(data=better(data, field, factor))).metrics
        # beyond noise: the better ring's interval lies wholly below the base ring's
        assert not faster["tokens_per_s_ci95"][1] < low, (field, base["tokens_per_s"])


@settings(max_examples=3)
@given(seed=st.integers(0, 10**6))
def test_one_async_lossy_request_des_is_monotone(seed):
    _des_monotone(one_async_lossy(seed))


@pytest.mark.slow
@settings(max_examples=40, derandomize=False)
@given(seed=st.integers(0, 10**6))
def test_one_async_lossy_request_des_is_monotone_fresh(seed):
    _des_monotone(one_async_lossy(seed))


def test_a_block_waits_for_its_verdict_with_the_verdicts_probability():
    """The analytical block schedule's P(block k waited for the verdict that opens its
    window) against a simulation of that verdict: block k - B ends at E, its verdict arrives
    after max(0, R), R normal (mean m, sd s); block k could go at ``ready``."""
    import numpy as np

    from wansim.analytical.blocks import _waits

    rng = np.random.default_rng(7)
    end_back, m, s = 10.0, 6.0, 2.5
    r = np.maximum(rng.normal(m, s, 400_000), 0.0)
    for ready in (12.0, 15.0, 16.0, 17.5, 21.0):
        simulated = float(np.mean(end_back + r > ready))
        se = np.sqrt(simulated * (1 - simulated) / r.size)
        model = float(_waits(np.array([end_back + m]), np.array([ready]), np.array([s]))[0])
        assert abs(model - simulated) <= 4 * se + 1e-12, (ready, model, simulated)
    # without jitter: the comparison itself; no verdict to wait for (the window's first
    # blocks): never
    assert _waits(
        np.array([16.0, 15.0]), np.array([15.0, 16.0]), np.array([0.0, 0.0])
    ).tolist() == [
        True,
        False,
    ]
    assert _waits(np.array([-np.inf]), np.array([3.0]), np.array([2.0])).tolist() == [0.0]
