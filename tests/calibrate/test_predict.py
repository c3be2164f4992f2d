"""``wansim calibrate profile`` / ``predict``: the bundle, the fits, the held-out matrix, the
scenario built from configuration + bundle, the report, and bad input (torch-free).

The real held-out subset (profile once, predict cells the profile did not see) is in
``tests/real/test_predict_real.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
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
    TRACE_FILE,
    check_model,
    config_sha256,
    load_bundle,
    write_bundle,
)
from wansim.calibrate.matrix import (
    REAL_PATH_EXCLUSIVE,
    REAL_PATH_MECHANISMS,
    Cell,
    load_matrix,
    shipped_matrix,
)
from wansim.calibrate.predict import Factors, cell_scenario, check_cells, even_split
from wansim.calibrate.profile_fits import fit_batch, fit_drafter, fit_messages, fit_stage_cost
from wansim.calibrate.report import dumps, format_table, spread, strict, summarize
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
                            # the stage's own codec time: +0.3 ms per op at 8 bits
                            "codec_ms": (ENCODE_FIRST_MS if role == "first" else 0.1)
                            + (TRUE["q8"] if bits == 8 else 0.0),
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
    assert fit["per_token_ms"]["first"] == pytest.approx(TRUE["per_token"], abs=1e-9)
    assert fit["per_token_ms"]["last"] == pytest.approx(TRUE["per_token"], abs=1e-9)
    assert fit["per_layer_token_ms"] == pytest.approx(TRUE["lt"], abs=1e-9)
    assert fit["codec_ms_per_op"][8] == pytest.approx(TRUE["q8"], abs=1e-9)
    # no 3-stage plan: a middle stage is the last without verifying, plus stage 0's encode
    # (hand-worked), at the first stage's cost per token
    assert fit["middle"] == "derived"
    assert fit["fixed_ms"]["middle"] == pytest.approx(2.0 - 0.4 + 0.15, abs=1e-9)
    assert fit["per_token_ms"]["middle"] == fit["per_token_ms"]["first"]
    assert fit["prefill"]["fixed_ms"]["first"] == pytest.approx(3.0)
    assert fit["prefill"]["fixed_ms"]["last"] == pytest.approx(4.0)
    assert fit["prefill"]["per_layer_ms"] == pytest.approx(1.5)


def three_stage_rows(middle_fixed: float, middle_per_token: float) -> pd.DataFrame:
    """A 2+1+3 pipeline's passes on the synthetic hardware, its middle stage at its own fixed
    cost and cost per token (prefill: 3 + 1.5 per layer + 0.5 at the middle)."""
    rows = []
    for k in (2, 4, 7):
        n = k + 1
        for _ in range(20):
            for role, layers, fixed, per_token in (
                ("first", 2, TRUE["first"], TRUE["per_token"]),
                ("middle", 1, middle_fixed, middle_per_token),
                ("last", 3, TRUE["last"], TRUE["per_token"]),
            ):
                ms = fixed + TRUE["per_layer"] * layers + per_token * n + TRUE["lt"] * layers * n
                rows.append(
                    {"kind": "verify", "role": role, "layers": layers, "n_tokens": n, "k": k}
                    | {"bits": 32, "service_ms": ms, "compute_ms": 0.7 * layers}
                    | {"codec_ms": 0.1, "verify_ms": VERIFY_LAST_MS if role == "last" else 0.0}
                )
    for role, layers in (("first", 2), ("middle", 1), ("last", 3)):
        extra = {"middle": 0.5, "last": 1.0}.get(role, 0.0)
        rows.append(
            {"kind": "prefill", "role": role, "layers": layers, "n_tokens": 64, "k": 0}
            | {"bits": 32, "service_ms": 3.0 + 1.5 * layers + extra, "compute_ms": 1.5 * layers}
            | {"codec_ms": 0.1, "verify_ms": 0.0}
        )
    return pd.DataFrame(rows)


def test_a_three_stage_plan_measures_the_middle_role():
    """With a 3-stage plan's rows the middle role is fitted like the others: its own fixed
    cost (1.2 ms, not the derived 1.75) and cost per token (0.01 ms, against the first and
    last stages' 0.1), the shared slopes unchanged; the prefill's middle likewise (4.0 ms at
    1 layer: 3 + 0.5 fixed)."""
    fit = fit_stage_cost(pd.concat([synthetic_rows(), three_stage_rows(1.2, 0.01)]))
    assert fit["middle"] == "measured"
    assert fit["fixed_ms"]["middle"] == pytest.approx(1.2, abs=1e-9)
    assert fit["per_token_ms"]["middle"] == pytest.approx(0.01, abs=1e-9)
    assert fit["per_token_ms"]["first"] == pytest.approx(TRUE["per_token"], abs=1e-9)
    assert fit["per_token_ms"]["last"] == pytest.approx(TRUE["per_token"], abs=1e-9)
    assert fit["per_layer_ms"] == pytest.approx(TRUE["per_layer"], abs=1e-9)
    assert fit["per_layer_token_ms"] == pytest.approx(TRUE["lt"], abs=1e-9)
    assert fit["prefill"]["fixed_ms"]["middle"] == pytest.approx(3.5)
    assert fit["prefill"]["fixed_ms"]["first"] == pytest.approx(3.0)
    # evaluated: a 1-layer middle stage at a 15-token tree pass (hand sum)
    from wansim.stages.profiled_cost import verify_ms

    assert verify_ms(fit, "middle", 1, 15) == pytest.approx(1.2 + 0.7 + 0.01 * 15 + 0.02 * 15)


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
MTP = ROOT / "models" / "tiny-mtp"


def make_bundle(
    out: Path,
    target=TARGET,
    drafter=DRAFTER,
    max_k: int = 7,
    mtp: bool = False,
    idle: dict | None = None,
    batch: dict | None = None,
) -> Path:
    """A synthetic bundle with the fits of :func:`synthetic_rows` (and a fitted profile);
    ``idle``: its ``idle_cost`` entry, ``batch`` its ``batch`` entry (none by default)."""
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
    tree_prof = fit_profile(synthetic_tree_trace(max_k), temperature=0.0, verifier="greedy")
    quality = {
        "format": "wansim-activation-quality/1",
        "source": "measured",
        "target": "tiny-target",
        "provenance": "synthetic (tests)",
        "bits": {
            8: {"acceptance_factor": 0.9, "acceptance_factor_greedy": 0.95, "target_exact": False}
        },
    }
    errors = pd.DataFrame(
        {
            "role": ["forward"] * 3 + ["return"] * 3,
            "bytes": [600] * 3 + [64] * 3,
            "error_ms": [0.2, 0.4, 0.6, 0.1, 0.3, 0.5],
        }
    )
    # chains: K drafts; trees of 2K nodes: + 0.25 ms per extra node
    draft = pd.DataFrame(
        {
            "k": [2, 4, 7, 2, 4, 7],
            "nodes": [2, 4, 7, 4, 8, 14],
            "draft_ms": [2.9, 5.3, 8.9, 3.4, 6.3, 10.65],
        }
    )
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
        "profiled": {"stages": 2, "prompt_tokens": 64, "ks": [2, 4, max_k], "host_cores": 2},
        "stage_cost": fit_stage_cost(rows),
        "drafter": fit_drafter(draft),
        "message": fit_messages(errors),
        "acceptance": {"ks": [2, 4, max_k], "max_k": max_k},
        "activation_quality": {"k": 4, "bits": quality["bits"]},
    }
    if idle is not None:
        manifest["idle_cost"] = idle
    if batch is not None:
        manifest["batch"] = batch

    def profile_text(p) -> str:
        mapping = profile_to_mapping(p)
        mapping["activation_quality"] = FILES["activation_quality"]
        return yaml.safe_dump(mapping, sort_keys=False)

    # each profiled K's own fit (Bundle.profile_at), chains only here
    per_k = {}
    chain = pd.DataFrame(trace)
    for k in (2, 4):
        name = f"acceptance_profile_chain_k{k}.yaml"
        per_k[name] = profile_text(
            fit_profile(chain[chain["k"] == k], temperature=0.0, verifier="greedy")
        )
        manifest["acceptance"].setdefault("per_k", {}).setdefault("chain", {})[k] = name
    mtp_files = None
    if mtp:  # the head: 0.3 + 0.4 K ms at the last stage
        mtp_rows = pd.DataFrame({"k": [2, 4, 7], "draft_ms": [1.1, 1.9, 3.1]})
        manifest["mtp"] = {
            "name": "tiny-mtp",
            "mtp_config_sha256": hashlib.sha256((MTP / "mtp_config.json").read_bytes()).hexdigest(),
            "drafter": fit_drafter(mtp_rows),
            "fixed_ms": {"first": 1.5, "last": 2.2},  # vs the draft model's 2.5 / 2.0
        }
        mtp_files = (mtp_rows, profile_text(prof))
    write_bundle(
        out,
        manifest,
        {"stage_passes": rows, "drafter": draft, "emulator_error": errors},
        profile_text(prof),
        tree_text=profile_text(tree_prof),
        quality_text=yaml.safe_dump(quality, sort_keys=False),
        mtp=mtp_files,
        traces=pd.concat(
            [
                pd.DataFrame(trace).assign(drafter="chain"),
                synthetic_tree_trace(max_k).assign(drafter="tree"),
            ],
            ignore_index=True,
        ),
        per_k=per_k,
    )
    return out


TREE_RANK1, TREE_RANK2, TREE_DEEPER = 0.7, 0.4, 0.6


def synthetic_tree_trace(max_k: int, seed: int = 1) -> pd.DataFrame:
    """Walks of static trees (2 candidates at depth 1, then chains) with known rates: rank 1 at
    depth 1 accepted w.p. 0.7, rank 2 (after rank 1 failed) 0.4, every deeper node 0.6."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in (2, 4, max_k):
        for p in range(8):
            for s in range(40):
                ranks, children = [], [2]
                if rng.random() < TREE_RANK1:
                    ranks.append(1)
                elif rng.random() < TREE_RANK2:
                    ranks.append(2)
                if ranks:
                    while True:
                        children.append(1 if len(ranks) < k else 0)
                        if len(ranks) == k or rng.random() >= TREE_DEEPER:
                            break
                        ranks.append(1)
                rows.append(
                    {
                        "workload": "code",
                        "prompt_id": p,
                        "step": s,
                        "k": k,
                        "accepted": len(ranks),
                        "accepted_ranks": ";".join(map(str, ranks)),
                        "walk_children": ";".join(map(str, children)),
                    }
                )
    return pd.DataFrame(rows)


def test_bundle_round_trip(tmp_path):
    b = load_bundle(make_bundle(tmp_path / "b"))
    assert b.manifest["format"] == "wansim-profile-bundle" and b.manifest["version"] == 3
    assert b.max_k == 7 and b.prompt_tokens == 64
    # hand-worked: a middle stage of 2 layers at K=4 (n=5), 8-bit (2 codec ops)
    want = (2.0 - 0.4 + 0.15) + 0.7 * 2 + 0.1 * 5 + 0.02 * 2 * 5 + 2 * 0.3
    assert b.stage_cost.verify_ms("middle", 2, 5, 8) == pytest.approx(want)
    assert b.draft_ms(4) == pytest.approx(0.5 + 1.2 * 4, abs=0.05)
    assert b.draft_ms(0) == 0.0
    assert b.per_message_ms["forward"] == pytest.approx(0.4)
    assert list(b.error_samples("return")) == [0.1, 0.3, 0.5]
    check_model(b, TARGET, DRAFTER, "--profile")
    # the per-prompt traces the profiles were fitted from (optional file, present here)
    assert set(b.acceptance_traces["drafter"]) == {"chain", "tree"}
    assert b.manifest["files"]["acceptance_traces"] == TRACE_FILE
    (b.path / TRACE_FILE).unlink()  # a bundle profiled before the traces were kept
    assert load_bundle(b.path).acceptance_traces is None
    assert b.profile_at("chain", 4).name == "acceptance_profile_chain_k4.yaml"
    assert b.profile_at("chain", 7) is None and b.profile_at("tree", 2) is None


def test_a_version_2_bundle_prices_every_role_at_its_one_per_token_cost(tmp_path):
    """Bundles profiled before the middle role was measured (version 2) carry one number for
    ``per_token_ms``: every role takes it, in the bundle and in ``model.compute: {kind:
    table, from: ...}``."""
    from wansim.stages.profiled_cost import tables_from_bundle

    p = make_bundle(tmp_path / "b")
    man = yaml.safe_load((p / MANIFEST).read_text())
    man["version"] = 2
    man["stage_cost"]["per_token_ms"] = 0.25
    (p / MANIFEST).write_text(yaml.safe_dump(man, sort_keys=False))
    b = load_bundle(p)
    assert b.stage_cost.per_token_ms == {"first": 0.25, "middle": 0.25, "last": 0.25}
    fixed = b.stage_cost.fixed_ms
    want = fixed["middle"] + 0.7 * 2 + 0.25 * 5 + 0.02 * 2 * 5
    assert b.stage_cost.verify_ms("middle", 2, 5) == pytest.approx(want, abs=1e-9)
    table = tables_from_bundle(p, 3, 32, "model.compute.from")[1]
    assert dict(map(tuple, table["points"]))[5.0] == pytest.approx(want, abs=1e-9)


def test_a_profiled_k_is_predicted_from_its_own_traces(tmp_path):
    """A cell at a K the bundle profiled reads that K's own fit (its tau equals the traces'
    mean accepted + 1 at that K, an independent count); another K reads the pooled profile."""
    from wansim.acceptance.model import acceptance_model
    from wansim.config.scenario import load_scenario

    b = load_bundle(make_bundle(tmp_path / "b"))
    raw = cell_scenario(Cell(4, 20.0, 4), b, tmp_path / "k4")
    assert raw["drafter"]["acceptance"]["profile"] == str(b.profile_at("chain", 4).resolve())
    raw7 = cell_scenario(Cell(4, 20.0, 7), b, tmp_path / "k7")
    assert raw7["drafter"]["acceptance"]["profile"] == str(b.acceptance_profile.resolve())
    tr = b.acceptance_traces
    tr = tr[(tr["drafter"] == "chain") & (tr["k"] == 4)]
    model = acceptance_model(load_scenario(tmp_path / "k4" / "scenario.yaml").drafter.acceptance)
    assert model.tau(4) == pytest.approx((tr["accepted"] + 1).mean(), rel=1e-3)
    # the own-prompts variant overrides both
    other = tmp_path / "own.yaml"
    other.write_text(b.acceptance_profile.read_text())
    raw_own = cell_scenario(Cell(4, 20.0, 4), b, tmp_path / "own", acceptance=other)
    assert raw_own["drafter"]["acceptance"]["profile"] == str(other.resolve())


def test_a_cell_shorter_than_the_traces_is_predicted_from_the_steps_it_reaches(tmp_path):
    """Acceptance that rises along the output (every prompt: 5 steps accepting nothing, then
    full blocks of K = 4): a cell of 11 output tokens (10 decode tokens) reaches steps 0-5
    (5 + 5 tokens), so its profile is fitted on those alone and its tau is their mean
    accepted + 1, counted by hand: (5 x 1 + 1 x 5) / 6. Every step reached, a tree, or a K the
    traces lack: the bundle's own profiles serve."""
    from wansim.acceptance.model import acceptance_model
    from wansim.calibrate.bundle import TRACE_FILE
    from wansim.config.scenario import load_scenario

    path = make_bundle(tmp_path / "b")
    rows = [
        {"drafter": "chain", "prompt_id": p, "k": 4, "step": s, "accepted": 0 if s < 5 else 4}
        for p in range(8)
        for s in range(15)
    ]
    traces = pd.read_csv(path / TRACE_FILE)
    traces = pd.concat([traces[traces["k"] != 4], pd.DataFrame(rows)], ignore_index=True)
    traces.to_csv(path / TRACE_FILE, index=False)
    b = load_bundle(path)
    raw = cell_scenario(Cell(4, 20.0, 4, tokens=11), b, tmp_path / "short")
    profile = Path(raw["drafter"]["acceptance"]["profile"])
    assert profile.parent == tmp_path / "short" and "11_tokens" in profile.name
    model = acceptance_model(load_scenario(tmp_path / "short" / "scenario.yaml").drafter.acceptance)
    assert model.tau(4) == pytest.approx((5 * 1 + 1 * 5) / 6, rel=1e-6)
    # 76 output tokens reach all 15 steps (5 + 10 x 5 = 55 decode tokens): the per-K profile
    raw = cell_scenario(Cell(4, 20.0, 4, tokens=76), b, tmp_path / "long")
    assert raw["drafter"]["acceptance"]["profile"] == str(b.profile_at("chain", 4).resolve())
    tree = cell_scenario(Cell(4, 20.0, 4, policy="tree", tokens=11), b, tmp_path / "tree")
    assert "_tokens" not in tree["drafter"]["acceptance"]["profile"]
    raw7 = cell_scenario(Cell(4, 20.0, 7, tokens=11), b, tmp_path / "k7")  # no K = 7 fit alone
    assert raw7["drafter"]["acceptance"]["profile"] == str(b.acceptance_profile.resolve())


def test_a_short_cell_measures_its_guess_on_the_larger_k_it_reaches(tmp_path):
    """The async bet's guess (position K + 1) of a short cell comes from the steps of the larger
    K traces that a request of its length reaches. K = 2 steps accept 2 (3 tokens each); K = 4
    steps accept 2, 2, 2, then 3 onward. 11 output tokens (10 decode tokens) reach steps 0-3 at
    either K, so P(A >= 3 | A >= 2) at K = 4 is 1 / 4, by hand (all 15 steps: 12 / 15)."""
    from wansim.calibrate.bundle import TRACE_FILE

    path = make_bundle(tmp_path / "b")
    rows = [
        {"drafter": "chain", "prompt_id": p, "k": k, "step": s, "accepted": a}
        for p in range(8)
        for s in range(15)
        for k, a in ((2, 2), (4, 2 if s < 3 else 3))
    ]
    traces = pd.read_csv(path / TRACE_FILE)
    keep = traces[~traces["k"].isin([2, 4, 7])]  # the bundle's K = 7 chains go too
    pd.concat([keep, pd.DataFrame(rows)], ignore_index=True).to_csv(path / TRACE_FILE, index=False)
    b = load_bundle(path)
    raw = cell_scenario(Cell(4, 20.0, 2, tokens=11, schedule="async"), b, tmp_path / "short")
    prof = yaml.safe_load(Path(raw["drafter"]["acceptance"]["profile"]).read_text())
    body = prof["workloads"]["code"]
    assert prof["k"] == 2 and body["per_position"] == [1.0, 1.0]
    assert body["guess_rate"] == pytest.approx(1 / 4)
    assert "position 3 (the async bet's guess) from K 4" in prof["provenance"]


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
            lambda p: (p / FILES["acceptance_tree"]).unlink(),
            "acceptance_profile_tree.yaml is missing",
        ),
        (
            lambda p: (p / FILES["activation_quality"]).write_text("bits: 3\n"),
            "activation_quality.yaml is not a valid activation-quality table",
        ),
        (
            lambda p: (p / MANIFEST).write_text(
                (p / MANIFEST).read_text().replace("version: 3", "version: 99")
            ),
            "version: must be 2 or 3",
        ),
        (
            lambda p: (p / MANIFEST).write_text(
                re.sub(
                    r"(per_token_ms:\n    first: [^\n]+)\n    middle: [^\n]+",
                    r"\1",
                    (p / MANIFEST).read_text(),
                )
            ),
            "stage_cost.per_token_ms.middle: is missing",
        ),
        (
            lambda p: (p / MANIFEST).write_text(
                re.sub(
                    r"\n  per_layer_ms: [^\n]+",
                    "\n  per_layer_ms: fast",
                    (p / MANIFEST).read_text(),
                )
            ),
            "stage_cost.per_layer_ms: must be a finite number",
        ),
        (
            lambda p: (p / MANIFEST).write_text(
                (p / MANIFEST).read_text().replace("host_cores: 2", "host_cores: 0")
            ),
            "profiled.host_cores: must be an integer >= 1",
        ),
        (
            lambda p: (p / TRACE_FILE).write_text(
                "drafter,prompt_id,k,step,accepted\nfoo,0,2,0,1\n"
            ),
            "acceptance_traces.csv needs drafter in chain/tree/mtp",
        ),
        (
            lambda p: (p / "acceptance_profile_chain_k4.yaml").unlink(),
            "acceptance_profile_chain_k4.yaml is missing",
        ),
        (
            lambda p: (p / "acceptance_profile_chain_k2.yaml").write_text("per_position: 3\n"),
            "acceptance_profile_chain_k2.yaml is not a valid acceptance profile",
        ),
        (
            lambda p: (p / TRACE_FILE).write_text("drafter,prompt_id,k\nchain,0,2\n"),
            "acceptance_traces.csv needs rows with columns",
        ),
        (
            lambda p: (p / TRACE_FILE).write_text(
                "drafter,prompt_id,k,step,accepted\nchain,0,2,0,-1\n"
            ),
            "whole numbers >= 0",
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
    # pending = exactly the cells with a mechanism (or pair) the real path lacks; none dropped
    for c in cells:
        alone = set(c.mechanisms) <= REAL_PATH_MECHANISMS
        together = not any(pair <= set(c.mechanisms) for pair in REAL_PATH_EXCLUSIVE)
        assert c.runnable == (alone and together)
    pending = [c for c in cells if not c.runnable]
    assert not pending  # the real path combines every pair of the shipped cells
    assert {m for c in runnable for m in c.mechanisms} == {
        "chain",
        "tree",
        "mtp",
        "concurrent",
        "batched",
        "async",
        "compressed",
    }
    assert len(runnable) >= 20
    assert len({c.label for c in cells}) == len(cells)
    quick = load_matrix(None, quick=True)
    assert 2 <= len(quick) <= 6 and all(c.runnable for c in quick)
    assert {m for c in quick for m in c.mechanisms} >= {"tree", "concurrent", "async"}
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
    check_cells([c for c in load_matrix(None) if c.drafter != "mtp"], b)
    check_cells(load_matrix(None), load_bundle(make_bundle(tmp_path / "m", mtp=True)))


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


def test_every_mechanism_is_predicted_from_the_bundle(tmp_path):
    from wansim.calibrate.predict import engines

    b = load_bundle(make_bundle(tmp_path / "b"))
    for cell in (
        Cell(4, 5, 4, concurrency=4),
        Cell(4, 20, 4, schedule="async"),
        Cell(4, 20, 4, policy="tree"),
        Cell(4, 5, 4, policy="tree", concurrency=4),
        Cell(4, 50, 2, concurrency=4, batching="continuous"),
    ):
        cell_scenario(cell, b, tmp_path / cell.label, des_requests=40)
        m = engines(tmp_path / cell.label / "scenario.yaml", des=False)["analytical"]
        assert m["tokens_per_s"] > 0


def test_mechanisms_matrix_one_cell_each_run_and_predicted_alike(tmp_path):
    """The shipped one-cell-per-mechanism matrix: every cell runnable and differing from the
    4-stage 20 ms K=4 chain in its mechanism alone; a micro-batched cell's scenario keeps as
    many batches in flight as its real run (prompts riding the passes), and both engines
    predict every cell."""
    from wansim.calibrate.predict import engines

    b = load_bundle(make_bundle(tmp_path / "b"))
    cells = load_matrix("mechanisms")
    assert [c.mechanism for c in cells] == [
        "chain",
        "tree",
        "chain+concurrent",
        "chain+concurrent+batched",
        "chain+concurrent+batched",
        "chain+async",
        "chain+compressed",
        "chain+lossy",
    ]
    assert all(c.runnable and (c.stages, c.latency_ms) == (4, 20) for c in cells)
    assert [c.micro_batches for c in cells if c.batching == "continuous"] == [1, 2]
    assert cells[4].label == "P4-L20-K4-concurrent-batched-mb2"
    for cell in cells:
        raw = cell_scenario(cell, b, tmp_path / cell.label, des_requests=40)
        if cell.batching == "continuous":
            assert raw["schedule"]["micro_batches"] == cell.micro_batches
        m = engines(tmp_path / cell.label / "scenario.yaml")
        assert m["analytical"]["tokens_per_s"] > 0 and m["des"]["tokens_per_s"] > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("cells: [{stages: 4, latency_ms: 5, k: 2, concurrency: 4, micro_batches: 2}]")
    with pytest.raises(WansimInputError, match=r"cells\[0\]\.micro_batches: needs batching"):
        load_matrix(bad)


def test_fixed_costs_reach_the_engines_through_scenario_fields(tmp_path):
    """The bundle's fixed cost per pass is each stage's ``model.stage_overhead_ms`` (scaled by
    ``host_cpu_factor``, the load factor) and its per-message cost each hop's
    ``per_message_ms``; the tables and the jitter keep only the rest (jitter mean 0)."""
    b = load_bundle(make_bundle(tmp_path / "b"))
    f = Factors(compute=1.5, draft=1.5, forward=2.0, back=3.0)
    raw = cell_scenario(Cell(4, 20, 4), b, tmp_path / "c", f, des_requests=10)
    fixed = b.stage_cost.fixed_ms
    assert raw["model"]["stage_overhead_ms"] == pytest.approx(
        [fixed["first"], fixed["middle"], fixed["middle"], fixed["last"]]
    )
    assert raw["model"]["host_cpu_factor"] == 1.5
    assert raw["model"]["host_cores"] == b.host_cores == 2  # the profiled host's cores
    hops = raw["network"]["hops"]
    assert [h["per_message_ms"] for h in hops] == pytest.approx([0.8, 0.8, 0.8, 0.9])
    for h in hops:
        resid = np.loadtxt(tmp_path / "c" / h["jitter"]["samples_file"])
        assert resid.mean() == pytest.approx(0.0, abs=1e-12)
    # the table holds the rest: layers, tokens and codec (x the load factor)
    table = dict(map(tuple, raw["model"]["stage_compute"][0]["points"]))
    want = (b.stage_cost.verify_ms("first", 2, 5) - fixed["first"]) * 1.5
    assert table[5.0] == pytest.approx(want)


def test_tree_cell_scenario_is_the_bundles_tree(tmp_path):
    """A tree cell: the static tree of 2K nodes, the bundle's tree profile (rank-1 rates and the
    sibling rate fitted from tree walks), drafting K passes + width_ms per extra node, every
    stage at n = 2K + 1. The closed-form mean lap = those parts by hand (the bytes differ from
    a chain's by < 0.2 ms of serialisation at 1000 Mbit/s over the lap: tolerance)."""
    from wansim.acceptance.profile import load_profile
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario

    b = load_bundle(make_bundle(tmp_path / "b"))
    assert b.draft_width_ms == pytest.approx(0.25, abs=1e-9)
    wp = next(iter(load_profile(b.tree_acceptance_profile).workloads.values()))
    assert wp.per_position[0] == pytest.approx(TREE_RANK1, abs=0.06)
    assert wp.siblings[0] == pytest.approx(TREE_RANK2, abs=0.1)
    assert wp.per_position[1] == pytest.approx(TREE_DEEPER, abs=0.06)
    cell = Cell(4, 20, 4, policy="tree")
    raw = cell_scenario(cell, b, tmp_path / "t", des_requests=10)
    assert raw["speculation"]["tree"] == {"kind": "static", "branching": [2, 1, 1, 1]}
    assert raw["drafter"]["acceptance"]["profile"].endswith("acceptance_profile_tree.yaml")
    got = analyze(load_scenario(tmp_path / "t" / "scenario.yaml")).metrics["lap_ms_mean"]
    n = 9
    stage = sum(
        b.stage_cost.verify_ms(r, lay, n)
        for r, lay in zip(("first", "middle", "middle", "last"), even_split(6, 4), strict=True)
    )
    draft = b.draft_ms(4) + 0.25 * 4
    hops = 4 * 20.0 + 3 * 0.4 + 0.3
    assert got == pytest.approx(stage + draft + hops, abs=0.2)


def test_mtp_cells_use_the_bundles_head(tmp_path):
    """``drafter: mtp`` cells: the head drafts at the last stage for the bundle's K-draft time,
    its drafts ride the verdict back; a bundle without the head refuses the cell (one line)."""
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario

    with pytest.raises(WansimInputError, match=r"drafter: must be draft_model"):
        check_cells([Cell(4, 20, 4, drafter="mtp")], load_bundle(make_bundle(tmp_path / "a")))
    b = load_bundle(make_bundle(tmp_path / "b", mtp=True))
    assert b.mtp_draft_ms(4) == pytest.approx(0.3 + 0.4 * 4, abs=1e-9)
    cell = Cell(4, 20, 4, drafter="mtp")
    assert cell.mechanism == "chain+mtp" and cell.label == "P4-L20-K4-mtp" and cell.runnable
    assert not Cell(4, 20, 4, drafter="mtp", concurrency=4).runnable
    check_cells([cell], b)
    raw = cell_scenario(cell, b, tmp_path / "m", des_requests=10)
    assert raw["drafter"]["kind"] == "mtp" and raw["drafter"]["placement"] == "last_stage"
    assert raw["drafter"]["draft_ms"] * 4 == pytest.approx(b.mtp_draft_ms(4))
    assert raw["payload"]["return_bytes"] > 64  # the drafts ride the verdict
    got = analyze(load_scenario(tmp_path / "m" / "scenario.yaml")).metrics["lap_ms_mean"]
    stage = sum(
        b.stage_cost.verify_ms(r, lay, 5)
        for r, lay in zip(("first", "middle", "middle", "last"), even_split(6, 4), strict=True)
    )
    stage += (1.5 - 2.5) + (2.2 - 2.0)  # the MTP pipeline's own first/last fixed costs
    fwd_bytes = 56 + (56 + 4 * 4) + 5 * 128 * 4  # activation frame, draft ids, fp32 x n
    ser = (3 * fwd_bytes + raw["payload"]["return_bytes"]) * 8 / 1e6  # ms at 1000 Mbit/s
    hops = 4 * 20.0 + 3 * 0.4 + 0.3 + ser
    assert raw["payload"]["return_bytes"] == 64 + 56 + 4 * 4
    assert got == pytest.approx(stage + b.mtp_draft_ms(4) + hops, rel=1e-9)


def test_compressed_cells_use_the_bundles_quality_table(tmp_path):
    """8-bit cells: the bundle's measured acceptance factor applies (greedy 0.95 here) and the
    analytical result is validated (it was not without a table)."""
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario

    b = load_bundle(make_bundle(tmp_path / "b"))
    out = {}
    for bits in (32, 8):
        cell_scenario(Cell(4, 20, 4, bits=bits), b, tmp_path / f"b{bits}", des_requests=10)
        out[bits] = analyze(load_scenario(tmp_path / f"b{bits}" / "scenario.yaml"))
    assert out[8].approximation["validated"] is True
    assert out[8].metrics["target_exact"] is False
    assert out[8].metrics["tau"] < out[32].metrics["tau"]
    assert b.quality_bits == {32, 8}


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
    assert s["analytical_tokens_per_s_within_2x_spread"] == "0/2"  # -12% against 10%
    other["analytical"]["within_2x_spread"]["tokens_per_s"] = True
    s2 = summarize([entry, other])
    assert s2["analytical_tokens_per_s_within_2x_spread"] == "1/2"
    assert s2["tokens_per_s_within_2x_spread"] == "2/2"  # the DES's own count
    shown = format_table(
        {"summary": {**s2, "settings": {"rounds": 2}, "bundle": "B", "seconds": 1.0}, "cells": []}
    )
    assert "analytical tokens/s error within 2x the cell's spread: 1/2" in shown
    text = dumps({"summary": s, "x": float("nan")})
    assert "NaN" not in text and math.isfinite(json.loads(text)["summary"]["tokens_per_s"]["worst"])


def test_the_timing_spread_divides_the_prompts_tau_out():
    """Two rounds whose prompts accept differently (tau 3 and 4) at one rate per verify pass
    (20 a second): tokens/s spreads 20 / 70 between them and the timing not at all, so a 10%
    error is within twice the first spread and beyond twice the second; hand-worked."""
    from wansim.calibrate.matrix import Cell
    from wansim.calibrate.report import cell_entry

    cell = Cell(4, 20.0, 4, prompts=2, tokens=24)
    runs = [
        {**_fake_real(cell, 0), "tokens_per_s": 60.0, "tau": 3.0},
        {**_fake_real(cell, 0), "tokens_per_s": 80.0, "tau": 4.0},
    ]
    pred = {"tokens_per_s": 77.0, "tau": 3.5}
    parts = {
        "stage_service_ms": [2.0] * 4,
        "draft_ms": 1.5,
        "per_message_ms": runs[0]["per_message_ms_mean"],
    }
    entry = cell_entry(
        cell,
        runs,
        {"rounds": [{"des": pred, "analytical": pred, "components": parts}], "bundle_only": {}},
    )
    assert entry["real"]["spread"]["tokens_per_s"] == pytest.approx(20 / 70)
    assert entry["real"]["spread"]["pass_rate"] == 0.0
    assert entry["des"]["error"]["tokens_per_s"] == pytest.approx(0.1)
    assert entry["des"]["within_2x_spread"]["tokens_per_s"] is True
    assert entry["des"]["within_2x_timing_spread"] is False
    s = summarize([entry])
    assert s["tokens_per_s_within_2x_timing_spread"] == "0/1"
    assert s["real_spread_median"]["pass_rate"] == 0.0


def test_des_sample_band_is_the_chance_of_a_few_requests(tmp_path):
    """The DES's tokens/s over seeded runs of a cell's request count: ordered percentiles, a
    band that narrows as the runs hold more requests (an independent computation: the same
    seeds, 2 vs 32 requests), and a median near the 1,000-request prediction."""
    from wansim.calibrate.predict import des_sample_band, engines

    b = load_bundle(make_bundle(tmp_path / "b"))
    cell_scenario(Cell(4, 20.0, 4), b, tmp_path / "c", des_requests=1000)
    path = tmp_path / "c" / "scenario.yaml"
    few = des_sample_band(path, 2, seeds=40)
    many = des_sample_band(path, 32, seeds=40)
    assert few["p2_5"] <= few["p50"] <= few["p97_5"] and few["requests"] == 2
    assert many["p97_5"] - many["p2_5"] < (few["p97_5"] - few["p2_5"]) / 2
    long_run = engines(path)["des"]["tokens_per_s"]
    assert many["p50"] == pytest.approx(long_run, rel=0.05)
    assert many["p2_5"] <= long_run <= many["p97_5"]


def test_real_bets_counted_from_the_steps_and_cancellations():
    """Hand-worked async run, two requests: request 0's blocks 1 -> 2 -> 4 (the bet behind 2
    lost: pass 3 cancelled after it; 4 restarted after 2's verdict), request 1's 10 -> 11 (won:
    11 started before 10's verdict) -> 12 (started after 11's verdict: no bet behind 11)."""
    from wansim.calibrate.measure import real_bets
    from wansim.calibrate.report import _bet_words, bet_rates

    steps = pd.DataFrame(
        {
            "prompt_index": [0, 0, 0, 1, 1, 1],
            "step": [0, 1, 2, 0, 1, 2],
            "pass": [1, 2, 4, 10, 11, 12],
            "start_ns": [0, 5, 200, 0, 5, 300],
            "verdict_ns": [100, 150, 300, 100, 200, 400],
        }
    )
    cancelled = pd.DataFrame({"prompt_index": [0], "pass": [3], "after_pass": [2]})
    # request 0: pass 1 -> 2 started at 5 < 100 (won), pass 2's bet lost; request 1: 10 won
    assert real_bets(steps, cancelled) == {"won": 2, "lost": 1, "win_rate": 2 / 3}
    assert real_bets(steps, pd.DataFrame()) == {"won": 2, "lost": 0, "win_rate": 1.0}
    assert real_bets(steps.iloc[[2]], None)["win_rate"] is None  # no bet placed
    bets = {"real_won": 2, "real_lost": 1, "real_win_rate": 2 / 3, "des_win_rate": 0.7}
    assert _bet_words(bets) == "; bets won: real 0.67 (2 of 3 a run), DES 0.70"
    assert _bet_words(None) == ""
    # the report's rates: real per run (greedy runs repeat their bets), DES per round, and the
    # DES on the cell's own prompts' acceptance beside it
    runs = [{"bets": {"won": 2, "lost": 1}}, {"bets": {"won": 4, "lost": 1}}]
    rounds = [{"des": {"bet_win_rate": 0.6}}, {"des": {"bet_win_rate": 0.8}}]
    own = [{"des": {"bet_win_rate": 0.5}}, {"des": {"bet_win_rate": None}}]
    rates = bet_rates(runs, rounds, own)
    assert rates["real_won"] == 3 and rates["real_lost"] == 1 and rates["real_win_rate"] == 0.75
    assert rates["des_win_rate"] == pytest.approx(0.7) and rates["des_win_rate_own_prompts"] == 0.5
    assert "own prompts 0.50" in _bet_words(rates)
    assert "des_win_rate_own_prompts" not in bet_rates(runs, rounds, None)
    assert bet_rates([{"bets": None}], rounds, own) is None


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
    m3 = tmp_path / "m3.yaml"
    m3.write_text(yaml.safe_dump({"cells": [{"stages": 4, "latency_ms": 5, "k": 2}]}))
    cases.append(
        (
            ["--profile", str(good), "--matrix", str(m3), "--reuse", str(tmp_path / "nothing")],
            "--reuse: must be a calibrate predict output dir holding predict.json",
        )
    )
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "predict.json").write_text('{"cells": []}')
    cases.append(
        (
            ["--profile", str(good), "--matrix", str(m3), "--reuse", str(tmp_path / "half")],
            "--reuse: must be a",
        )
    )
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
    assert shipped_matrix().is_file() and shipped_matrix("mechanisms.yaml").is_file()
    text = (ROOT / "pyproject.toml").read_text()
    assert "heldout.yaml" in text and "mechanisms.yaml" in text


def test_load_factors_like_for_like(tmp_path):
    """A re-profile whose passes are the bundle's own 3+3 fp32 K=4 passes x 2 (stages and
    drafting) and whose messages cost x 3 gives factors 2 and 3; the bracket of two
    re-profiles is their geometric mean."""
    from wansim.calibrate.predict import geometric_mean, load_factors

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
    g = geometric_mean([f, Factors(compute=8.0, draft=8.0, forward=3.0, back=3.0)])
    assert g.compute == pytest.approx(4.0) and g.forward == pytest.approx(3.0)


def test_round_factors_average_the_round_and_read_old_records():
    """A round's factors are the geometric mean of its re-profiles and the next one; a record
    from before the slices (one re-profile per round, no ``round``) gives the bracket of two,
    as it did; a stopped run's last round has no re-profile after it."""
    from wansim.calibrate.predict import geometric_mean, round_factors

    def prof(x, **kw):
        return {"factors": Factors(x, x, 2 * x, 2 * x).as_dict(), **kw}

    new = [prof(1.0, round=0), prof(4.0, round=0), prof(2.0, round=1), prof(0.5, round=2)]
    f0, used0 = round_factors(new, 0)
    assert f0.compute == pytest.approx(2.0) and f0.forward == pytest.approx(4.0)  # (1*4*2)^(1/3)
    assert used0 == new[:3]
    f1, _ = round_factors(new, 1)
    assert f1.compute == pytest.approx(1.0)
    old = [prof(1.0, index=0), prof(4.0, index=1), prof(0.25, index=2)]
    for r in (0, 1):
        want = geometric_mean([Factors(**old[r]["factors"]), Factors(**old[r + 1]["factors"])])
        assert round_factors(old, r)[0].as_dict() == pytest.approx(want.as_dict())
    stopped = [prof(3.0, round=0), prof(5.0, round=0)]
    assert round_factors(stopped, 0)[0].compute == pytest.approx(math.sqrt(15.0))


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


def test_quality_table_from_wire_quality_rows():
    """Hand case: factors are min(1, ratio to fp32); below 16 bits never exact; the table loads
    as a ``wansim-activation-quality/1`` file."""
    from wansim.acceptance.activation_quality import table_from_mapping
    from wansim.calibrate.profile_acceptance import quality_table

    rows = [
        {
            "activation_bits": 32,
            "acceptance_ratio": 1.0,
            "acceptance_lossless_ratio": 1.0,
            "target_exact": True,
            "kl_mean": 0.0,
            "token_agreement": 1.0,
        },
        {
            "activation_bits": 8,
            "acceptance_ratio": 1.05,
            "acceptance_lossless_ratio": 0.97,
            "target_exact": True,
            "kl_mean": 1.9e-5,
            "token_agreement": 1.0,
        },
        {
            "activation_bits": 4,
            "acceptance_ratio": 0.9,
            "acceptance_lossless_ratio": 0.8,
            "target_exact": False,
            "kl_mean": 5.8e-3,
            "token_agreement": 0.55,
        },
    ]
    t = quality_table(rows, "tiny", "test")
    assert t["bits"][8] == {
        "acceptance_factor": 0.97,
        "acceptance_factor_greedy": 1.0,
        "target_exact": False,
        "kl_mean": 1.9e-5,
        "token_agreement": 1.0,
    }
    assert t["bits"][4]["acceptance_factor_greedy"] == 0.9 and 32 not in t["bits"]
    q = table_from_mapping(t, "test")
    assert q.at(4).factor("greedy") == 0.9 and q.at(8).factor("lossless") == 0.97


def test_stage_cost_fit_never_goes_negative():
    """Costs per pass, layer and token are >= 0: on rows whose service does not grow with n
    (true per-token cost 0) plus preemption-like spikes at small n, the unconstrained fit gives
    a negative per-token cost; the bundle's fit gives 0 and keeps the others >= 0."""
    rows = synthetic_rows()
    rows = rows.assign(
        service_ms=np.where(
            (rows["kind"] == "verify") & (rows["n_tokens"] == 3), rows["service_ms"] + 30.0, 2.0
        )
        + np.where(rows["kind"] == "verify", 0.0, rows["service_ms"])
    )
    v = rows[(rows["kind"] == "verify") & rows["role"].isin(("first", "last"))]
    x = np.column_stack(
        [
            (v["role"] == "first").to_numpy(float),
            (v["role"] == "last").to_numpy(float),
            v["layers"].to_numpy(float),
            v["n_tokens"].to_numpy(float),
            (v["layers"] * v["n_tokens"]).to_numpy(float),
        ]
    )
    free, *_ = np.linalg.lstsq(x, v["service_ms"].to_numpy(float), rcond=None)
    assert free.min() < 0  # the unconstrained fit would price a longer pass cheaper
    fit = fit_stage_cost(rows)
    assert min(fit["fixed_ms"].values()) >= 0
    assert fit["per_layer_ms"] >= 0 and min(fit["per_token_ms"].values()) >= 0
    assert fit["per_layer_token_ms"] >= 0


def test_sample_p99_is_the_real_estimator():
    """The p99 of n requests (np.quantile, linear) averaged over draws of n: by hand for a
    two-value population (every draw of 2 is {0, 1}: 0.99), and against the order statistics
    of n = 4 draws without replacement from 1..1000 (E[x_(k)] = k 1001 / 5, so the estimator's
    mean is x_(3) + 0.97 (x_(4) - x_(3)) = 794.794; 2,000 draws: standard error ~3.6, bound 15)."""
    from wansim.calibrate.predict import sample_p99

    assert sample_p99([0.0, 1.0], 2) == pytest.approx(0.99, abs=1e-12)
    exact = 3 * 1001 / 5 + 0.97 * (4 * 1001 / 5 - 3 * 1001 / 5)
    assert sample_p99(np.arange(1.0, 1001.0), 4) == pytest.approx(exact, abs=15.0)
    # for a few requests it sits well below the population's p99 (near their maximum)
    assert sample_p99(np.arange(1.0, 1001.0), 4) < np.quantile(np.arange(1.0, 1001.0), 0.99)


def _fake_real(cell, round_: int) -> dict:
    """A real run's record (the keys run_real_cell returns), made up from the cell: no torch."""
    lap = 5.0 + 2.0 * cell.stages + 2.0 * cell.stages * cell.latency_ms / 10 + round_
    tau = 1.0 + 0.6 * cell.k
    return {
        "tokens_per_s": 1e3 * tau / lap,
        "throughput_tokens_per_s": 1e3 * tau / lap,
        "tau": tau,
        "lap_ms_mean": lap,
        "lap_ms_p50": lap,
        "lap_ms_p99": 1.1 * lap,
        "tpot_ms_p50": lap / tau,
        "tpot_ms_p99": 1.2 * lap / tau,
        "ttft_ms_mean": lap,
        "bubble_fraction": 0.9,
        "stage_utilization": [0.1] * cell.stages,
        "bytes_per_token": 700.0,
        "wasted_token_fraction": 0.2,
        "target_exact": True,
        "acceptance_rate": (tau - 1) / cell.k,
        "requests": cell.prompts,
        "verify_passes": 40,
        "tokens_per_s_ci95": [0.9e3 * tau / lap, 1.1e3 * tau / lap],
        "stage_service_ms_mean": [2.0] * cell.stages,
        "draft_ms_mean": 1.5,
        "per_message_ms_mean": {"forward": 0.5, "return": 0.4},
        "load_avg_1min": [0.5, 0.5],
        "host_cpu": {
            "seconds": 1.0,
            "busy_cores": 0.5 + 0.25 * round_,
            "own_cores": 0.4,
            "others_cores": 0.1 + 0.25 * round_,
            "steal_fraction": 0.01 * round_,
        },
        "seconds": 1.0,
    }


def test_the_report_shows_the_hosts_cores_over_each_cells_decodes():
    """A cell's runs' CPU records (wansim.real.host_load) become a range beside it: busy
    cores, others' most, steal's most; runs recorded before the field keep the load average."""
    from wansim.calibrate.report import _load_words, host_cpu_range

    runs = [
        {
            "seconds": 3,
            "busy_cores": 0.6,
            "own_cores": 0.5,
            "others_cores": 0.1,
            "steal_fraction": 0.0,
        },
        None,
        {
            "seconds": 3,
            "busy_cores": 1.4,
            "own_cores": 0.9,
            "others_cores": 0.5,
            "steal_fraction": 0.02,
        },
    ]
    got = host_cpu_range(runs)
    assert got == {
        "busy_cores": {"min": 0.6, "max": 1.4},
        "own_cores": {"min": 0.5, "max": 0.9},
        "others_cores_max": 0.5,
        "steal_fraction_max": 0.02,
        "runs": 2,
    }
    assert host_cpu_range([None, None]) is None
    # the summary's: every cell's runs together
    both = host_cpu_range([*runs, {**runs[0], "busy_cores": 0.2, "steal_fraction": 0.05}])
    assert both["busy_cores"] == {"min": 0.2, "max": 1.4} and both["runs"] == 3
    assert both["steal_fraction_max"] == 0.05 and host_cpu_range([None]) is None
    old = {"load_avg_1min": {"min": 0.3, "max": 0.45}}
    assert _load_words({**old, "host_cpu": got}) == "0.6-1.4 cores (0.5 others)"
    assert _load_words({**old, "host_cpu": None}) == "0.3-0.5 avg"


def test_each_stages_wait_for_a_core_per_pass_by_hand():
    """A run's per-process waits (wansim.real.host_load) over the passes each stage served (its
    raw rows): stage 0 waited 30 ms over 3 passes, stage 1 8 ms over 4, stage 2 has no record;
    the cell's mean over runs is per stage; the table shows both means beside the DES's."""
    import pandas as pd

    from wansim.calibrate.predict import stage_waits
    from wansim.calibrate.report import _wait_words, per_stage_mean
    from wansim.real.host_load import HostLoad

    load = HostLoad(
        1.0, 1.0, 1.0, 0.0, 0.0, (), (("link0", 5.0), ("stage0", 30.0), ("stage1", 8.0))
    )
    raw = {"stage0": pd.DataFrame({"pass": range(3)}), "stage1": pd.DataFrame({"pass": range(4)})}
    assert stage_waits(load, raw, 3) == [10.0, 2.0, None]
    assert stage_waits(None, raw, 3) is None
    assert stage_waits(HostLoad(1.0, 1.0, 1.0, 0.0, 0.0), raw, 3) is None  # no schedstats
    assert per_stage_mean([[10.0, 2.0, None], None, [6.0, 4.0, 1.0]]) == [8.0, 3.0, 1.0]
    assert per_stage_mean([None, []]) is None
    words = _wait_words(
        {"stage_wait_ms_per_pass": [8.0, 3.0, 1.0]}, {"host_wait_ms_per_pass": [1.0, 0.5]}
    )
    assert words == "; a pass waited 4.00 ms for a core (DES 0.75)"
    assert (
        _wait_words({"stage_wait_ms_per_pass": [2.0]}, {})
        == "; a pass waited 2.00 ms for a core (DES 0.00)"
    )
    assert _wait_words({"stage_wait_ms_per_pass": None}, {}) == ""


def test_an_interrupted_predict_keeps_its_real_runs_for_reuse(tmp_path, monkeypatch):
    """Every real run and re-profile is written to OUT/real_runs.json as it finishes; a run
    interrupted while predicting (after minutes of real runs) is predicted later with
    ``--reuse OUT``, to the same result as the run that was not interrupted."""
    import wansim.calibrate.predict as predict
    from wansim.calibrate.predict import RUNS_FILE, PredictSettings, run_predict

    bundle = make_bundle(tmp_path / "b")
    matrix = tmp_path / "m.yaml"
    cells = [{"stages": 4, "latency_ms": 5, "k": 2}, {"stages": 2, "latency_ms": 20, "k": 4}]
    matrix.write_text(yaml.safe_dump({"defaults": {"prompts": 2, "tokens": 24}, "cells": cells}))
    monkeypatch.setattr(
        predict, "run_real_cell", lambda c, *a, **k: _fake_real(c, int(a[3].name[-1]))
    )
    calls = []

    def fake_reprofile(*_a):  # the i-th re-profile measures the host at 1 + 0.1 i
        f = Factors(*(1.0 + 0.1 * len(calls),) * 4)
        calls.append(f)
        return f, {"factors": f.as_dict(), "load_avg_1min": [0.5, 0.5]}

    monkeypatch.setattr(predict, "reprofile", fake_reprofile)
    monkeypatch.setattr(predict, "workload_profiles", lambda *a, **k: {})
    monkeypatch.setattr(predict, "des_sample_band", lambda *a, **k: None)

    def settings(out: str, reuse: str | None = None) -> PredictSettings:
        return PredictSettings(
            profile=str(bundle),
            matrix=str(matrix),
            target_dir=str(TARGET),
            drafter_dir=str(DRAFTER),
            out=str(tmp_path / out),
            rounds=2,
            des_requests=40,
            reuse=reuse,
        )

    whole = run_predict(settings("whole"))
    host = whole["cells"][0]["real"]["host_cpu"]  # the fake rounds' records, as a range
    assert host["busy_cores"] == {"min": 0.5, "max": 0.75} and host["runs"] == 2
    assert whole["summary"]["host_cpu"]["others_cores_max"] == 0.35
    kept = json.loads((tmp_path / "whole" / RUNS_FILE).read_text())
    assert all(len(r) == 2 for r in kept["runs"].values())
    # each round: its opening re-profile, a slice before each cell (the order reversed in
    # round 2), then the closing one; a round's factors: its own and the next one's
    labels = [c.label for c in load_matrix(str(matrix))]
    assert [(p["round"], p["before"]) for p in kept["profiles"]] == [
        (0, None),
        (0, labels[0]),
        (0, labels[1]),
        (1, None),
        (1, labels[1]),
        (1, labels[0]),
        (2, None),
    ]
    for r, rnd in enumerate(whole["summary"]["rounds"]):
        by_hand = math.exp(np.mean(np.log([1.0 + 0.1 * i for i in range(3 * r, 3 * r + 4)])))
        assert rnd["factors"]["compute"] == pytest.approx(by_hand, rel=1e-12)
        assert [p["index"] for p in rnd["reprofiles"]] == list(range(3 * r, 3 * r + 4))

    engines = predict.engines

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(predict, "engines", interrupted)
    calls.clear()  # the same host again
    with pytest.raises(KeyboardInterrupt):
        run_predict(settings("stopped"))
    assert not (tmp_path / "stopped" / "predict.json").exists()
    assert json.loads((tmp_path / "stopped" / RUNS_FILE).read_text()) == kept

    monkeypatch.setattr(predict, "engines", engines)
    monkeypatch.setattr(predict, "run_real_cell", None)  # reuse: no real run
    again = run_predict(settings("again", reuse=str(tmp_path / "stopped")))
    assert dumps(again["cells"]) == dumps(whole["cells"])
    assert again["summary"]["rounds"] == whole["summary"]["rounds"]


@pytest.mark.parametrize("same", [False, True])
def test_each_round_decodes_its_own_sample_of_the_workloads_prompts(tmp_path, monkeypatch, same):
    """Round r decodes prompts drawn with seed CELL_SEED + r (``same_prompts``: round 0's
    every time); the cell's own-acceptance traces, the DES's sample band and the tau band
    then cover every prompt its rounds decoded, and the report says which design it ran."""
    import wansim.calibrate.predict as predict
    import wansim.calibrate.report as report
    from wansim.calibrate.predict import PredictSettings, run_predict
    from wansim.calibrate.workload_sample import CELL_SEED

    bundle = make_bundle(tmp_path / "b")
    matrix = tmp_path / "m.yaml"
    cells = [{"stages": 2, "latency_ms": 20, "k": 4}]
    matrix.write_text(yaml.safe_dump({"defaults": {"prompts": 3, "tokens": 24}, "cells": cells}))
    seen, pooled, bands = [], [], []

    def fake_real(c, _target, _drafter, prompts, run_dir, *_a):
        seen.append([p.tokens for p in prompts])
        return _fake_real(c, int(run_dir.name[-1]))

    def fake_workload(samples, *_a):
        pooled.extend(samples)
        return {}

    monkeypatch.setattr(predict, "run_real_cell", fake_real)
    monkeypatch.setattr(
        predict,
        "reprofile",
        lambda *_a: (Factors(), {"factors": Factors().as_dict(), "load_avg_1min": [0.5, 0.5]}),
    )
    monkeypatch.setattr(predict, "workload_profiles", fake_workload)
    monkeypatch.setattr(predict, "des_sample_band", lambda _p, n: bands.append(n))
    tau_bands = []
    monkeypatch.setattr(report, "cell_band", lambda _t, c, _tau: tau_bands.append(c.prompts))
    result = run_predict(
        PredictSettings(
            profile=str(bundle),
            matrix=str(matrix),
            target_dir=str(TARGET),
            drafter_dir=str(DRAFTER),
            out=str(tmp_path / "out"),
            rounds=3,
            des_requests=40,
            same_prompts=same,
        )
    )
    runs = result["cells"][0]["real"]["runs"]
    if same:
        assert [r["prompt_seed"] for r in runs] == [CELL_SEED] * 3
        assert seen[0] == seen[1] == seen[2]
        distinct, words = 3, "replayed"
    else:
        assert [r["prompt_seed"] for r in runs] == [CELL_SEED, CELL_SEED + 1, CELL_SEED + 2]
        assert len({tuple(x) for x in seen}) == 3  # three samples of the workload
        distinct, words = 9, "own sample"
    ((_cell, sample),) = pooled
    assert len(sample) == distinct and len({p.prompt_id for p in sample}) == distinct
    assert {p.tokens for p in sample} == {t for x in seen for t in x}
    assert bands == [distinct]
    real = result["cells"][0]["real"]
    assert real["prompts"] == distinct and real["prompt_samples"] == (1 if same else 3)
    assert tau_bands == [distinct]  # the tau band over every prompt decoded
    assert result["summary"]["prompts_per_round"] == words
    assert result["summary"]["chance_beyond_2x_spread_unbiased"] == pytest.approx(0.02, abs=0.02)


def test_the_chance_an_unbiased_prediction_lands_beyond_twice_the_spread():
    """Monte Carlo against the closed form for 2 rounds: mean (e1 + e2) / 2 and range
    |e1 - e2| are independent normals of one variance, so P(|U| > 4 |V|) = 2 atan(1/4) / pi;
    more rounds widen the range and narrow the mean."""
    from wansim.calibrate.report import chance_beyond_spread

    two = chance_beyond_spread(2)
    assert two == pytest.approx(2 * math.atan(0.25) / math.pi, abs=0.003)
    assert chance_beyond_spread(3) < two / 4 and chance_beyond_spread(4) < 0.01


# a batched pass: 0.3 ms (first), 0.5 ms (last) + 0.08 ms a layer per request beyond the first;
# 0.6 ms per drafter pass and request beyond the first
SEQ_FIXED, SEQ_PER_LAYER, DRAFT_SEQ = {"first": 0.3, "last": 0.5}, 0.08, 0.6


def synthetic_batch_rows(cost: dict, draft: dict) -> pd.DataFrame:
    """Batched passes on the 1+5 and 5+1 pipelines, 1-4 blocks, K 2/4/7, exactly the model."""
    from wansim.stages.profiled_cost import verify_ms

    rows = []
    for split in ((1, 5), (5, 1)):
        for blocks in (1, 2, 3, 4):
            for k in (2, 4, 7):
                n = blocks * (k + 1)
                d = draft["intercept_ms"] + draft["per_draft_ms"] * k + DRAFT_SEQ * k * (blocks - 1)
                for stage, (role, layers) in enumerate(zip(("first", "last"), split, strict=True)):
                    extra = (blocks - 1) * (SEQ_FIXED[role] + SEQ_PER_LAYER * layers)
                    rows.append(
                        {
                            "pass": len(rows),
                            "stage": stage,
                            "role": role,
                            "layers": layers,
                            "blocks": blocks,
                            "n_tokens": n,
                            "k": k,
                            "bits": 32,
                            "service_ms": verify_ms(cost, role, layers, n) + extra,
                            "draft_ms": d,
                        }
                    )
    return pd.DataFrame(rows)


def test_batch_fit_recovers_the_synthetic_cost_per_request():
    cost = fit_stage_cost(synthetic_rows())
    draft = fit_drafter(pd.DataFrame({"k": [2, 4, 7], "draft_ms": [2.9, 5.3, 8.9]}))
    got = fit_batch(synthetic_batch_rows(cost, draft), cost, draft)
    assert got["sequence_ms"]["first"] == pytest.approx(0.3, abs=1e-9)
    assert got["sequence_ms"]["last"] == pytest.approx(0.5, abs=1e-9)
    assert got["sequence_ms"]["middle"] == got["sequence_ms"]["first"]
    assert got["sequence_per_layer_ms"] == pytest.approx(0.08, abs=1e-9)
    assert got["drafter_sequence_ms"] == pytest.approx(0.6, abs=1e-9)
    assert got["fit_rmse_ms"] < 1e-9 and got["blocks"] == [1, 2, 3, 4]


def test_batched_cells_carry_the_bundles_cost_per_request(tmp_path):
    batch = {
        "sequence_ms": {"first": 0.3, "middle": 0.3, "last": 0.5},
        "sequence_per_layer_ms": 0.08,
        "drafter_sequence_ms": 0.6,
    }
    b = load_bundle(make_bundle(tmp_path / "b", batch=batch))
    assert b.sequence_ms("last", 2) == pytest.approx(0.5 + 0.16)
    cell = Cell(4, 50, 2, concurrency=4, batching="continuous")
    f = Factors(compute=1.2, draft=1.5)
    raw = cell_scenario(cell, b, tmp_path / "c", f, des_requests=40)
    # 6 layers on 4 stages: 2, 2, 1, 1 (the runner's even split)
    want = [0.3 + 0.16, 0.3 + 0.16, 0.3 + 0.08, 0.5 + 0.08]
    assert raw["model"]["stage_sequence_ms"] == pytest.approx(want)
    assert raw["model"]["host_cpu_factor"] == 1.2  # which scales them in the engines
    assert raw["drafter"]["sequence_ms"] == pytest.approx(0.6 * 1.5)
    one = cell_scenario(Cell(4, 50, 2, concurrency=4), b, tmp_path / "d", f, des_requests=40)
    assert "stage_sequence_ms" not in one["model"]  # no batched pass: nothing to pay
    old = load_bundle(make_bundle(tmp_path / "old"))  # a bundle without ``batch``: 0
    raw = cell_scenario(cell, old, tmp_path / "e", f, des_requests=40)
    assert raw["model"]["stage_sequence_ms"] == [0.0] * 4 and raw["drafter"]["sequence_ms"] == 0


def test_a_damaged_batch_entry_is_one_input_error(tmp_path):
    batch = {
        "sequence_ms": {"first": 0.3, "middle": "x", "last": 0.5},
        "sequence_per_layer_ms": 0.08,
        "drafter_sequence_ms": 0.6,
    }
    with pytest.raises(WansimInputError) as err:
        load_bundle(make_bundle(tmp_path / "b", batch=batch))
    assert "batch.sequence_ms.middle: must be a finite number" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "stages, cores, concurrency, schedule, noted",
    [
        (4, 2, 4, {}, True),  # 4 stage processes on 2 cores, 4 passes in flight
        (4, 2, 1, {}, False),  # one pass in flight: nothing overlaps
        (4, None, 4, {}, False),  # no shared host
        (2, 2, 4, {}, False),  # a process per core
        (4, 2, 1, {"kind": "async", "max_inflight_blocks": 2}, True),  # blocks in flight
        (4, 2, 4, {"batching": "continuous"}, False),  # one batch: one pass in flight
    ],
)
def test_a_cell_on_an_oversubscribed_host_is_said_to_be_outside_the_model(
    stages, cores, concurrency, schedule, noted
):
    """The engines do not model a host whose stage processes outnumber its cores while several
    passes are in flight (docs/calibrate.md, Run Z): the cell says so in one line, and the
    report carries it once however many rounds repeat it."""
    from wansim.calibrate.predict import oversubscribed_host
    from wansim.calibrate.report import _unmodelled_words
    from wansim.config.scenario import load_scenario

    data = {
        "stages": stages,
        "model": {"host_cores": cores},
        "workload": {"requests": 8, "concurrency": concurrency},
        "schedule": schedule,
        "drafter": {"placement": "first_stage", "kind": "draft_model"},
    }
    note = oversubscribed_host(load_scenario(data=data))
    assert (note is not None) == noted
    if noted:
        assert note.startswith(f"oversubscribed host: {stages} stage processes on {cores} cores")
        assert _unmodelled_words([note]) == "; oversubscribed host"
