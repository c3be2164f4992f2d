"""Drafter presets: resolution under explicit keys, errors, the catalog listing."""

from __future__ import annotations

import json

import pytest

from tests.conftest import PROFILE, REFERENCE
from wansim.acceptance.profile import load_profile
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario, read_scenario_raw
from wansim.errors import ScenarioError
from wansim.speculation.drafters import ASSUMED_SIBLING_OFFSETS, PRESETS


def with_preset(name: str, drafter: dict | None = None, overrides=()):
    """The reference scenario with ``drafter: {preset: name, **drafter}`` (no other keys)."""
    raw = read_scenario_raw(REFERENCE)
    raw["drafter"] = {"preset": name, **(drafter or {})}
    return load_scenario(data=raw, overrides=list(overrides), base_dir=REFERENCE.parent)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_loads_and_analyses(name):
    k = 3 if name == "mtp-v4pro" else 5
    sc = with_preset(name, overrides=[f"speculation.k={k}"])
    fields = PRESETS[name].fields
    assert sc.drafter.preset == name
    assert (sc.drafter.kind, sc.drafter.placement, sc.drafter.parallel) == (
        fields["kind"],
        fields["placement"],
        fields["parallel"],
    )
    assert sc.drafter.draft_ms == fields["draft_ms"]
    assert analyze(sc).metrics["tokens_per_s"] > 0
    tree = with_preset(
        name,
        overrides=[
            "speculation.policy=tree",
            "speculation.tree.budget_nodes=12",
            "speculation.tree.max_depth=3",
        ],
    )
    assert analyze(tree).metrics["tau"] > 1
    assert PRESETS[name].sources  # every preset says where its figures come from


def test_explicit_keys_override_the_preset():
    # keys the scenario file states win over the preset's (the reference states them all)
    ref = load_scenario(REFERENCE, ["drafter.preset=eagle3"])
    assert ref.drafter.kind == "dspark" and ref.drafter.preset == "eagle3"
    sc = with_preset("eagle3", {"draft_ms": 2.5, "acceptance": {"alpha": 0.6}})
    assert sc.drafter.kind == "eagle" and sc.drafter.draft_ms == 2.5
    assert sc.drafter.acceptance.alpha == 0.6
    # the preset's sibling model survives an explicit acceptance source
    assert sc.drafter.acceptance.sibling_logit_offsets == ASSUMED_SIBLING_OFFSETS
    # an explicit profile replaces the preset's alpha instead of clashing with it
    sc = with_preset("eagle3", {"acceptance": {"profile": str(PROFILE)}})
    assert sc.drafter.acceptance.alpha is None and sc.drafter.acceptance.profile


def test_preset_survives_a_round_trip_through_plain_data():
    from wansim.config.scenario import scenario_to_dict

    sc = with_preset("ngram")
    again = load_scenario(data=scenario_to_dict(sc))
    assert again == sc


def test_unknown_preset_lists_the_presets(run_cli):
    with pytest.raises(ScenarioError, match=r"drafter\.preset: unknown preset .*dspark-v4pro"):
        load_scenario(REFERENCE, ["drafter.preset=medusa9"])
    code, _, err = run_cli("validate", REFERENCE, "--set", "drafter.preset=medusa9")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "medusa9" in err and "ngram" in err


def test_assumed_sibling_offsets_are_the_reference_profiles():
    for wl in load_profile(PROFILE).workloads.values():
        assert wl.sibling_logit_offsets == ASSUMED_SIBLING_OFFSETS


def test_drafters_command(run_cli):
    code, out, _ = run_cli("drafters")
    assert code == 0
    for name in PRESETS:
        assert name in out
    assert "where each figure comes from" in out
    code, out, _ = run_cli("drafters", "--json")
    rows = json.loads(out)
    assert [r["preset"] for r in rows] == list(PRESETS)
    assert all(
        {"kind", "placement", "drafting", "draft_ms", "acceptance", "sources"} <= set(r)
        for r in rows
    )
