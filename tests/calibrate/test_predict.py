"""``wansim calibrate profile`` / ``predict``: the bundle, the fits, the held-out matrix, the
scenario built from configuration + bundle, the report, and bad input (torch-free).

The real held-out subset (profile once, predict cells the profile did not see) is in
``tests/real/test_predict_real.py``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import ROOT
from wansim.calibrate.bundle import (
    FILES,
    MANIFEST,
    check_model,
    config_sha256,
    load_bundle,
    write_bundle,
)
from wansim.calibrate.matrix import REAL_PATH_MECHANISMS, Cell, load_matrix, shipped_matrix
from wansim.calibrate.predict import Factors, cell_scenario, check_cells, even_split
from wansim.calibrate.profiling import fit_drafter, fit_messages, fit_stage_cost
from wansim.calibrate.report import dumps, spread, strict, summarize
from wansim.errors import WansimInputError

TARGET = ROOT / "models" / "tiny-target"
DRAFTER = ROOT / "models" / "tiny-drafter"

# the synthetic hardware: service = fixed[role] + 0.7 layers + 0.1 n + 0.02 layers n + codec
TRUE = {"first": 2.5, "last": 2.0, "per_layer": 0.7, "per_token": 0.1, "lt": 0.02, "q8": 0.3}
VERIFY_LAST_MS, ENCODE_FIRST_MS = 0.4, 0.15


def synthetic_rows(noise_sd: float = 0.0, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for lf, ll, bits in ((1, 5, 32), (3, 3, 32), (5, 1, 32), (3, 3, 8)):
        for k in (2, 4, 7):
            n = k + 1
            for _ in range(20):
                for role, layers in (("first", lf), ("last", ll)):
                    ms = (
                        TRUE[role]
                        + TRUE["per_layer"] * layers
                        + TRUE["per_token"] * n
                        + TRUE["lt"] * layers * n
                        + (TRUE["q8"] if bits == 8 else 0.0)
                        + rng.normal(0, noise_sd)
                    )
                    rows.append(
                        {
                            "kind": "verify",
                            "role": role,
                            "layers": layers,
                            "n_tokens": n,
                            "k": k,
                            "bits": bits,
                            "service_ms": ms,
                            "compute_ms": 0.7 * layers,
                            "codec_ms": ENCODE_FIRST_MS if role == "first" else 0.1,
                            "verify_ms": VERIFY_LAST_MS if role == "last" else 0.0,
                        }
                    )
        for role, layers in (("first", lf), ("last", ll)):  # prefill: 3 + 1.5 per layer (+1 last)
            rows.append(
                {
                    "kind": "prefill",
                    "role": role,
                    "layers": layers,
                    "n_tokens": 64,
                    "k": 0,
                    "bits": bits,
                    "service_ms": 3.0 + 1.5 * layers + (1.0 if role == "last" else 0.0),
                    "compute_ms": 1.5 * layers,
                    "codec_ms": ENCODE_FIRST_MS,
                    "verify_ms": VERIFY_LAST_MS if role == "last" else 0.0,
                }
            )
    return pd.DataFrame(rows)


def test_stage_cost_fit_recovers_the_synthetic_hardware():
    fit = fit_stage_cost(synthetic_rows())
    assert fit["fixed_ms"]["first"] == pytest.approx(TRUE["first"], abs=1e-9)
    assert fit["fixed_ms"]["last"] == pytest.approx(TRUE["last"], abs=1e-9)
    assert fit["per_layer_ms"] == pytest.approx(TRUE["per_layer"], abs=1e-9)
    assert fit["per_token_ms"] == pytest.approx(TRUE["per_token"], abs=1e-9)
    assert fit["per_layer_token_ms"] == pytest.approx(TRUE["lt"], abs=1e-9)
    assert fit["codec_ms_per_op"][8] == pytest.approx(TRUE["q8"], abs=1e-9)
    # a middle stage: the last without verifying, plus stage 0's encode (hand-worked)
    assert fit["fixed_ms"]["middle"] == pytest.approx(2.0 - 0.4 + 0.15, abs=1e-9)
    assert fit["prefill"]["fixed_ms"]["first"] == pytest.approx(3.0)
    assert fit["prefill"]["fixed_ms"]["last"] == pytest.approx(4.0)
    assert fit["prefill"]["per_layer_ms"] == pytest.approx(1.5)


def test_stage_cost_fit_with_noise_is_unbiased():
    """Noise sd 0.5 ms over 1,440 verify rows: the per-layer slope within 0.05 ms (its standard
    error is ~0.009 ms here: > 5 sigma)."""
    fit = fit_stage_cost(synthetic_rows(noise_sd=0.5, seed=3))
    assert abs(fit["per_layer_ms"] - TRUE["per_layer"]) < 0.05
    assert abs(fit["fixed_ms"]["first"] - TRUE["first"]) < 0.3


def test_drafter_and_message_fits():
    k = np.repeat([2, 4, 7], 10)
    d = fit_drafter(pd.DataFrame({"k": k, "draft_ms": 0.5 + 1.2 * k}))
    assert d["intercept_ms"] == pytest.approx(0.5)
    assert d["per_draft_ms"] == pytest.approx(1.2)
    assert d["mean_ms_by_k"][7] == pytest.approx(0.5 + 8.4)
    e = pd.DataFrame(
        {
            "role": ["forward"] * 4 + ["return"] * 2,
            "bytes": [1000, 1000, 3000, 3000, 64, 64],
            "error_ms": [0.3, 0.5, 0.6, 0.8, 0.2, 0.4],
        }
    )
    m = fit_messages(e)
    assert m["per_message_ms"] == {"forward": pytest.approx(0.55), "return": pytest.approx(0.3)}


# ----------------------------------------------------------------------------- the bundle
def make_bundle(out: Path, target=TARGET, drafter=DRAFTER, max_k: int = 7) -> Path:
    """A synthetic bundle with the fits of :func:`synthetic_rows` (and a fitted profile)."""
    from wansim.acceptance.profile import profile_to_mapping
    from wansim.acceptance.trace import fit_profile

    rows = synthetic_rows()
    rng = np.random.default_rng(0)
    trace = []
    for k in (2, 4, max_k):
        for p in range(8):
            for s in range(10):
                a = 0
                while a < k and rng.random() < 0.7:
                    a += 1
                trace.append({"workload": "code", "prompt_id": p, "step": s, "k": k, "accepted": a})
    prof = fit_profile(pd.DataFrame(trace), temperature=0.0, verifier="greedy")
    errors = pd.DataFrame(
        {
            "role": ["forward"] * 3 + ["return"] * 3,
            "bytes": [600] * 3 + [64] * 3,
            "error_ms": [0.2, 0.4, 0.6, 0.1, 0.3, 0.5],
        }
    )
    draft = pd.DataFrame({"k": [2, 4, 7], "draft_ms": [2.9, 5.3, 8.9]})
    manifest = {
        "model": {
            "target": target.name,
            "target_config_sha256": config_sha256(target),
            "layers": 6,
            "hidden_size": 128,
            "vocab_size": 256,
            "drafter": drafter.name,
            "drafter_kind": "draft_model",
            "drafter_config_sha256": config_sha256(drafter),
        },
        "profiled": {"stages": 2, "prompt_tokens": 64, "ks": [2, 4, max_k]},
        "stage_cost": fit_stage_cost(rows),
        "drafter": fit_drafter(draft),
        "message": fit_messages(errors),
        "acceptance": {"ks": [2, 4, max_k], "max_k": max_k},
    }
    write_bundle(
        out,
        manifest,
        {"stage_passes": rows, "drafter": draft, "emulator_error": errors},
        yaml.safe_dump(profile_to_mapping(prof), sort_keys=False),
    )
    return out


def test_bundle_round_trip(tmp_path):
    b = load_bundle(make_bundle(tmp_path / "b"))
    assert b.manifest["format"] == "wansim-profile-bundle" and b.manifest["version"] == 1
    assert b.max_k == 7 and b.prompt_tokens == 64
    # hand-worked: a middle stage of 2 layers at K=4 (n=5), 8-bit (2 codec ops)
    want = (2.0 - 0.4 + 0.15) + 0.7 * 2 + 0.1 * 5 + 0.02 * 2 * 5 + 2 * 0.3
    assert b.stage_cost.verify_ms("middle", 2, 5, 8) == pytest.approx(want)
    assert b.draft_ms(4) == pytest.approx(0.5 + 1.2 * 4, abs=0.05)
    assert b.draft_ms(0) == 0.0
    assert b.per_message_ms["forward"] == pytest.approx(0.4)
    assert list(b.error_samples("return")) == [0.1, 0.3, 0.5]
    check_model(b, TARGET, DRAFTER, "--profile")


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda p: (p / MANIFEST).unlink(), "--profile: must be a profile bundle directory"),
        (lambda p: (p / MANIFEST).write_text("a: [b"), "bundle.yaml is not valid YAML"),
        (lambda p: (p / FILES["emulator_error"]).unlink(), "emulator_error_ms.csv is missing"),
        (lambda p: (p / FILES["drafter"]).write_text("x\n1\n"), "drafter.csv needs rows"),
        (
            lambda p: (p / FILES["acceptance"]).write_text("per_position: 3\n"),
            "acceptance_profile.yaml is not a valid acceptance profile",
        ),
        (
            lambda p: (p / MANIFEST).write_text(
                (p / MANIFEST).read_text().replace("version: 1", "version: 99")
            ),
            "version: must be 1",
        ),
        (
            lambda p: (p / MANIFEST).write_text(
                (p / MANIFEST).read_text().replace("per_layer_ms: 0.7", "per_layer_ms: fast")
            ),
            "stage_cost.per_layer_ms: must be a finite number",
        ),
    ],
)
def test_damaged_bundle_is_one_input_error(tmp_path, damage, field):
    p = make_bundle(tmp_path / "b")
    damage(p)
    with pytest.raises(WansimInputError) as err:
        load_bundle(p)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_bundle_from_another_model_is_refused(tmp_path):
    other = tmp_path / "other-target"
    shutil.copytree(TARGET, other, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = json.loads((other / "config.json").read_text())
    cfg["hidden_size"] = 64
    (other / "config.json").write_text(json.dumps(cfg))
    b = load_bundle(make_bundle(tmp_path / "b", target=other))
    with pytest.raises(WansimInputError, match="another target model"):
        check_model(b, TARGET, DRAFTER, "--profile")


# ----------------------------------------------------------------------------- the matrix
def test_shipped_matrix_spans_the_held_out_space():
    cells = load_matrix(None)
    assert len(cells) >= 24
    assert {c.stages for c in cells} == {2, 4, 6}
    assert {c.latency_ms for c in cells} == {5, 20, 50}
    assert {c.k for c in cells} == {2, 4, 7}
    assert {c.policy for c in cells} == {"chain", "tree"}
    assert {c.concurrency for c in cells} == {1, 4}
    assert {c.schedule for c in cells} == {"sync", "async"}
    assert {c.bits for c in cells} == {32, 8}
    runnable = [c for c in cells if c.runnable]
    # held out: every runnable cell differs from the 2-stage, 5 ms profile in stages or latency
    assert all(c.stages > 2 or c.latency_ms != 5 for c in runnable)
    assert sum(c.stages > 2 for c in runnable) >= 6
    # pending = exactly the cells with a mechanism the real path lacks; none dropped
    for c in cells:
        assert c.runnable == (set(c.mechanisms) <= REAL_PATH_MECHANISMS)
    assert len({c.label for c in cells}) == len(cells)
    quick = load_matrix(None, quick=True)
    assert 2 <= len(quick) <= 6 and all(c.runnable for c in quick)
    assert quick[0].prompts == 3 and quick[0].tokens == 32


def test_mechanism_names():
    assert Cell(4, 20, 4).mechanism == "chain"
    assert Cell(4, 20, 4, policy="tree", concurrency=4).mechanism == "tree+concurrent"
    assert Cell(4, 20, 4, schedule="async", bits=8).mechanism == "chain+async+compressed"
    assert Cell(4, 20, 4, batching="continuous", loss_rate=0.01).mechanism == (
        "chain+batched+lossy"
    )
    assert Cell(6, 5, 2, bits=8).label == "P6-L5-K2-b8"


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ({"stages": 2, "latency_ms": 5}, "cells[0].k: is required"),
        ({"stages": 1, "latency_ms": 5, "k": 2}, "cells[0].stages: must be an integer >= 2"),
        ({"stages": 2, "latency_ms": -1, "k": 2}, "cells[0].latency_ms: must be a finite"),
        ({"stages": 2, "latency_ms": 5, "k": 2, "bits": 7}, "cells[0].bits: must be one of"),
        ({"stages": 2, "latency_ms": 5, "k": 2, "speed": 1}, "cells[0].speed: is not a cell"),
    ],
)
def test_bad_matrix_cells(tmp_path, cell, message):
    m = tmp_path / "m.yaml"
    m.write_text(yaml.safe_dump({"cells": [cell]}))
    with pytest.raises(WansimInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_matrix(m)


def test_cells_the_bundle_cannot_support(tmp_path):
    b = load_bundle(make_bundle(tmp_path / "b"))
    with pytest.raises(WansimInputError, match="must be <= 6: the profiled model"):
        check_cells([Cell(7, 5, 2)], b)
    with pytest.raises(WansimInputError, match="profiled up to K=7"):
        check_cells([Cell(4, 5, 8)], b)
    with pytest.raises(WansimInputError, match=r"profiled widths 8 \| 32"):
        check_cells([Cell(4, 5, 2, bits=4)], b)
    check_cells(load_matrix(None), b)


# ----------------------------------------------------------------------------- the scenario
@pytest.mark.parametrize(("stages", "k", "bits"), [(4, 4, 32), (6, 2, 8), (3, 7, 32)])
def test_scenario_mean_lap_is_the_hand_sum(tmp_path, stages, k, bits):
    """The closed-form mean lap of a predicted cell = the bundle's parts summed by hand:
    stage costs by role and layers, drafting, per hop latency + serialisation + the mean
    per-message cost (scaled by the load factors)."""
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario

    b = load_bundle(make_bundle(tmp_path / "b"))
    f = Factors(compute=1.3, draft=1.3, forward=2.0, back=2.0)
    cell = Cell(stages, 20.0, k, bits=bits)
    cell_scenario(cell, b, tmp_path / "c", f, des_requests=50)
    got = analyze(load_scenario(tmp_path / "c" / "scenario.yaml")).metrics["lap_ms_mean"]
    layers = even_split(6, stages)
    n = k + 1
    stage = 0.0
    for i, lay in enumerate(layers):
        role = "first" if i == 0 else "last" if i == stages - 1 else "middle"
        fixed = {"first": 2.5, "last": 2.0, "middle": 2.0 - 0.4 + 0.15}[role]
        ops = 2 if role == "middle" else 1
        stage += fixed + 0.7 * lay + 0.1 * n + 0.02 * lay * n + (0.3 * ops if bits == 8 else 0)
    act = n * (128 * bits / 8 + (2 * 1 if bits < 16 else 0))  # one fp16 scale per 128 values
    fwd_bytes = 56 + 56 + 4 * k + act
    ser = (stages - 1) * fwd_bytes * 8 / 1e6 + 64 * 8 / 1e6
    hops = stages * 20.0 + ser + 2.0 * ((stages - 1) * 0.4 + 0.3)
    want = 1.3 * stage + 1.3 * (0.5 + 1.2 * k) + hops
    draft = fit_drafter(pd.DataFrame({"k": [2, 4, 7], "draft_ms": [2.9, 5.3, 8.9]}))
    want += 1.3 * (draft["intercept_ms"] + draft["per_draft_ms"] * k - (0.5 + 1.2 * k))
    assert got == pytest.approx(want, rel=1e-9)


def test_pending_cells_are_predicted(tmp_path):
    from wansim.calibrate.predict import engines

    b = load_bundle(make_bundle(tmp_path / "b"))
    for cell in (Cell(4, 5, 4, concurrency=4), Cell(4, 20, 4, schedule="async")):
        cell_scenario(cell, b, tmp_path / cell.label, des_requests=40)
        m = engines(tmp_path / cell.label / "scenario.yaml", des=False)["analytical"]
        assert m["tokens_per_s"] > 0


# ----------------------------------------------------------------------------- the report
def test_report_spread_errors_and_strict_json():
    assert spread([100.0, 110.0]) == pytest.approx(10 / 105)
    assert spread([100.0]) is None
    assert strict({"a": float("nan"), "b": [np.float64(1.5), float("inf")]}) == {
        "a": None,
        "b": [1.5, None],
    }
    entry = {
        "name": "P4-L20-K4",
        "mechanism": "chain",
        "status": "measured",
        "real": {
            "spread": {
                "tokens_per_s": 0.05,
                "lap_ms_p50": 0.02,
                "lap_ms_p99": 0.1,
                "tpot_ms_p99": 0.03,
            },
            "load_avg_1min": {"min": 1.0, "max": 2.0},
        },
        "bundle_only": {
            "analytical": {
                "error": dict.fromkeys(
                    ("tokens_per_s", "lap_ms_p50", "lap_ms_p99", "tpot_ms_p99"), 0.2
                )
            }
        },
    }
    for engine, e in (("des", 0.08), ("analytical", -0.12)):
        entry[engine] = {
            "error": dict.fromkeys(("tokens_per_s", "lap_ms_p50", "lap_ms_p99", "tpot_ms_p99"), e),
            "within_2x_spread": {"tokens_per_s": abs(e) <= 0.1},
        }
    other = json.loads(json.dumps(entry))
    other["name"], other["des"]["error"]["tokens_per_s"] = "P6-L5-K2", -0.02
    s = summarize([entry, other, {"name": "T", "status": "pending", "mechanism": "tree"}])
    assert s["out_of_sample"] is True
    assert s["tokens_per_s"]["median_abs_error"] == pytest.approx(0.05)
    assert s["tokens_per_s"]["worst"] == pytest.approx(0.08)
    assert s["tokens_per_s"]["worst_cell"] == "P4-L20-K4"
    assert s["analytical"]["lap_ms_p50"]["worst"] == pytest.approx(-0.12)
    assert s["pending"] == ["T"] and s["measured"] == 2
    assert s["tokens_per_s_within_2x_spread"] == "2/2"
    text = dumps({"summary": s, "x": float("nan")})
    assert "NaN" not in text and math.isfinite(json.loads(text)["summary"]["tokens_per_s"]["worst"])


# ----------------------------------------------------------------------------- the command
def _run(argv, capsys):
    from wansim.cli import main

    code = main(argv)
    return code, capsys.readouterr().err.strip()


@pytest.fixture
def no_processes(monkeypatch):
    """Any real run or pipeline start fails the test: errors come before processes."""
    import wansim.calibrate.predict as predict

    def boom(*_a, **_k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(predict, "run_real_cell", boom)
    monkeypatch.setattr(predict, "reprofile", boom)


def test_predict_bad_input_exits_2_with_one_line(tmp_path, capsys, no_processes):
    good = make_bundle(tmp_path / "b")
    cases = [
        (["--profile", str(tmp_path / "none")], "--profile: must be a profile bundle directory"),
        (["--profile", str(good), "--matrix", str(tmp_path / "no.yaml")], "--matrix: file not"),
        (["--profile", str(good), "--rounds", "1"], "--rounds: must be an integer >= 2"),
    ]
    m = tmp_path / "m.yaml"
    m.write_text(yaml.safe_dump({"cells": [{"stages": 8, "latency_ms": 5, "k": 2}]}))
    cases.append((["--profile", str(good), "--matrix", str(m)], "stages: must be <= 6"))
    m2 = tmp_path / "m2.yaml"
    m2.write_text(yaml.safe_dump({"cells": [{"stages": 4, "latency_ms": 5, "k": 9}]}))
    cases.append((["--profile", str(good), "--matrix", str(m2)], "profiled up to K=7"))
    corrupt = make_bundle(tmp_path / "c")
    (corrupt / FILES["stage_passes"]).write_bytes(b"\x00\xff\xfe")
    cases.append((["--profile", str(corrupt)], "stage_passes.csv"))
    for extra, message in cases:
        code, err = _run(["calibrate", "predict", "--out", str(tmp_path / "o"), *extra], capsys)
        assert code == 2, (extra, err)
        assert message in err and len(err.splitlines()) == 1, err


def test_profile_bad_input(tmp_path, capsys):
    code, err = _run(
        ["calibrate", "profile", "--out", str(tmp_path / "b"), "--target", "/nonexistent"], capsys
    )
    assert code == 2 and "--target: must be a local checkpoint directory" in err
    assert len(err.splitlines()) == 1


def test_in_sample_mode_is_labelled():
    from wansim.calibrate.run import Settings
    from wansim.calibrate.run import summarize as in_sample_summary

    s = in_sample_summary([], Settings(), 1.0, True)
    assert s["out_of_sample"] is False and "consistency check" in s["mode"]


def test_shipped_matrix_is_package_data():
    assert shipped_matrix().is_file()
    text = (ROOT / "pyproject.toml").read_text()
    assert "heldout.yaml" in text


def test_load_factors_like_for_like(tmp_path):
    """A re-profile whose passes are the bundle's own 3+3 fp32 K=4 passes x 2 (stages and
    drafting) and whose messages cost x 3 gives factors 2 and 3; the bracket of two
    re-profiles is their geometric mean."""
    from wansim.calibrate.predict import bracket, load_factors

    b = load_bundle(make_bundle(tmp_path / "b"))
    ref = b.stage_passes
    stage = ref[(ref["bits"] == 32) & (ref["layers"] == 3)].assign(
        service_ms=lambda d: 2 * d["service_ms"]
    )
    draft = b.drafter_rows.assign(draft_ms=lambda d: 2 * d["draft_ms"])
    hops = b.emulator_error.assign(error_ms=lambda d: 3 * d["error_ms"])
    f = load_factors(b, stage, draft, hops, 4, ((0, 3), (3, 6)))
    assert f.compute == pytest.approx(2.0) and f.draft == pytest.approx(2.0)
    assert f.forward == pytest.approx(3.0) and f.back == pytest.approx(3.0)
    g = bracket(f, Factors(compute=8.0, draft=8.0, forward=3.0, back=3.0))
    assert g.compute == pytest.approx(4.0) and g.forward == pytest.approx(3.0)


def test_lap_parts_name_the_largest_gap():
    """Hand-worked: 3 stages; real stages 10 ms (mean of 9 and 11), drafting 4, per message
    2 forward (x 2 forward hops) and 1 return; predicted stages 9, drafting 4, per message
    5 forward and 1 return: the forward hops' per-message cost is the largest gap (+6 ms)."""
    from wansim.calibrate.report import lap_parts

    runs = [
        {
            "stage_service_ms_mean": [s, 3.0, 3.0],
            "draft_ms_mean": 4.0,
            "per_message_ms_mean": {"forward": 2.0, "return": 1.0},
        }
        for s in (3.0, 5.0)
    ]
    pred = [
        {
            "stage_service_ms": [3.0, 3.0, 3.0],
            "draft_ms": 4.0,
            "per_message_ms": {"forward": 5.0, "return": 1.0},
        }
    ]
    parts = lap_parts(runs, pred)
    assert parts["stages"] == {"real": 10.0, "predicted": 9.0, "gap": -1.0}
    assert parts["per_message_forward"]["gap"] == pytest.approx(6.0)
    assert parts["largest_gap"] == "per_message_forward"
    assert parts["real_stage_service_ms"] == [4.0, 3.0, 3.0]


def test_even_split_is_the_real_runners():
    from wansim.real.config import split_layers

    for layers in (6, 7, 32):
        for stages in range(1, 7):
            want = [hi - lo for lo, hi in split_layers(layers, stages)]
            assert even_split(layers, stages) == want


def test_scenario_compute_from_a_bundle(tmp_path):
    """``model.compute: {kind: table, from: DIR}`` gives every stage the bundle's table (the
    same numbers the predictions use), relative to the scenario's folder; bad input is one
    line naming model.compute.from or stages."""
    from wansim.config.scenario import load_scenario

    make_bundle(tmp_path / "prof")
    b = load_bundle(tmp_path / "prof")
    sc_path = tmp_path / "s.yaml"
    base = {"stages": 4, "payload": {"activation_bits": 8}, "model": {"hidden_size": 128}}
    base["model"]["compute"] = {"kind": "table", "from": "prof"}
    sc_path.write_text(yaml.safe_dump(base))
    sc = load_scenario(sc_path)
    roles = ("first", "middle", "middle", "last")
    for model, role, lay in zip(sc.stage_compute_models(), roles, (2, 2, 1, 1), strict=True):
        pts = dict(model.points)
        assert pts[5.0] == pytest.approx(b.stage_cost.verify_ms(role, lay, 5, 8))
        assert pts[64.0] == pytest.approx(max(0.0, b.stage_cost.prefill_ms(role, lay)))
        assert max(pts) == 64.0 and min(pts) == 1.0
    for bad, message in (
        ({"stages": 8}, "stages: must be <= 6"),
        ({"model": {"compute": {"kind": "table", "from": "nowhere"}}}, "model.compute.from"),
        (
            {"model": {"compute": {"kind": "table", "from": "prof", "points": [[1, 2]]}}},
            "model.compute.from: takes only kind: table",
        ),
    ):
        sc_path.write_text(yaml.safe_dump({**base, **bad}))
        with pytest.raises(WansimInputError, match=message):
            load_scenario(sc_path)
