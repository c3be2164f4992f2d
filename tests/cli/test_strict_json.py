"""Every JSON the CLI prints or writes is strict RFC 8259 (no NaN/Infinity): parsed here with a
parser that rejects them, on the cases that used to produce them (one request, too few laps)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from tests.conftest import REFERENCE, strict_loads
from wansim.results import strict_json

ONE_REQUEST = ["--set", "workload.requests=1", "--set", "workload.output_tokens=200"]
# one decode token: a single lap, so no interval can be estimated (null with a reason)
ONE_LAP = ["--set", "workload.requests=1", "--set", "workload.output_tokens=2"]


def test_strict_loads_rejects_what_json_loads_accepts():
    assert json.loads("[NaN]") and json.loads("[Infinity]")
    for text in ("[NaN]", "[Infinity]", "[-Infinity]"):
        with pytest.raises(ValueError, match="not strict JSON"):
            strict_loads(text)


def test_dumps_turns_non_finite_into_null_and_refuses_leftovers():
    assert strict_loads(strict_json.dumps({"a": [float("nan"), np.float64(np.inf), 1.5]})) == {
        "a": [None, None, 1.5]
    }
    assert strict_json.non_finite_paths({"a": [1.0, float("nan")], "b": {"c": -np.inf}}) == [
        "a[1]",
        "b.c",
    ]


def test_dumps_large_writes_what_dumps_writes():
    """The large-document path (Perfetto traces) gives :func:`dumps`'s text: numpy scalars
    and arrays converted, tuples as lists, and a non-finite float written as null."""
    docs = [
        {"a": [1, 2.5, "x", None, True], "b": {"c": (np.int64(3), np.float64(0.1))}},
        {"events": [{"ts": np.float32(2.0), "args": {"n": np.arange(3)}}] * 4},
        {"a": [float("nan"), np.float64(-np.inf), 1.5]},
    ]
    for doc in docs:
        assert strict_json.dumps_large(doc) == strict_json.dumps(doc)
    assert strict_loads(strict_json.dumps_large(docs[2])) == {"a": [None, None, 1.5]}
    with pytest.raises(TypeError):
        strict_json.dumps_large({"a": object()})


def test_run_json_one_request_has_a_finite_interval(run_cli, tmp_path):
    code, out, err = run_cli("run", REFERENCE, "--engine", "both", "--json", *ONE_REQUEST)
    assert code == 0, err
    data = strict_loads(out)
    lo, hi = data["des"]["tokens_per_s_ci95"]
    assert 0 <= lo <= data["des"]["tokens_per_s"] <= hi
    # one request: its TTFT (one value) has no interval; the rate (batch means over laps) has
    assert set(data["undefined"]) == {"des"}
    assert "tokens_per_s_ci95" not in data["undefined"]["des"]
    assert all(name.endswith("_ci95") for name in data["undefined"]["des"])


def test_run_json_and_metrics_file_null_with_reason_when_undefined(run_cli, tmp_path):
    code, out, err = run_cli("run", REFERENCE, "--engine", "des", "--json", *ONE_LAP)
    assert code == 0, err
    data = strict_loads(out)
    assert data["metrics"]["tokens_per_s_ci95"] is None
    assert "fewer than two laps" in data["undefined"]["tokens_per_s_ci95"]
    out_dir = tmp_path / "o"
    code, _, err = run_cli("run", REFERENCE, "--engine", "both", "--out", out_dir, *ONE_LAP)
    assert code == 0, err
    written = strict_loads((out_dir / "metrics.json").read_text())
    assert written["des"]["tokens_per_s_ci95"] is None
    assert "fewer than two laps" in written["undefined"]["des"]["tokens_per_s_ci95"]


def test_perfetto_file_is_strict(run_cli, tmp_path):
    trace = tmp_path / "t.json"
    code, _, err = run_cli("run", REFERENCE, "--engine", "des", "--perfetto", trace, *ONE_LAP)
    assert code == 0, err
    assert strict_loads(trace.read_text())["traceEvents"]


def test_optimize_confirm_des_json_with_undefined_interval(run_cli):
    code, out, err = run_cli(
        "optimize", REFERENCE, "--over", "speculation.k=3,5", "--top", "2",
        "--confirm", "des", "--json", *ONE_LAP,
    )  # fmt: skip
    assert code == 0, err
    data = strict_loads(out)
    for row in data["top"]:
        assert row["des"]["ci95"] is None and "analytical_inside_ci95" not in row["des"]
        assert "fewer than two laps" in row["des"]["ci95_undefined"]
    code, out, err = run_cli(
        "optimize", REFERENCE, "--over", "speculation.k=3,5", "--top", "1",
        "--confirm", "des", "--json", *ONE_REQUEST,
    )  # fmt: skip
    assert code == 0, err
    (row,) = strict_loads(out)["top"]
    lo, hi = row["des"]["ci95"]
    assert 0 <= lo <= hi and isinstance(row["des"]["analytical_inside_ci95"], bool)


def test_trees_and_drafters_json(run_cli):
    code, out, err = run_cli(
        "trees", "best", "--acceptance", "0.8", "--budget-nodes", "6", "--json"
    )
    assert code == 0, err
    assert strict_loads(out)["nodes"] == 6
    code, out, err = run_cli("drafters", "--json")
    assert code == 0, err
    assert strict_loads(out)


def test_sweep_metadata_is_strict(run_cli, tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "base": str(REFERENCE),
                "engine": "des",
                "grid": {"speculation.k": [3, 5]},
                "set": {"workload.requests": 1, "workload.output_tokens": 2},
            }
        )
    )
    out = tmp_path / "o"
    code, _, err = run_cli("sweep", sweep, "--out", out, "--quiet", "--workers", "1")
    assert code == 0, err
    for path in out.rglob("*.json"):
        strict_loads(path.read_text())
    assert (out / "sweep.json").is_file()
