"""Scenario loading, overrides and strict validation: every bad input is exit 2 + one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import NO_SPEC, REFERENCE, ROOT
from wansim.config.scenario import Scenario, load_scenario, scenario_to_dict
from wansim.errors import ScenarioError


def test_defaults_are_complete():
    sc = load_scenario(data={})
    assert isinstance(sc, Scenario)
    assert sc.stages == 10 and sc.speculation.k == 7 and sc.payload.activation_bits == 16
    assert sc.drafter.acceptance.source == "alpha"


def test_reference_scenario_loads_and_resolves_profile():
    sc = load_scenario(REFERENCE)
    assert sc.name == "v4pro-dspark-10stage-wan"
    assert sc.drafter.acceptance.profile.endswith("traces/reference/dspark-v4pro.yaml")
    assert len(sc.resolved_hops()) == 10


def test_extends_merges_over_the_base():
    sc = load_scenario(NO_SPEC)
    assert sc.speculation.policy == "none" and sc.stages == 10
    assert sc.network.jitter.kind == "lognormal"


def test_partial_mapping_keeps_defaults():
    sc = load_scenario(data={"network": {"jitter": {"kind": "normal", "std_ms": 2}}})
    assert sc.network.latency_ms == 25 and sc.network.jitter.std_ms == 2


def test_overrides_are_typed_and_validated():
    sc = load_scenario(
        REFERENCE, ["speculation.k=5", "network.latency_ms=80", "speculation.policy=none"]
    )
    assert sc.speculation.k == 5 and sc.network.latency_ms == 80.0 and sc.k == 0
    sc = load_scenario(
        data={"stages": 3, "network": {"hops": [{}, {}, {}]}},
        overrides=["network.hops[1].latency_ms=7"],
    )
    assert [h.latency_ms for h in sc.resolved_hops()] == [25, 7, 25]
    sc = load_scenario(
        data={}, overrides={"drafter.acceptance.per_position": [0.9, 0.8, 0.7], "speculation.k": 3}
    )
    assert sc.drafter.acceptance.per_position == (0.9, 0.8, 0.7)


def test_round_trip_through_plain_data():
    sc = load_scenario(REFERENCE)
    assert load_scenario(data=scenario_to_dict(sc)) == sc


BAD = [
    # (overrides, field path named, fragment of the problem)
    (["network.latency_ms=-5"], "network.latency_ms", "must be >= 0"),
    (["network.bandwidth_mbps=0"], "network.bandwidth_mbps", "must be > 0"),
    (
        ["payload.activation_bits=5"],
        "payload.activation_bits",
        "must be one of 3 | 4 | 8 | 16 | 32",
    ),
    (["speculation.k=0"], "speculation.k", "must be >= 1"),
    (["speculation.k=2.5"], "speculation.k", "must be an integer"),
    (["stages=ten"], "stages", "must be an integer"),
    (["network.jitter.kind=lognormall"], "network.jitter.kind", "must be one of"),
    (["network.latencyms=5"], "network.latencyms", "unknown key"),
    (["drafter.kindd=mtp"], "drafter.kindd", "unknown key"),
    (["network.hops=[{latency_ms: 1}, {latency_ms: 2}]"], "network.hops", "needs 10 entries"),
    (
        ["drafter.acceptance.profile=traces/nope.yaml"],
        "drafter.acceptance.profile",
        "file not found",
    ),
    (["drafter.acceptance.workload=poetry"], "drafter.acceptance.workload", "not in profile"),
    (["speculation.k=9"], "speculation.k", "profile measured positions 1..7"),
    (["network.loss_rate=1.0"], "network.loss_rate", "must be <= 0.99"),
    (["drafter.acceptance.domain_shift=0"], "drafter.acceptance.domain_shift", "must be > 0"),
    (["workload.output_tokens=1"], "workload.output_tokens", "must be >= 2"),
    (["drafter.parallel=maybe"], "drafter.parallel", "must be true or false"),
    (
        ["network.jitter.std_ms=4", "network.jitter.kind=none"],
        "network.jitter.std_ms",
        "needs a jitter kind",
    ),
    (
        ["model.compute={kind: table, points: [[4, 1.0], [2, 2.0]]}"],
        "model.compute.points",
        "increasing",
    ),
    (["model.compute.kind=quantum"], "model.compute.kind", "must be one of"),
    # one mapping naming two sources (a --set of one source replaces the other: test_input_edges)
    (
        ['drafter.acceptance={"alpha": 0.8, "per_position": [0.9]}'],
        "drafter.acceptance",
        "only one of",
    ),
]


@pytest.mark.parametrize("overrides, path, fragment", BAD)
def test_bad_input_names_field_value_and_rule(overrides, path, fragment):
    with pytest.raises(ScenarioError) as err:
        load_scenario(REFERENCE, overrides)
    text = str(err.value)
    assert text.startswith(path + ":"), text
    assert fragment in text and ", got " in text and "\n" not in text


@pytest.mark.parametrize("overrides, path, fragment", BAD[:6])
def test_cli_exits_2_with_one_line(run_cli, overrides, path, fragment):
    args = ["validate", REFERENCE]
    for o in overrides:
        args += ["--set", o]
    code, out, err = run_cli(*args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and path in err and fragment in err


def test_bad_yaml_and_missing_file(run_cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [1,\n")
    code, _, err = run_cli("validate", bad)
    assert code == 2 and "not valid YAML" in err and err.count("\n") == 1
    code, _, err = run_cli("validate", tmp_path / "missing.yaml")
    assert code == 2 and "file not found" in err
    code, _, err = run_cli("validate", REFERENCE, "--set", "nonsense")
    assert code == 2 and "--set" in err


def test_no_traceback_from_a_real_process(tmp_path):
    """The installed entry point: exit 2, one line, no traceback."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "wansim",
            "run",
            str(REFERENCE),
            "--set",
            "network.hops[3].bandwidth_mbps=-5",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    # the rule itself (hop 3 materialised from the globals, then its bandwidth checked), not
    # a complaint that the reference's hops list is empty
    assert proc.stderr == "error: network.hops[3].bandwidth_mbps: must be > 0, got -5\n"


def test_hop_override_validation():
    raw = {"stages": 2, "network": {"hops": [{"bandwidth_mbps": -5}, {}]}}
    with pytest.raises(
        ScenarioError, match=r"^network.hops\[0\].bandwidth_mbps: must be > 0, got -5$"
    ):
        load_scenario(data=raw)


def test_empirical_jitter_file(tmp_path):
    samples = tmp_path / "rtt.txt"
    samples.write_text("# one-way extra delay, ms\n1.0\n2.5\n\n0.5\n")
    sc = load_scenario(
        data={"network": {"jitter": {"kind": "empirical", "samples_file": str(samples)}}}
    )
    assert sc.network.jitter.samples_file == str(samples.resolve())
    with pytest.raises(ScenarioError, match="samples_file: file not found"):
        load_scenario(
            data={"network": {"jitter": {"kind": "empirical", "samples_file": "nope.txt"}}}
        )
