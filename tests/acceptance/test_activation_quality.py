"""The quality cost of compressed activations: the measured table, both engines reading it
(acceptance factor, exactness), and optimize/plan refusing widths whose cost is unseen."""

from __future__ import annotations

import json

import numpy as np
import pytest

import wansim
from wansim.acceptance.activation_quality import (
    EXACT_MIN_BITS,
    load_table,
    quality_at,
    table_from_mapping,
)
from wansim.cli import main
from wansim.config.scenario import load_scenario
from wansim.errors import ProfileError, WansimInputError

TABLE = "traces/reference/wire-quality-tiny.yaml"


def _scenario(bits, table=TABLE, **more):
    acc = {"alpha": 0.8}
    if table is not None:
        acc["activation_quality"] = table
    data = {
        "stages": 3,
        "seed": 3,
        "drafter": {"acceptance": acc},
        "speculation": {"policy": "chain", "k": 4, **more.pop("speculation", {})},
        "payload": {"activation_bits": bits},
        "workload": {"requests": 400, "output_tokens": 200},
        **more,
    }
    return load_scenario(data=data)


# ----------------------------------------------------------------------------- the table
def test_shipped_table_is_the_measurement_with_its_provenance():
    t = load_table(TABLE)
    assert t.source == "measured" and "wansim.real wire-quality" in t.provenance
    assert [e.bits for e in t.entries] == [16, 8, 4, 3]
    by = {e.bits: e for e in t.entries}
    assert by[16].target_exact and by[16].acceptance_factor == 1.0
    assert by[16].kl_mean < 1e-7 and by[16].token_agreement == 1.0
    for b in (8, 4, 3):  # below the threshold: lossy, measured to change greedy tokens
        assert not by[b].target_exact and by[b].token_agreement < 1.0
    # the measured KL grows and the agreement falls as the width shrinks
    assert by[16].kl_mean < by[8].kl_mean < by[4].kl_mean < by[3].kl_mean
    assert by[8].token_agreement > by[4].token_agreement > by[3].token_agreement
    assert 0 < by[3].acceptance_factor < 0.95  # 3 bits costs acceptance (T = 1)


def test_threshold_and_unseen_widths():
    t = load_table(TABLE)
    assert quality_at(t, 32).target_exact and quality_at(t, 32).visible
    assert quality_at(None, 16).target_exact and quality_at(None, 16).visible
    unseen = quality_at(None, 8)
    assert not unseen.visible and not unseen.target_exact and unseen.acceptance_factor == 1.0
    assert EXACT_MIN_BITS == 16


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({8: {"target_exact": True}}, "bits.8.target_exact: widths below 16 bits are lossy"),
        ({4: {"acceptance_factor": 1.2}}, "bits.4.acceptance_factor: must be a number in (0, 1]"),
        ({4: {"speedup": 2}}, "bits.4.speedup: unknown field"),
        ({"x": {}}, "a bit width must be an integer"),
    ],
)
def test_bad_tables_are_one_line_errors(body, needle):
    with pytest.raises(ProfileError) as err:
        table_from_mapping({"bits": body}, "t.yaml")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_profile_carries_the_table_and_a_scenario_file_overrides_it(tmp_path):
    (tmp_path / "q.yaml").write_text("bits: {4: {acceptance_factor: 0.5}}\n")
    (tmp_path / "p.yaml").write_text(
        "format: wansim-profile/1\nk: 4\nactivation_quality: q.yaml\n"
        "workloads: {w: {per_position: [0.8, 0.8, 0.8, 0.8]}}\n"
    )
    inline = tmp_path / "inline.yaml"
    inline.write_text(
        "format: wansim-profile/1\nk: 4\nactivation_quality: {bits: {4: {acceptance_factor:"
        " 0.25}}}\nworkloads: {w: {per_position: [0.8, 0.8, 0.8, 0.8]}}\n"
    )
    from wansim.speculation import bit_quality

    def sc(profile, table=None):
        acc = {"profile": str(profile)}
        if table:
            acc["activation_quality"] = table
        return load_scenario(
            data={
                "drafter": {"acceptance": acc},
                "speculation": {"k": 4},
                "payload": {"activation_bits": 4},
            }
        )

    assert bit_quality(sc(tmp_path / "p.yaml")).acceptance_factor == 0.5
    assert bit_quality(sc(inline)).acceptance_factor == 0.25
    assert bit_quality(sc(tmp_path / "p.yaml", TABLE)).acceptance_factor == pytest.approx(
        load_table(TABLE).at(4).acceptance_factor
    )


def test_missing_table_file_is_one_line(capsys, tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("drafter: {acceptance: {alpha: 0.8, activation_quality: nope.yaml}}\n")
    assert main(["validate", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "drafter.acceptance.activation_quality: file not found" in err


# ----------------------------------------------------------------------------- the engines
def test_both_engines_multiply_every_rate_by_the_measured_factor():
    """Chain of K = 4 at constant alpha: tau = (1 - p^5) / (1 - p) with p = alpha f_3 (the
    independent closed form); the DES over 400 seeded requests within 3% (its standard error
    is ~0.5% here), the analytical engine within 1% (finite outputs)."""
    f = load_table(TABLE).at(3).acceptance_factor
    p = 0.8 * f
    closed = (1 - p**5) / (1 - p)
    sc = _scenario(3)
    ana, des = wansim.analyze(sc).metrics, wansim.simulate(sc).metrics
    assert ana["tau"] == pytest.approx(closed, rel=0.01)
    assert des["tau"] == pytest.approx(closed, rel=0.03)
    full = wansim.analyze(_scenario(16)).metrics["tau"]
    assert full == pytest.approx((1 - 0.8**5) / 0.2, rel=0.01) and full > ana["tau"] * 1.05
    assert ana["target_exact"] is False and des["target_exact"] is False


def test_exactness_follows_the_width_in_both_engines():
    for bits, exact in ((16, True), (8, False)):
        sc = _scenario(bits)
        assert wansim.analyze(sc).metrics["target_exact"] is exact
        assert wansim.simulate(sc).metrics["target_exact"] is exact
    # no speculation: the codec still perturbs the target
    sc = _scenario(4, speculation={"policy": "none"})
    assert wansim.analyze(sc).metrics["target_exact"] is False


def test_greedy_rule_uses_the_greedy_factor():
    t = load_table(TABLE).at(3)
    sc = _scenario(3, speculation={"verifier": "greedy"})
    p = 0.8 * t.acceptance_factor_greedy
    assert wansim.analyze(sc).metrics["tau"] == pytest.approx((1 - p**5) / (1 - p), rel=0.01)


def test_the_grid_takes_the_factor_per_width():
    from wansim.analytical import evaluate_grid

    frame = evaluate_grid(_scenario(16), {"payload.activation_bits": [3, 8, 16]})
    by = dict(zip(frame["payload.activation_bits"], frame["tau"], strict=True))
    for b in (3, 8, 16):
        assert by[b] == pytest.approx(wansim.analyze(_scenario(b)).metrics["tau"], rel=1e-9)
    assert list(frame["target_exact"]) == [False, False, True]


def test_unseen_cost_is_no_penalty_but_unvalidated_and_not_exact():
    sc = _scenario(4, table=None)
    res = wansim.analyze(sc)
    assert res.metrics["tau"] == pytest.approx(wansim.analyze(_scenario(16, None)).metrics["tau"])
    assert res.metrics["target_exact"] is False
    appr = (
        res.approximation.to_json() if hasattr(res.approximation, "to_json") else res.approximation
    )
    assert appr["validated"] is False and "4-bit activations" in appr["why"]


# ----------------------------------------------------------------------------- optimize, plan
def _write(tmp_path, table):
    acc = f"{{alpha: 0.8{', activation_quality: ' + table if table else ''}}}"
    p = tmp_path / "s.yaml"
    p.write_text(
        f"stages: 3\ndrafter: {{acceptance: {acc}}}\nspeculation: {{k: 4}}\n"
        "network: {bandwidth_mbps: 20}\nworkload: {requests: 8}\n"
    )
    return str(p)


def test_optimize_refuses_a_width_whose_cost_it_cannot_see(tmp_path, capsys):
    path = _write(tmp_path, None)
    code = main(["optimize", path, "--over", "payload.activation_bits=3,16", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["config"]["payload.activation_bits"] for r in out["top"]} == {16}
    assert out["skipped"] == 1 and "quality cost is not measured" in out["skipped_example"]
    # only unseen widths: nothing feasible, exit 2 with one line
    code = main(["optimize", path, "--over", "payload.activation_bits=3,4"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "quality cost" in err


def test_optimize_sees_the_measured_cost(tmp_path, capsys):
    path = _write(tmp_path, TABLE)
    assert main(["optimize", path, "--over", "payload.activation_bits=3,16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["config"]["payload.activation_bits"]: r for r in out["top"]}
    assert set(rows) == {3, 16} and rows[3]["tau"] < rows[16]["tau"]
    best_bits = out["best"]["config"]["payload.activation_bits"]
    assert any("not target-exact" in f for f in out["flags"]) == (best_bits == 3)


def test_optimize_the_table_rows_carry_the_cost(tmp_path):
    from wansim.studies.optimize import optimize

    res = optimize(_write(tmp_path, TABLE), [("payload.activation_bits", [3, 16])])
    t = res["table"].set_index("payload.activation_bits")
    assert not bool(t.loc[3, "target_exact"]) and bool(t.loc[16, "target_exact"])
    assert np.isfinite(t["tokens_per_s"]).all()


SMALL = """
model: {preset: llama-3.1-70b, weight_dtype: fp8}
nodes:
  - {name: a, hardware: h100-sxm, region: frankfurt, uplink_mbps: 200}
  - {name: b, hardware: h100-sxm, region: paris, uplink_mbps: 200}
  - {name: c, hardware: h100-sxm, region: london, uplink_mbps: 200}
drafter: {preset: eagle3, acceptance: {alpha: 0.8}}
workload: {concurrency: 1, prompt_tokens: 256, output_tokens: 64}
plan: {k: [3], activation_bits: [16, 8], top: 2}
"""


def _plan(tmp_path, capsys, text):
    p = tmp_path / "d.yaml"
    p.write_text(text)
    code = main(["plan", str(p), "--json", "--no-des"])
    captured = capsys.readouterr()
    return code, captured


def test_plan_never_ranks_an_unseen_width_and_says_so(tmp_path, capsys):
    code, cap = _plan(tmp_path, capsys, SMALL)
    assert code == 0, cap.err
    out = json.loads(cap.out)
    assert {p["activation_bits"] for p in out["plans"]} == {16}
    assert any("8-bit activations not ranked" in f for f in out["flags"])
    code, cap = _plan(tmp_path, capsys, SMALL.replace("[16, 8]", "[8]"))
    err = cap.err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "plan.activation_bits" in err


def test_plan_ranks_a_measured_lossy_width_only_when_allowed_and_flags_it(tmp_path, capsys):
    text = SMALL.replace("{alpha: 0.8}", f"{{alpha: 0.8, activation_quality: {TABLE}}}")
    text = text.replace("[16, 8]", "[16, 3]")
    code, cap = _plan(tmp_path, capsys, text.replace("top: 2", "top: 2, lossy_ok: true"))
    assert code == 0, cap.err
    plans = json.loads(cap.out)["plans"]
    by = {p["activation_bits"]: p for p in plans}
    assert by[3]["target_exact"] is False and by[16]["target_exact"] is True
    f3 = load_table(TABLE).at(3).acceptance_factor
    assert by[3]["activation_acceptance_factor"] == pytest.approx(f3)
    code, cap = _plan(tmp_path, capsys, text)
    out = json.loads(cap.out)
    assert {p["activation_bits"] for p in out["plans"]} == {16}


def test_wire_quality_input_errors_are_input_errors():
    with pytest.raises(WansimInputError):
        table_from_mapping([], "t.yaml")


def test_the_lone_ring_path_takes_the_factor_as_the_events_do():
    """One request in the sync ring runs on the DES's vectorised lone-ring path: with the
    table at 3 bits it must equal the per-event run to the bit (and differ from 16 bits)."""
    sc = load_scenario(
        data={
            "stages": 3,
            "drafter": {"acceptance": {"alpha": 0.8, "activation_quality": TABLE}},
            "speculation": {"k": 4},
            "payload": {"activation_bits": 3},
            "workload": {"requests": 1, "output_tokens": 400},
        }
    )
    fast, slow = wansim.simulate(sc), wansim.simulate(sc, per_event=True)
    assert fast.details["events"] == 0 < slow.details["events"]
    assert fast.metrics == slow.metrics and fast.metrics["target_exact"] is False
    full = wansim.simulate(
        load_scenario(data=sc_dict(sc), overrides={"payload.activation_bits": 16})
    )
    assert full.metrics["tau"] != fast.metrics["tau"]


def sc_dict(sc):
    from wansim.config.scenario import scenario_to_dict

    return scenario_to_dict(sc)
