"""A batched pass's cost per sequence (``model.sequence_ms``, ``model.stage_sequence_ms``,
``drafter.sequence_ms``): hand-worked laps and first tokens in both engines, the formula
against a direct computation, one request unchanged, strict validation.

The ring: 3 stages, t(n) = 2 + 0.1 n ms, 4 requests batched (continuous batching, all
admitted together, every draft accepted: they finish together), K = 3 drafted
autoregressively (3 drafter passes of 1 ms). Each sequence beyond the first adds
``sequence_ms`` to every stage's pass and ``drafter.sequence_ms`` to each drafter pass, so
against the same ring without them a lap gains 3 stages x 3 x sequence_ms + 3 passes x 3 x
drafter.sequence_ms, and the first token (the 4 prompts' one prefill pass) 3 x 3 x
sequence_ms.
"""

from __future__ import annotations

import numpy as np
import pytest

from wansim.analytical import analyze
from wansim.config.drafter import Drafter
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.sim import simulate
from wansim.stages.compute import drafter_tree_ms, stage_ms_each


def ring(seq_ms=0.0, draft_seq_ms=0.0, placement="first_stage", requests=4, **model) -> dict:
    return {
        "seed": 1,
        "stages": 3,
        "model": {
            "hidden_size": 256,
            "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.1},
            "sequence_ms": seq_ms,
            **model,
        },
        "network": {"latency_ms": 5.0, "bandwidth_mbps": 1e5, "jitter": {"kind": "none"}},
        "drafter": {
            "kind": "draft_model",
            "placement": placement,
            "parallel": False,
            "draft_ms": 1.0,
            "sequence_ms": draft_seq_ms,
            "acceptance": {"per_position": [1.0], "extrapolate": True},
        },
        "speculation": {"policy": "chain", "k": 3},
        "schedule": {"batching": "continuous"},
        "workload": {
            "requests": requests,
            "concurrency": requests,
            "prompt_tokens": 16,
            "output_tokens": 41,
        },
    }


def both(data: dict) -> tuple[float, float, float, float]:
    """(DES median lap, analytical lap, DES TTFT, analytical TTFT) in ms."""
    sc = load_scenario(data=data)
    des, ana = simulate(sc), analyze(sc)
    laps = des.details["record"].laps_ms
    assert np.ptp(laps) < 1e-9  # lockstep: every lap alike
    return (
        float(np.median(laps)),
        float(ana.metrics["lap_ms_mean"]),
        float(des.metrics["ttft_ms_mean"]),
        float(ana.metrics["ttft_ms_mean"]),
    )


@pytest.mark.parametrize("placement", ["first_stage", "last_stage"])
def test_a_batched_pass_pays_each_sequence_beyond_the_first_hand_worked(placement):
    base = both(ring(placement=placement))
    costly = both(ring(0.5, 0.25, placement))
    lap_extra = 3 * 3 * 0.5 + 3 * 3 * 0.25  # 3 stages and 3 drafter passes, 3 sequences more
    ttft_extra = 3 * 3 * 0.5  # one prefill pass of 4 prompts at every stage
    for engine in (0, 1):
        assert costly[engine] - base[engine] == pytest.approx(lap_extra, abs=1e-9)
        assert costly[2 + engine] - base[2 + engine] == pytest.approx(ttft_extra, abs=1e-9)
    assert costly[0] == pytest.approx(costly[1], rel=1e-12)  # the engines agree


def test_stages_may_differ_and_the_host_factor_scales_them():
    base = both(ring())
    costly = both(ring(stage_sequence_ms=[0.0, 1.0, 2.0], host_cpu_factor=1.5))
    # per stage 3 sequences more x its cost x the host factor
    extra = 3 * (0.0 + 1.0 + 2.0) * 1.5
    assert costly[0] - base[0] == pytest.approx(extra, abs=1e-9)
    assert costly[1] - base[1] == pytest.approx(extra, abs=1e-9)


def test_one_request_never_pays_it():
    plain = simulate(load_scenario(data=ring(requests=1))).metrics
    costly = simulate(load_scenario(data=ring(5.0, 5.0, requests=1))).metrics
    assert costly == plain
    a = analyze(load_scenario(data=ring(requests=1))).metrics["tokens_per_s"]
    b = analyze(load_scenario(data=ring(5.0, 5.0, requests=1))).metrics["tokens_per_s"]
    assert a == b


def test_the_formulas_against_a_direct_computation():
    sc = load_scenario(data=ring(stage_sequence_ms=[0.5, 1.0, 2.0], host_cpu_factor=2.0))
    for b in (1, 2, 5):
        got = [float(x) for x in stage_ms_each(sc, 4 * b, sequences=b)]
        want = [2.0 + 0.1 * 4 * b + 2.0 * c * (b - 1) for c in (0.5, 1.0, 2.0)]
        assert got == pytest.approx(want, abs=1e-12)
    # a tree of 6 nodes and depth 3 for b sequences, autoregressive: 3 passes of
    # (draft_ms + sequence_ms (b - 1)) plus the 3 extra candidates' width per sequence
    d = Drafter(parallel=False, draft_ms=1.0, width_ms=0.1, sequence_ms=0.25)
    for b in (1, 3):
        want = 3 * (1.0 + 0.25 * (b - 1)) + 0.1 * 3 * b
        assert float(drafter_tree_ms(d, 3, 6, b)) == pytest.approx(want, abs=1e-12)
    assert float(drafter_tree_ms(d, 3, 6, 0)) == pytest.approx(3.0)  # no sequence: no extra


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (("model", "sequence_ms"), -0.5, "model.sequence_ms: must be >= 0, got -0.5"),
        (("drafter", "sequence_ms"), "x", "drafter.sequence_ms: must be a number, got 'x'"),
        (
            ("model", "stage_sequence_ms"),
            [1.0],
            "model.stage_sequence_ms: needs 3 entries (one per stage; or use model.sequence_ms)",
        ),
    ],
)
def test_bad_values_are_one_line_errors(where, value, message):
    data = ring()
    data[where[0]][where[1]] = value
    with pytest.raises(ScenarioError) as err:
        load_scenario(data=data)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_micro_batches_pay_it_per_pass_of_their_members():
    """2 micro-batches of 2 decoding requests, no speculation: every pass holds 2 sequences,
    so each lap gains 3 stages x 1 x sequence_ms in both engines (the analytical engine's mean
    pass holds b q + b c / Y = 2 sequences: module docstring of
    :mod:`wansim.analytical.micro_batched`)."""

    def laps(seq_ms: float) -> tuple[float, float]:
        data = ring(seq_ms)
        data.update(speculation={"policy": "none"})
        data["schedule"]["micro_batches"] = 2
        data["network"]["latency_ms"] = 20.0
        sc = load_scenario(data=data)
        des = float(np.median(simulate(sc).details["record"].laps_ms))
        return des, float(analyze(sc).metrics["lap_ms_mean"])

    base, costly = laps(0.0), laps(0.5)
    assert costly[0] - base[0] == pytest.approx(3 * 0.5, abs=1e-9)
    assert costly[1] - base[1] == pytest.approx(3 * 0.5, abs=1e-9)
