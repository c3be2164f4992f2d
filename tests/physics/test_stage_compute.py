"""Per-stage compute models (``model.stage_compute``): parsing, errors, and both engines.

Stages of a real pipeline differ (the first holds the embedding, the last the LM head and the
verifier); ``model.stage_compute`` gives one compute model per stage. Both engines must sum the
stages' own times: the analytical lap is draft + sum_i t_i(n) + hops, the DES holds stage i for
t_i(n), and the two agree on a per-stage scenario as they do on uniform ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from wansim.analytical import analyze
from wansim.config.scenario import load_scenario, scenario_to_dict
from wansim.errors import ScenarioError
from wansim.sim import simulate
from wansim.stages.compute import mean_stage_ms, stage_ms_each

PER_STAGE = [
    {"kind": "table", "points": [[1, 1.0], [5, 3.0], [32, 4.0]]},
    {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.1},
    {"kind": "table", "points": [[5, 0.5]]},
]
BASE = {
    "stages": 3,
    "model": {
        "hidden_size": 128,
        "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.0},
        "stage_compute": PER_STAGE,
    },
    "network": {"latency_ms": 5, "bandwidth_mbps": 100},
    "payload": {"activation_bits": 32, "header_bytes": 128, "return_bytes": 64},
    "drafter": {
        "kind": "draft_model",
        "placement": "first_stage",
        "parallel": False,
        "draft_ms": 1.0,
        "acceptance": {"alpha": 0.7},
    },
    "speculation": {"policy": "chain", "k": 4, "verifier": "greedy"},
    "workload": {"requests": 300, "output_tokens": 64, "prompt_tokens": 32},
}


def test_stage_models_and_sums():
    sc = load_scenario(data=BASE)
    assert [m.kind for m in sc.stage_compute_models()] == ["table", "linear", "table"]
    each = [float(x) for x in stage_ms_each(sc, 5)]
    assert each == pytest.approx([3.0, 2.5, 0.5])
    assert float(mean_stage_ms(sc, 5)) == pytest.approx(2.0)
    # without the override every stage uses model.compute
    plain = load_scenario(data=BASE, overrides={"model.stage_compute": []})
    assert plain.stage_compute_models() == (plain.model.compute,) * 3
    assert float(mean_stage_ms(plain, 5)) == 2.0


def test_round_trip_and_set():
    sc = load_scenario(data=BASE)
    assert load_scenario(data=scenario_to_dict(sc)) == sc
    sc2 = load_scenario(data=BASE, overrides=["model.stage_compute[2].points=[[5, 0.9]]"])
    assert float(stage_ms_each(sc2, 5)[2]) == 0.9


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"model.stage_compute": PER_STAGE[:2]},
            "model.stage_compute: needs 3 entries (one compute model per stage), got '2 entries'",
        ),
        (
            {"model.stage_compute": [{"base_ms": 1.0}] * 3},
            "model.stage_compute[0].kind: must be one of linear | roofline | moe | table, got null",
        ),
        (
            {"model.stage_compute[1]": {"kind": "table", "points": [[2, 1.0], [1, 1.0]]}},
            "model.stage_compute[1].points: n must be strictly increasing, got [2, 1]",
        ),
        (
            {"model.stage_compute[0].base_ms": -1},
            "model.stage_compute[0].base_ms: unknown key (allowed: kind, points), got -1",
        ),
        ({"model.stage_compute": "fast"}, "model.stage_compute: must be a list, got 'fast'"),
        ({"stages": 4}, "model.stage_compute: needs 4 entries"),
    ],
)
def test_errors_name_the_field(overrides, message):
    with pytest.raises(ScenarioError) as err:
        load_scenario(data=BASE, overrides=overrides)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_cli_reports_one_line(tmp_path, run_cli):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "model": {**BASE["model"], "stage_compute": []}}))
    code, _, err = run_cli("validate", path, "--set", "model.stage_compute=[{kind: table}]")
    assert code == 2
    assert err.strip() == (
        "error: model.stage_compute: needs 3 entries (one compute model per stage), got '1 entries'"
    )


def test_analytical_lap_sums_each_stage():
    sc = load_scenario(data=BASE)
    res = analyze(sc)
    parts = res.details["lap_breakdown_ms"]
    assert parts["draft"] == pytest.approx(4.0)  # autoregressive: K passes of 1 ms
    assert parts["stage_compute"] == pytest.approx(3.0 + 2.5 + 0.5)
    hops = 2 * (5 + (128 + 5 * 512) * 8 / 1e5) + 5 + 64 * 8 / 1e5
    assert res.metrics["lap_ms_mean"] == pytest.approx(4.0 + 6.0 + hops)
    # per-stage utilisation follows each stage's own compute (+ drafting on S0)
    util = res.metrics["stage_utilization"]
    assert util[0] > util[1] > util[2]


def test_des_holds_each_stage_for_its_own_time():
    """No randomness in the lap: the DES lap equals the closed form exactly, per stage."""
    sc = load_scenario(data=BASE, overrides={"workload.requests": 20})
    des = simulate(sc, timeline=True)
    ana = analyze(sc)
    assert des.metrics["lap_ms_p50"] == pytest.approx(ana.metrics["lap_ms_mean"], rel=1e-9)
    assert des.metrics["lap_ms_p99"] == pytest.approx(ana.metrics["lap_ms_mean"], rel=1e-9)
    slices = des.details["timeline"].stage_slices
    verify = {}
    for stage, start, end, what, _ in slices:
        if what != "draft":
            verify.setdefault(stage, set()).add(round(end - start, 9))
    # compute slices (drafting is its own part of S0's time): verify passes of 5 tokens and
    # prefills of 32 tokens, each stage at its own model
    assert verify == {0: {3.0, 4.0}, 1: {2.5, 5.2}, 2: {0.5}}


def test_uniform_override_is_the_same_scenario():
    """stage_compute with every entry equal to model.compute changes nothing (same seed)."""
    plain = load_scenario(data=BASE, overrides={"model.stage_compute": []})
    same = load_scenario(
        data=BASE, overrides={"model.stage_compute": [scenario_to_dict(plain.model.compute)] * 3}
    )
    assert simulate(plain).metrics == simulate(same).metrics
    assert analyze(plain).metrics == analyze(same).metrics


def test_engines_agree_on_a_jittered_per_stage_scenario():
    """DES vs closed form with per-stage tables, empirical jitter per hop and difficulty: the
    analytical tokens/s inside the DES's 99.9% t-interval, tau inside its interval, lap p50
    and p99 inside distribution-free order-statistic intervals (widened by the analytical
    lap grid's discretisation, as in tests/agreement/test_sim_agreement.py)."""
    rng = np.random.default_rng(3)
    hops = [
        {"jitter": {"kind": "empirical", "samples_ms": [float(x) for x in rng.gamma(2, 1, 40)]}}
        for _ in range(3)
    ]
    sc = load_scenario(
        data=BASE,
        overrides={
            "network.hops": hops,
            "drafter.acceptance": {"per_position": [0.8, 0.85, 0.9, 0.85], "dispersion": 0.2},
            "workload.requests": 600,
            "seed": 11,
        },
    )
    des = simulate(sc)
    ana = analyze(sc)
    record = des.details["record"]
    rates = 1e3 * record.decode_tokens / record.decode_ms
    level = 0.999
    half = stats.t.ppf(0.5 + level / 2, len(rates) - 1) * rates.std(ddof=1) / np.sqrt(len(rates))
    assert abs(ana.metrics["tokens_per_s"] - rates.mean()) < half
    m = sc.workload.output_tokens - 1
    passes = record.passes.astype(float)
    half_n = 3.3 * passes.std(ddof=1) / np.sqrt(len(passes))
    assert m / (passes.mean() + half_n) < ana.metrics["tau"] < m / (passes.mean() - half_n)
    laps = np.sort(record.laps_ms)
    n = len(laps)
    width = (len(hops) + 1) * ana.details["lap_grid_ms"] / 2
    for q, key in ((0.5, "lap_ms_p50"), (0.99, "lap_ms_p99")):
        lo_i = max(int(stats.binom.ppf(0.0005, n, q)) - 1, 0)
        hi_i = min(int(stats.binom.ppf(0.9995, n, q)), n - 1)
        assert laps[lo_i] - width <= ana.metrics[key] <= laps[hi_i] + width, key
