"""Importers: vLLM counters and SGLang accept lengths give the same profile format."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import ROOT
from wansim.acceptance import closed_form as cf
from wansim.acceptance.importers import profile_from_sglang, profile_from_vllm
from wansim.acceptance.model import AcceptanceModel
from wansim.acceptance.profile import load_profile
from wansim.acceptance.sampler import sample_requests
from wansim.config.scenario import load_scenario
from wansim.errors import ProfileError


def vllm_text(drafts: int, per_pos: list[int], engines: int = 1) -> str:
    lines = [
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
    ]
    for e in range(engines):
        lines.append(
            f'vllm:spec_decode_num_drafts_total{{engine="{e}",model_name="m"}} {drafts / engines}'
        )
        for i, c in enumerate(per_pos):
            lines.append(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",model_name="m",position="{i}"}} {c / engines}'
            )
    lines.append('vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 1.0')
    return "\n".join(lines) + "\n"


def test_vllm_counters_give_exact_rates_and_histogram():
    # hand-made: 1000 drafts, 800 accepted position 0, 600 position 1, 300 position 2
    prof = profile_from_vllm(vllm_text(1000, [800, 600, 300], engines=2))
    wl = prof.workloads["default"]
    np.testing.assert_allclose(wl.per_position, [0.8, 0.75, 0.5])
    assert wl.histogram == (200, 200, 300, 300)
    assert prof.header.k == 3 and prof.header.source == "measured"


def test_vllm_counts_from_sampled_steps_recover_rates():
    rng = np.random.default_rng(0)
    p = np.array([0.9, 0.8, 0.7, 0.6])
    accepted = (cf.survival(p)[None, :] > rng.random(50_000)[:, None]).sum(axis=1)
    counts = [int((accepted >= i + 1).sum()) for i in range(4)]
    wl = profile_from_vllm(vllm_text(len(accepted), counts)).workloads["default"]
    assert np.all(np.abs(np.array(wl.per_position) - p) < 0.01)


def test_vllm_bad_inputs():
    with pytest.raises(ProfileError, match="needs"):
        profile_from_vllm("nothing here 1\n")
    with pytest.raises(ProfileError, match="must not grow"):
        profile_from_vllm(vllm_text(100, [50, 60]))


def test_sglang_accept_lengths_round_trip(tmp_path):
    model = AcceptanceModel(rates=(0.85, 0.8, 0.75, 0.7, 0.65), sigma=0.8)
    trace = sample_requests(model, 5, np.random.default_rng(1), n_requests=400, decode_tokens=200)
    path = tmp_path / "accept.jsonl"
    with path.open("w") as f:
        for pid, group in trace.groupby("prompt_id"):
            f.write(
                json.dumps(
                    {"prompt_id": f"req-{pid}", "accept_lengths": (group.accepted + 1).tolist()}
                )
                + "\n"
            )
    prof = profile_from_sglang(path, 5)
    wl = prof.workloads["default"]
    np.testing.assert_allclose(wl.per_position, model.pooled_rates(5), atol=0.02)
    assert wl.dispersion > 0.05  # per-prompt difficulty survives the import


def test_sglang_bad_lengths(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"prompt_id": 1, "accept_lengths": [1, 9]}\n')
    with pytest.raises(ProfileError, match=r"accept_lengths\[1\]: must be an integer in 1..5"):
        profile_from_sglang(path, 4)


def test_cli_import_then_run(run_cli, tmp_path):
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(vllm_text(1000, [900, 780, 650, 520]))
    out = tmp_path / "imported.yaml"
    code, stdout, _ = run_cli(
        "traces", "import", "vllm", metrics, "--out", out, "--workload", "chat"
    )
    assert code == 0 and "tau=" in stdout
    assert load_profile(out).workloads["chat"].per_position[0] == pytest.approx(0.9)
    sc = load_scenario(
        ROOT / "scenarios" / "v4pro-dspark-10stage-wan.yaml",
        {
            "drafter.acceptance.profile": str(out),
            "drafter.acceptance.workload": "chat",
            "speculation.k": 4,
        },
    )
    code, _, _ = run_cli(
        "run",
        ROOT / "scenarios" / "v4pro-dspark-10stage-wan.yaml",
        "--set",
        f"drafter.acceptance.profile={out}",
        "--set",
        "drafter.acceptance.workload=chat",
        "--set",
        "speculation.k=4",
    )
    assert code == 0 and sc.speculation.k == 4
    code, _, err = run_cli("traces", "import", "sglang", metrics, "--out", out)
    assert code == 2 and "--k" in err


def test_cli_fit_trace(run_cli, tmp_path):
    from wansim.acceptance.trace import write_trace

    model = AcceptanceModel(rates=(0.8, 0.7, 0.6))
    write_trace(
        sample_requests(model, 3, np.random.default_rng(2), 50, 100, workload="code"),
        tmp_path / "t.csv",
        {"drafter": "d"},
    )
    code, out, _ = run_cli("traces", "fit", tmp_path / "t.csv", "--out", tmp_path / "p.yaml")
    assert code == 0 and "code" in out
    assert load_profile(tmp_path / "p.yaml").header.drafter == "d"
