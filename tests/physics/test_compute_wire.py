"""Compute-time and byte models against hand-worked cases and Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wansim.config.drafter import Drafter
from wansim.config.model import LinearCompute, MoeCompute, RooflineCompute, TableCompute
from wansim.config.payload import Payload
from wansim.links.wire_bytes import (
    activation_bytes_per_token,
    forward_bytes,
    return_bytes,
    serialise_ms,
)
from wansim.stages.compute import drafter_ms, stage_ms


def test_linear():
    assert stage_ms(LinearCompute(base_ms=6, per_token_ms=0.02), 8) == pytest.approx(6.16)


def test_roofline_hand_worked():
    m = RooflineCompute(
        params_b=4.0,
        bytes_per_param=1.0,
        kv_bytes_per_token=0,
        mem_bandwidth_gbs=4000,
        peak_tflops=1000,
        overhead_ms=0.5,
    )
    # memory: 4e9 B / 4e12 B/s = 1 ms; compute for n=1: 8e9 / 1e15 = 0.008 ms -> 1.5 ms
    assert stage_ms(m, 1) == pytest.approx(1.5)
    # compute-bound past n = 500: 2*4e9*1000 / 1e15 = 8 ms
    assert stage_ms(m, 1000) == pytest.approx(8.5)


def test_moe_distinct_experts_match_monte_carlo():
    m = MoeCompute(
        dense_params_b=0.0,
        experts=64,
        experts_per_token=4,
        expert_params_b=0.01,
        bytes_per_param=1.0,
        mem_bandwidth_gbs=1000,
        peak_tflops=1e9,
        overhead_ms=0.0,
    )
    rng = np.random.default_rng(0)
    for n in (1, 4, 16):
        touched = np.mean(
            [
                len({e for _ in range(n) for e in rng.choice(64, 4, replace=False)})
                for _ in range(4000)
            ]
        )
        expected_ms = touched * 0.01e9 / 1e12 * 1e3
        assert stage_ms(m, n) == pytest.approx(expected_ms, rel=0.02)


def test_table_interpolates_and_extends():
    t = TableCompute(points=((1.0, 5.0), (9.0, 9.0)))
    assert stage_ms(t, 5) == pytest.approx(7.0)
    assert stage_ms(t, 17) == pytest.approx(13.0)  # last slope 0.5 ms/token extended
    assert stage_ms(t, 0.5) == pytest.approx(5.0)


@given(st.integers(1, 64))
def test_drafter_block_vs_autoregressive(k):
    assert drafter_ms(Drafter(parallel=True, draft_ms=4.0), k) == 4.0
    assert drafter_ms(Drafter(parallel=False, draft_ms=4.0), k) == 4.0 * k
    assert drafter_ms(Drafter(draft_ms=4.0), 0) == 0


def test_activation_bytes_hand_worked():
    assert activation_bytes_per_token(7168, 16) == 14336
    # 4-bit: 3584 bytes of values + 56 groups x 2-byte scale
    assert activation_bytes_per_token(7168, 4) == 3584 + 112
    assert activation_bytes_per_token(7168, 3) == 2688 + 112
    p = Payload(activation_bits=8, header_bytes=64, return_bytes=50)
    assert forward_bytes(p, 7168, 8) == 64 + 8 * (7168 + 112)
    assert return_bytes(p) == 50


def test_serialisation():
    # 125,000 bytes = 1 Mbit at 1000 Mbit/s = 1 ms
    assert serialise_ms(125_000, 1000) == pytest.approx(1.0)


@given(st.sampled_from([3, 4, 8, 16]), st.sampled_from([3, 4, 8, 16]))
def test_fewer_bits_fewer_bytes(a, b):
    if a < b:
        assert activation_bytes_per_token(4096, a) < activation_bytes_per_token(4096, b)
