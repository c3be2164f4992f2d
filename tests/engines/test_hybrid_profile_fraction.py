"""``schedule.hybrid_confident_fraction: profile``: the confident fraction per workload, read
from the acceptance profile's workload row (wansim/speculation/hybrid_rounds.py
``confident_fraction``, the one resolution both engines use). The profile is written here; its
fractions are test values, not measurements."""

from __future__ import annotations

import pytest
import yaml

from wansim.acceptance.profile import load_profile, profile_to_mapping
from wansim.analytical import analyze
from wansim.cli import main
from wansim.config.scenario import load_scenario
from wansim.errors import ProfileError, ScenarioError
from wansim.sim import simulate
from wansim.speculation.hybrid_rounds import confident_fraction

FIELD = "schedule.hybrid_confident_fraction"


def row(fraction=None) -> dict:
    body = {"per_position": [0.85, 0.8, 0.75], "sibling_logit_offsets": [1.0]}
    if fraction is not None:
        body["hybrid_confident_fraction"] = fraction
    return body


@pytest.fixture
def profile_path(tmp_path):
    path = tmp_path / "prof.yaml"
    data = {
        "format": "wansim-profile/1",
        "k": 3,
        "source": "fitted",
        "workloads": {"code": row(0.8), "chat": row(0.3), "math": row()},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def case(profile, p, workload=None) -> dict:
    acceptance = {"profile": str(profile)}
    if workload is not None:
        acceptance["workload"] = workload
    return {
        "stages": 4,
        "seed": 5,
        "network": {"latency_ms": 10, "jitter": {"kind": "normal", "std_ms": 1}},
        "drafter": {
            "kind": "ngram",
            "placement": "first_stage",
            "draft_ms": 2.0,
            "acceptance": acceptance,
        },
        "speculation": {
            "policy": "chain",
            "k": 3,
            "tree": {"kind": "static", "branching": [2, 2, 1]},
        },
        "schedule": {"kind": "async", "max_inflight_blocks": 3, "hybrid_confident_fraction": p},
        "workload": {"requests": 12, "prompt_tokens": 32, "output_tokens": 301},
    }


@pytest.mark.parametrize(
    ("p", "workload", "expected"),
    [
        (0.45, "code", 0.45),  # a number wins over the row
        ("profile", "code", 0.8),
        ("profile", "chat", 0.3),
        ("profile", None, 0.8),  # no workload named: the profile's first
        (None, "code", None),  # hybrid off
    ],
)
def test_resolution(profile_path, p, workload, expected):
    sc = load_scenario(data=case(profile_path, p, workload))
    assert confident_fraction(sc) == expected


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (lambda path: case(path, "profile", "math"), "'math' has no hybrid_confident_fraction"),
        (
            lambda path: {
                **case(path, "profile"),
                "drafter": {
                    "kind": "ngram",
                    "placement": "first_stage",
                    "acceptance": {"alpha": 0.8, "sibling_logit_offsets": [1.0]},
                },
            },
            "needs an acceptance profile",
        ),
        (
            lambda path: {
                **case(path, "profile", "code"),
                "workload": {
                    "requests": 12,
                    "prompt_tokens": 32,
                    "output_tokens": 301,
                    "mix": [{"workload": "code", "share": 0.5}, {"workload": "chat", "share": 0.5}],
                },
            },
            "workload.mix",
        ),
        (lambda path: case(path, "measured", "code"), "must be a number or one of profile"),
        (lambda path: case(path, True, "code"), "must be a number or one of profile"),
    ],
    ids=["row-without-value", "no-profile", "mix", "other-word", "bool"],
)
def test_unresolvable_is_one_line_naming_the_field(profile_path, data, words):
    with pytest.raises(ScenarioError) as info:
        load_scenario(data=data(profile_path))
    msg = str(info.value)
    assert msg.startswith(FIELD) and words in msg and "\n" not in msg


def test_cli_exits_2_with_one_line(profile_path, tmp_path, capsys):
    scenario = tmp_path / "sc.yaml"
    scenario.write_text(yaml.safe_dump(case(profile_path, "profile", "math")))
    assert main(["run", str(scenario)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {FIELD}") and "\n" not in err


@pytest.mark.parametrize(("workload", "number"), [("code", 0.8), ("chat", 0.3)])
def test_both_engines_read_the_row_as_the_number(profile_path, workload, number):
    """The DES run to the bit and the analytical metrics exactly equal the run with the row's
    number written in the scenario; and the two workloads' rows give different rings."""
    by_row = load_scenario(data=case(profile_path, "profile", workload))
    by_number = load_scenario(data=case(profile_path, number, workload))
    assert simulate(by_row).metrics == simulate(by_number).metrics
    assert analyze(by_row).metrics == analyze(by_number).metrics


def test_the_rows_change_the_result(profile_path):
    code = analyze(load_scenario(data=case(profile_path, "profile", "code"))).metrics
    chat = analyze(load_scenario(data=case(profile_path, "profile", "chat"))).metrics
    assert code["tokens_per_s"] != chat["tokens_per_s"]


def test_profile_keeps_the_row_value(profile_path):
    out = profile_to_mapping(load_profile(profile_path))
    assert out["workloads"]["code"]["hybrid_confident_fraction"] == 0.8
    assert "hybrid_confident_fraction" not in out["workloads"]["math"]


def test_row_value_out_of_range_names_it(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"k": 3, "workloads": {"code": row(1.5)}}))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert "workloads.code.hybrid_confident_fraction" in str(info.value)
