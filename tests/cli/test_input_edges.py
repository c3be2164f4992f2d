"""Edges of the input: unwritable outputs, empty files, ``extends`` and acceptance switching,
numbers like 1e3, per-hop / per-stage overrides and their precedence (README: "Overrides,
sweeps and per-stage lists"). Bad input: exit 2, one line."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from tests.conftest import PROFILE, REFERENCE, strict_loads
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError, WansimInputError

FAST = ["--set", "workload.requests=1", "--set", "workload.output_tokens=20"]


def one_line_error(code: int, err: str) -> str:
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- outputs
def test_unwritable_outputs_exit_2_one_line(run_cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = run_cli("run", REFERENCE, "--out", blocker / "o")
    assert "--out" in one_line_error(code, err) and str(blocker) in err
    code, _, err = run_cli("run", REFERENCE, "--out", blocker)
    assert "is a file, not a folder" in one_line_error(code, err)
    code, _, err = run_cli(
        "run", REFERENCE, "--engine", "des", "--perfetto", blocker / "t.json", *FAST
    )
    assert "--perfetto" in one_line_error(code, err)
    code, _, err = run_cli("run", REFERENCE, "--engine", "des", "--perfetto", tmp_path, *FAST)
    assert "is a folder, not a file" in one_line_error(code, err)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(REFERENCE), "grid": {"speculation.k": [3]}}))
    code, _, err = run_cli("sweep", sweep, "--out", blocker / "o", "--quiet")
    assert "--out" in one_line_error(code, err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")
def test_read_only_folder(run_cli, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        code, _, err = run_cli("run", REFERENCE, "--out", ro / "o")
        assert "--out" in one_line_error(code, err)
    finally:
        ro.chmod(0o700)


def test_perfetto_checked_file_is_not_left_behind(run_cli, tmp_path):
    from wansim.results.output_paths import writable_file

    target = tmp_path / "new" / "t.json"
    writable_file(target, "--perfetto")
    assert not target.parent.exists()  # checked, nothing created


# ----------------------------------------------------------------------------- scenario files
def test_empty_scenario_file_exit_2(run_cli, tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    code, _, err = run_cli("run", empty)
    assert "the file is empty" in one_line_error(code, err)
    explicit = tmp_path / "defaults.yaml"
    explicit.write_text("{}\n")
    assert load_scenario(explicit).stages == 10  # {} asks for the defaults


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_sweep_file_given_as_a_scenario_names_wansim_sweep(run_cli, command, tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(REFERENCE), "grid": {"speculation.k": [3]}}))
    code, _, err = run_cli(command, sweep)
    assert err.startswith("error: base: a sweep file") and "wansim sweep" in one_line_error(
        code, err
    )


def test_extends_resolves_against_the_file_that_says_it(tmp_path, monkeypatch):
    """base.yaml in a/ names its profile relative to a/; child.yaml in b/ extends ../a/base.yaml;
    run from a third folder: both the base and the base's profile are found."""
    a, b, elsewhere = tmp_path / "a", tmp_path / "b", tmp_path / "elsewhere"
    for d in (a, b, elsewhere):
        d.mkdir()
    (a / "prof.yaml").write_text(PROFILE.read_text())
    (a / "base.yaml").write_text(
        yaml.safe_dump(
            {"stages": 4, "drafter": {"acceptance": {"profile": "prof.yaml", "workload": "code"}}}
        )
    )
    (b / "child.yaml").write_text(yaml.safe_dump({"extends": "../a/base.yaml", "stages": 3}))
    monkeypatch.chdir(elsewhere)
    sc = load_scenario("../b/child.yaml")
    assert sc.stages == 3
    assert sc.drafter.acceptance.profile == str((a / "prof.yaml").resolve())
    assert sc.drafter.acceptance.workload == "code"
    # a base that exists only relative to the working directory is not taken
    (elsewhere / "base2.yaml").write_text("stages: 2\n")
    (b / "child2.yaml").write_text("extends: base2.yaml\n")
    with pytest.raises(ScenarioError, match=r"^extends: file not found"):
        load_scenario(b / "child2.yaml")


def test_extending_file_switches_acceptance_from_profile_to_alpha(tmp_path, run_cli):
    child = tmp_path / "alpha.yaml"
    child.write_text(
        yaml.safe_dump({"extends": str(REFERENCE), "drafter": {"acceptance": {"alpha": 0.7}}})
    )
    acc = load_scenario(child).drafter.acceptance
    assert (acc.alpha, acc.profile, acc.workload) == (0.7, None, None)
    assert acc.domain_shift == load_scenario(REFERENCE).drafter.acceptance.domain_shift
    # keys that are not a source still merge: only the workload changes here
    chat = tmp_path / "chat.yaml"
    chat.write_text(
        yaml.safe_dump({"extends": str(REFERENCE), "drafter": {"acceptance": {"workload": "chat"}}})
    )
    acc = load_scenario(chat).drafter.acceptance
    assert acc.workload == "chat" and acc.profile.endswith("dspark-v4pro.yaml")
    # the same rule for --set
    acc = load_scenario(REFERENCE, ["drafter.acceptance.alpha=0.6"]).drafter.acceptance
    assert (acc.alpha, acc.profile, acc.workload) == (0.6, None, None)
    code, out, err = run_cli("run", child, "--json")
    assert code == 0, err
    alpha_run = strict_loads(out)["metrics"]["tau"]
    code, out, _ = run_cli("run", REFERENCE, "--json", "--set", "drafter.acceptance.alpha=0.7")
    assert strict_loads(out)["metrics"]["tau"] == alpha_run


def test_exponent_numbers_parse_as_numbers(run_cli, tmp_path):
    sc = load_scenario(REFERENCE, ["network.bandwidth_mbps=1e3", "network.latency_ms=2.5E1"])
    assert sc.network.bandwidth_mbps == 1000.0 and sc.network.latency_ms == 25.0
    assert load_scenario(REFERENCE) == load_scenario(
        REFERENCE, ["network.bandwidth_mbps=1e3"]
    )  # the reference's 1000 Mbit/s
    f = tmp_path / "s.yaml"
    f.write_text(f"extends: {REFERENCE}\nnetwork: {{bandwidth_mbps: 1e4}}\n")
    assert load_scenario(f).network.bandwidth_mbps == 1e4


# ----------------------------------------------------------------------------- jitter
def test_pareto_jitter_takes_std_not_mean():
    sc = load_scenario(REFERENCE, ['network.jitter={"kind": "pareto", "std_ms": 3, "shape": 3}'])
    assert sc.network.jitter.std_ms == 3
    from wansim.links.expected_delay import jitter_dist

    # README: the mean that follows from std_ms and shape (Lomax: sd = mean * sqrt(k/(k-2)))
    assert jitter_dist(sc.network.jitter).mean() == pytest.approx(3 * (1 / 3) ** 0.5)
    with pytest.raises(ScenarioError, match=r"^network\.jitter\.mean_ms: is not used by pareto"):
        load_scenario(REFERENCE, ['network.jitter={"kind": "pareto", "mean_ms": 3, "std_ms": 3}'])


def test_lognormal_jitter_adds_its_mean_which_defaults_to_its_std():
    """README and the Jitter docstring: lognormal J >= 0, mean mean_ms (default std_ms), so it
    adds mean_ms to every hop's delay: the reference's std_ms 3 adds 3 ms per hop."""
    from wansim.links.expected_delay import jitter_dist

    ref = load_scenario(REFERENCE)
    dist = jitter_dist(ref.network.jitter)
    assert dist.mean() == pytest.approx(3.0)
    none = load_scenario(REFERENCE, ['network.jitter={"kind": "none"}'])
    from wansim.analytical import analyze

    lap_ref = analyze(ref).metrics["lap_ms_mean"]
    lap_none = analyze(none).metrics["lap_ms_mean"]
    assert lap_ref - lap_none == pytest.approx(3.0 * ref.stages, rel=0.02)
    half = load_scenario(REFERENCE, ["network.jitter.mean_ms=1.5"])
    assert jitter_dist(half.network.jitter).mean() == pytest.approx(1.5)


# ----------------------------------------------------------------------------- per hop / stage
def test_hop_index_on_empty_hops_materialises_every_hop_from_the_globals(run_cli):
    sc = load_scenario(REFERENCE, ["network.hops[3].latency_ms=80"])
    hops = sc.resolved_hops()
    assert len(sc.network.hops) == 10
    assert [h.latency_ms for h in hops] == [25.0] * 3 + [80.0] + [25.0] * 6
    assert all(h.bandwidth_mbps == 1000.0 and h.jitter == sc.network.jitter for h in hops)
    code, out, err = run_cli("run", REFERENCE, "--json", "--set", "network.hops[3].latency_ms=80")
    assert code == 0, err
    _, base, _ = run_cli("run", REFERENCE, "--json")
    extra = (
        strict_loads(out)["metrics"]["lap_ms_mean"] - strict_loads(base)["metrics"]["lap_ms_mean"]
    )
    assert extra == pytest.approx(55.0, rel=1e-6)


def test_stage_index_on_empty_stage_compute_copies_model_compute():
    sc = load_scenario(REFERENCE, ["model.stage_compute[0].base_ms=12"])
    models = sc.stage_compute_models()
    assert models[0].base_ms == 12 and all(m == sc.model.compute for m in models[1:])


def test_global_field_shadowed_by_every_hop_is_an_error(run_cli, tmp_path):
    hops = [{"latency_ms": 10}] * 10
    f = tmp_path / "hops.yaml"
    f.write_text(yaml.safe_dump({"extends": str(REFERENCE), "network": {"hops": hops}}))
    code, _, err = run_cli("run", f, "--set", "network.latency_ms=50")
    assert "network.latency_ms: has no effect: every entry of network.hops sets" in (
        one_line_error(code, err)
    )
    # a field the hops leave to the globals still works
    assert load_scenario(f, ["network.bandwidth_mbps=10"]).resolved_hops()[0].bandwidth_mbps == 10
    # stage_compute shadows model.compute
    g = tmp_path / "stages.yaml"
    g.write_text(
        yaml.safe_dump(
            {
                "extends": str(REFERENCE),
                "model": {"stage_compute": [{"kind": "linear", "base_ms": 5}] * 10},
            }
        )
    )
    with pytest.raises(ScenarioError, match=r"^model\.compute\.base_ms: has no effect"):
        load_scenario(g, ["model.compute.base_ms=9"])
    # and in a sweep: one line before anything runs
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {"base": str(f), "engine": "analytical", "grid": {"network.latency_ms": [5, 50]}}
        )
    )
    code, _, err = run_cli("sweep", sweep, "--out", tmp_path / "o", "--quiet")
    assert "has no effect" in one_line_error(code, err)


def test_stages_resize_uniform_per_stage_lists_and_reject_differing_ones(tmp_path):
    f = tmp_path / "uniform.yaml"
    f.write_text(
        yaml.safe_dump({"extends": str(REFERENCE), "network": {"hops": [{"latency_ms": 10}] * 10}})
    )
    sc = load_scenario(f, ["stages=4"])
    assert [h.latency_ms for h in sc.resolved_hops()] == [10.0] * 4
    # stages is applied first, so a hop index set with it materialises the new count
    sc = load_scenario(REFERENCE, ["network.hops[3].latency_ms=80", "stages=4"])
    assert [h.latency_ms for h in sc.resolved_hops()] == [25.0, 25.0, 25.0, 80.0]
    g = tmp_path / "differing.yaml"
    g.write_text(
        yaml.safe_dump(
            {
                "extends": str(REFERENCE),
                "network": {"hops": [{"latency_ms": 10 + i} for i in range(10)]},
            }
        )
    )
    with pytest.raises(WansimInputError, match=r"^network\.hops: needs 4 entries"):
        load_scenario(g, ["stages=4"])


def test_sweep_over_hop_fields_and_stages_with_per_stage_lists(run_cli, tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "base": str(REFERENCE),
                "engine": "analytical",
                "grid": {"network.hops[2].latency_ms": [5, 80], "stages": [4, 10]},
            }
        )
    )
    out = tmp_path / "o"
    code, _, err = run_cli("sweep", sweep, "--out", out, "--quiet")
    assert code == 0, err
    import pandas as pd

    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == 4
    for stages, g in table.groupby("stages"):
        lap = g.set_index("network.hops[2].latency_ms")["lap_ms_mean"]
        assert lap[80] - lap[5] == pytest.approx(75.0, rel=1e-6), stages
        direct = load_scenario(REFERENCE, [f"stages={stages}", "network.hops[2].latency_ms=80"])
        from wansim.analytical import analyze

        assert lap[80] == pytest.approx(analyze(direct).metrics["lap_ms_mean"], rel=1e-9)
    # per-stage compute, swept on a DES sweep (one point per value)
    sweep.write_text(
        yaml.safe_dump(
            {
                "base": str(REFERENCE),
                "engine": "des",
                "grid": {"model.stage_compute[1].base_ms": [6.0, 26.0]},
                "set": {
                    "workload.requests": 2,
                    "workload.output_tokens": 20,
                    "network.jitter": {"kind": "none"},
                },
            }
        )
    )
    code, _, err = run_cli("sweep", sweep, "--out", tmp_path / "des", "--quiet")
    assert code == 0, err
    table = pd.read_parquet(tmp_path / "des" / "results.parquet")
    lap = table.set_index("model.stage_compute[1].base_ms")["lap_ms_mean"]
    assert lap[26.0] - lap[6.0] == pytest.approx(20.0, rel=1e-9)  # no jitter: laps are exact


def test_metrics_json_of_an_edge_run_is_strict(run_cli, tmp_path):
    code, _, err = run_cli(
        "run", REFERENCE, "--out", tmp_path / "o", "--set", "network.hops[3].latency_ms=80"
    )
    assert code == 0, err
    strict_loads((tmp_path / "o" / "metrics.json").read_text())
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["engine"] == "analytical"


LONG_NAME = "x" * 10_000  # past the file system's 255-byte name: Python 3.11 raises on lookup

FILE_FIELDS = {
    "network.trace_file": {"network": {"trace_file": LONG_NAME}},
    "drafter.acceptance.activation_quality": {
        "drafter": {"acceptance": {"alpha": 0.7, "activation_quality": LONG_NAME}}
    },
    "drafter.acceptance.profile": {"drafter": {"acceptance": {"profile": LONG_NAME}}},
    "network.jitter.samples_file": {
        "network": {"jitter": {"kind": "empirical", "samples_file": LONG_NAME}}
    },
    "model.compute.from": {"model": {"compute": {"kind": "table", "from": LONG_NAME}}},
    "extends": {"extends": LONG_NAME},
}


@pytest.mark.parametrize("field", list(FILE_FIELDS))
def test_a_file_name_too_long_to_look_up_is_a_missing_file(run_cli, tmp_path, field):
    """Fuzz seed 4546 (cases 2309, 16613): a 10,000-character file name made ``Path.is_file``
    raise OSError (ENAMETOOLONG) while the scenario's files were looked up; the CLI printed
    the whole path (10,053 characters). Now it is a file not found, named by its field."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(FILE_FIELDS[field]))
    code, _, err = run_cli("validate", scenario)
    text = one_line_error(code, err)
    assert len(text) < 400 and field in text and "not found" in text, text


UNREADABLE = "/proc/self/mem"  # a file that exists and whose read fails (EIO at offset 0)


@pytest.mark.skipif(not os.path.exists(UNREADABLE), reason="needs Linux's /proc")
@pytest.mark.parametrize(
    "named, data",
    [
        ("network.trace_file", {"network": {"trace_file": UNREADABLE}}),
        # (a profile's own errors name the profile file: "profile: ...")
        ("profile", {"drafter": {"acceptance": {"profile": UNREADABLE}}}),
        (
            "network.jitter.samples_file",
            {"network": {"jitter": {"kind": "empirical", "samples_file": UNREADABLE}}},
        ),
    ],
)
def test_a_file_that_cannot_be_read_is_one_line_naming_its_field(run_cli, tmp_path, named, data):
    """Fuzz seed 4548 case 3029: reading /proc/self/mem raised OSError (EIO) out of the
    loader. Every user file is read by one reader (``user_yaml.read_text``), which names the
    field and why."""
    with pytest.raises(WansimInputError, match=f"^{named}: cannot be read"):
        load_scenario(data=data)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    code, _, err = run_cli("validate", scenario)
    assert f"{named}: cannot be read" in one_line_error(code, err)
