"""The DES on the command line, and its Perfetto timeline."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from tests.conftest import REFERENCE
from wansim.config.scenario import load_scenario
from wansim.errors import WansimInputError
from wansim.sim import simulate
from wansim.sim.perfetto import write_perfetto


def test_run_both_prints_engines_side_by_side(run_cli):
    code, out, err = run_cli("run", REFERENCE, "--engine", "both")
    assert code == 0 and err == ""
    header = out.splitlines()[1]
    assert "des" in header and "analytical" in header and "des vs analytical" in header
    row = next(line for line in out.splitlines() if line.startswith("tokens_per_s "))
    assert row.rstrip().endswith("%")
    assert any(line.startswith("tokens_per_s_ci95") for line in out.splitlines())


def test_run_both_json_agrees_within_the_interval(run_cli):
    code, out, _ = run_cli("run", REFERENCE, "--engine", "both", "--json")
    data = json.loads(out)
    assert code == 0 and data["engine"] == "both"
    lo, hi = data["des"]["tokens_per_s_ci95"]
    assert lo <= data["analytical"]["tokens_per_s"] <= hi
    assert len(data["des"]["stage_utilization"]) == 10


def test_perfetto_file_parses_and_slices_add_up_to_utilisation(run_cli, tmp_path):
    path = tmp_path / "trace.json"
    code, out, _ = run_cli(
        "run",
        REFERENCE,
        "--engine",
        "des",
        "--json",
        "--perfetto",
        path,
        "--set",
        "workload.requests=4",
    )
    assert code == 0
    metrics = json.loads(out)["metrics"]
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    stage_tracks = {tid: n for (pid, tid), n in names.items() if pid == 1}
    link_tracks = {tid: n for (pid, tid), n in names.items() if pid == 2}
    assert sorted(stage_tracks.values()) == sorted(f"S{i}" for i in range(10))
    assert len(link_tracks) == 10 and "S9->S0 (return)" in link_tracks.values()
    busy = defaultdict(float)
    for e in events:
        if e["ph"] == "X" and e["pid"] == 1:
            busy[e["tid"]] += e["dur"]
    makespan_us = doc["otherData"]["makespan_ms"] * 1e3
    for i, u in enumerate(metrics["stage_utilization"]):
        assert busy[i] / makespan_us == pytest.approx(u, rel=1e-9)
    transfers = [e for e in events if e["ph"] == "X" and e["pid"] == 2]
    assert transfers and all(e["name"].startswith("r") for e in transfers)
    begins = sum(e["ph"] == "b" for e in events)
    assert begins == sum(e["ph"] == "e" for e in events) == len(transfers)


def test_perfetto_needs_a_timeline_and_the_des(run_cli, tmp_path):
    result = simulate(load_scenario(REFERENCE, ["workload.requests=1"]))
    assert result.details["timeline"] is None
    with pytest.raises(WansimInputError, match="timeline"):
        write_perfetto(result, tmp_path / "x.json")
    code, out, err = run_cli("run", REFERENCE, "--perfetto", tmp_path / "x.json")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "overrides",
    [
        # async bets on a chain's drafts: the DES refuses it with trees
        [
            "drafter.placement=first_stage",
            "drafter.kind=draft_model",
            "schedule.kind=async",
            "speculation.policy=tree",
        ],
    ],
)
def test_options_the_des_cannot_honour_exit_2_with_one_line(run_cli, overrides):
    sets = [a for o in overrides for a in ("--set", o)]
    code, out, err = run_cli("run", REFERENCE, "--engine", "des", *sets)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "schedule.kind" in lines[0] and "DES" in lines[0]
