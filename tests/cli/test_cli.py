"""The command line: JSON contract, readable table, outputs, traces."""

from __future__ import annotations

import json

import pytest

from tests.conftest import NO_SPEC, PROFILE, REFERENCE, ROOT
from wansim.results.metric_names import METRICS


def test_run_analytical_json_contract(run_cli):
    code, out, err = run_cli("run", REFERENCE, "--engine", "analytical", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["scenario"] == "v4pro-dspark-10stage-wan" and data["engine"] == "analytical"
    for name in METRICS:
        if name != "tokens_per_s_ci95":
            assert name in data["metrics"], name
    assert len(data["metrics"]["stage_utilization"]) == 10


def test_speed_up_from_set_policy_none(run_cli):
    _, out, _ = run_cli("run", REFERENCE, "--engine", "analytical", "--json")
    spec = json.loads(out)["metrics"]["tokens_per_s"]
    _, out, _ = run_cli(
        "run", REFERENCE, "--engine", "analytical", "--json", "--set", "speculation.policy=none"
    )
    plain = json.loads(out)["metrics"]["tokens_per_s"]
    _, out, _ = run_cli("run", NO_SPEC, "--engine", "analytical", "--json")
    assert json.loads(out)["metrics"]["tokens_per_s"] == plain
    assert 4.0 < spec / plain < 6.0


def test_readable_table_and_out_dir(run_cli, tmp_path):
    code, out, _ = run_cli("run", REFERENCE, "--out", tmp_path / "o")
    assert code == 0 and "tokens_per_s" in out and "tok/s" in out
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["engine"] == "analytical"
    assert "tokens_per_s" in (tmp_path / "o" / "table.txt").read_text()


def test_the_readable_table_says_how_far_an_analytical_answer_is_trusted(run_cli):
    """Under the table, the analytical answer's trust as its JSON has it: the reference is
    validated with its band; a tcp ring with two requests is NOT validated, says why, and
    gives its window range (every window cold .. open), the same numbers as --json."""
    code, out, _ = run_cli("run", REFERENCE, "--engine", "analytical")
    assert code == 0 and "analytical: sync, validated (tokens_per_s within 3%" in out
    tcp = ROOT / "scenarios" / "tcp-ring-frame-per-lap.yaml"
    args = ("run", tcp, "--engine", "analytical", "--set", "workload.concurrency=2")
    code, out, _ = run_cli(*args)
    assert code == 0 and "analytical: concurrent, NOT validated: transport tcp beyond" in out
    line = next(x for x in out.splitlines() if x.startswith("  range tokens_per_s: "))
    low, high = (float(v) for v in line.split(": ")[1].split(" .. "))
    _, js, _ = run_cli(*args, "--json")
    want = json.loads(js)["approximation"]["range"]["tokens_per_s"]
    assert (low, high) == pytest.approx(want, rel=1e-3) and low < high / 4


def test_traces_show(run_cli):
    code, out, _ = run_cli("traces", "show", PROFILE)
    assert code == 0 and "math" in out and "chat" in out
    row7 = next(line for line in out.splitlines() if line.startswith("7 "))
    math7 = float(row7.split()[1])
    assert 4.9 <= math7 <= 5.3


def test_traces_show_missing_file(run_cli, tmp_path):
    code, _, err = run_cli("traces", "show", tmp_path / "nope.yaml")
    assert code == 2 and "file not found" in err
