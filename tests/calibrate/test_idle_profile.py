"""The cost of a pass after an idle, as ``calibrate profile`` measures it and ``calibrate
predict`` uses it (:mod:`wansim.calibrate.idle_profile`, the bundle's ``idle_cost``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.calibrate.test_predict import make_bundle
from wansim.calibrate.bundle import MANIFEST, load_bundle
from wansim.calibrate.idle_profile import fit_idle_cost, idle_pass_rows
from wansim.calibrate.matrix import Cell
from wansim.calibrate.predict import Factors, cell_scenario, predicted_components
from wansim.errors import WansimInputError

MS = 1_000_000  # ns


def test_pass_rows_by_hand():
    """Stage 0: drafting start less its previous send, and the drafting-to-send time; stage
    1: arrival less its previous send, and its pass; the first step (after the prefill) of
    each prompt has no idle of its own."""
    steps = pd.DataFrame(
        {
            "prompt_index": [0, 0, 0, 1, 1],
            "step": [0, 1, 2, 0, 1],
            "start_ns": [0, 100 * MS, 210 * MS, 1000 * MS, 1100 * MS],
            "sent_ns": [5 * MS, 106 * MS, 217 * MS, 1004 * MS, 1108 * MS],
        }
    )
    stage1 = pd.DataFrame(
        {  # a prefill, two decode passes; another prefill, one decode pass
            "pos": [0, 64, 68, 0, 64],
            "recv_ns": [0, 50 * MS, 160 * MS, 900 * MS, 1060 * MS],
            "sent_ns": [10 * MS, 53 * MS, 164 * MS, 910 * MS, 1063 * MS],
        }
    )
    rows = idle_pass_rows(steps, stage1, 20.0)
    s0 = rows[rows["stage"] == 0][["idle_ms", "work_ms"]].to_numpy().tolist()
    s1 = rows[rows["stage"] == 1][["idle_ms", "work_ms"]].to_numpy().tolist()
    assert s0 == [[95.0, 6.0], [104.0, 7.0], [96.0, 8.0]]
    assert s1 == [[107.0, 4.0]]  # only the decode pass after a decode pass
    assert set(rows["latency_ms"]) == {20.0}


def _rows(spec, rng=None):
    """Rows at each latency: (idle ms per pass, stage 0 work, stage 1 work), 10 passes each."""
    out = []
    for lat, (idle, w0, w1) in spec.items():
        for stage, w in ((0, w0), (1, w1)):
            for i in range(10):
                out.append((lat, 0, stage, idle + i - 4.5, w))
    return pd.DataFrame(out, columns=["latency_ms", "prompt_index", "stage", "idle_ms", "work_ms"])


def test_the_fit_by_hand():
    """Per latency: the mean work less the shortest latency's, averaged over the two stages,
    at the median idle; a faster pass than the warmest is clamped at 0; the reference is the
    table at the bundle's own latency's idle."""
    rows = _rows(
        {
            0.0: (5.0, 3.0, 2.0),
            5.0: (15.0, 3.1, 2.1),
            50.0: (105.0, 3.5, 2.4),
            100.0: (205.0, 2.9, 1.9),  # faster than at 0 ms: clamped
        }
    )
    fit = fit_idle_cost(rows, 5.0)
    assert fit["points"] == [[5.0, 0.0], [15.0, 0.1], [105.0, 0.45], [205.0, 0.0]]
    assert fit["reference_idle_ms"] == 15.0
    assert fit["reference_extra_ms"] == pytest.approx(0.1)
    assert fit["extra_ms_by_stage"][0] == pytest.approx([0.0, 0.1, 0.5, -0.1])
    # per role: stage 0 (drafting + pass) and stage 1 (a pass), each its own differences
    drafting, passing = fit["stages"]["drafting"], fit["stages"]["pass"]
    assert drafting["points"] == [[5.0, 0.0], [15.0, 0.1], [105.0, 0.5], [205.0, 0.0]]
    assert passing["points"] == [[5.0, 0.0], [15.0, 0.1], [105.0, 0.4], [205.0, 0.0]]
    assert passing["reference_extra_ms"] == pytest.approx(0.1)
    # at the host's idle: the hop into the stage, half its idle less the other stage's work
    # (hand-worked: stage 1 at 0 ms, (5 - 3) / 2; stage 0 at 50 ms, (105 - 2.4) / 2)
    host_draft, host_pass = fit["host"]["drafting"], fit["host"]["pass"]
    assert host_pass["points"] == [[1.0, 0.0], [5.95, 0.1], [50.75, 0.4], [101.05, 0.0]]
    assert host_draft["points"] == [[1.5, 0.0], [6.45, 0.1], [51.3, 0.5], [101.55, 0.0]]
    assert host_pass["reference_idle_ms"] == pytest.approx(5.95)
    with pytest.raises(ValueError, match="two link latencies"):
        fit_idle_cost(rows[rows["latency_ms"] == 5.0], 5.0)


IDLE = {"points": [[15.0, 0.0], [105.0, 0.4], [205.0, 0.5]], "reference_extra_ms": 0.05}


def test_the_bundle_keeps_it_and_checks_it(tmp_path):
    b = load_bundle(make_bundle(tmp_path / "b", idle=IDLE))
    assert b.idle_points == ((15.0, 0.0), (105.0, 0.4), (205.0, 0.5))
    assert b.idle_reference_extra_ms == 0.05
    assert load_bundle(make_bundle(tmp_path / "old")).idle_points is None  # older bundles
    bad = make_bundle(tmp_path / "bad", idle={**IDLE, "points": [[105.0, 0.4], [15.0, 0.0]]})
    with pytest.raises(WansimInputError) as err:
        load_bundle(bad)
    assert "idle_cost.points" in str(err.value) and "\n" not in str(err.value)
    man = yaml.safe_load((bad / MANIFEST).read_text())
    man["idle_cost"] = {**IDLE, "reference_extra_ms": "x"}
    (bad / MANIFEST).write_text(yaml.safe_dump(man))
    with pytest.raises(WansimInputError, match="reference_extra_ms"):
        load_bundle(bad)


def test_a_cell_takes_the_table_and_sheds_the_bundles_own(tmp_path):
    """The cell's scenario: the table's extras x the load factor, and every stage's fixed
    cost less the bundle's own idle cost (the reference) against the same bundle without
    it; a flat table, whose every idle costs the reference, predicts what the bundle without
    it does (both engines)."""
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario
    from wansim.sim import simulate

    cell, f = Cell(4, 20.0, 4), Factors(compute=1.3, draft=1.3, forward=1.0, back=1.0)
    with_idle = load_bundle(make_bundle(tmp_path / "idle", idle=IDLE))
    without = load_bundle(make_bundle(tmp_path / "plain"))
    a = cell_scenario(cell, with_idle, tmp_path / "a", f, des_requests=40)
    b = cell_scenario(cell, without, tmp_path / "b", f, des_requests=40)
    pooled = {"points": [[15.0, 0.0], [105.0, 0.4 * 1.3], [205.0, 0.65]]}
    assert a["model"]["stage_idle_cost"] == [pooled] * 4  # (a bundle with the pooled table)
    assert "stage_idle_cost" not in b["model"]
    diff = np.subtract(b["model"]["stage_overhead_ms"], a["model"]["stage_overhead_ms"])
    assert diff == pytest.approx([0.05] * 4, abs=1e-12)

    flat = {"points": [[0.0, 0.3]], "reference_extra_ms": 0.3}
    c = cell_scenario(
        cell, load_bundle(make_bundle(tmp_path / "flat", idle=flat)), tmp_path / "c", f
    )
    plain = load_scenario(tmp_path / "b" / "scenario.yaml")
    flat_sc = load_scenario(tmp_path / "c" / "scenario.yaml")
    assert c["model"]["stage_idle_cost"] == [{"points": [[0.0, 0.3 * 1.3]]}] * 4
    assert analyze(flat_sc).metrics["lap_ms_mean"] == pytest.approx(
        analyze(plain).metrics["lap_ms_mean"], rel=1e-9
    )
    flat_sc = load_scenario(tmp_path / "c" / "scenario.yaml", ["workload.requests=40"])
    assert simulate(flat_sc).metrics["tokens_per_s"] == pytest.approx(
        simulate(plain).metrics["tokens_per_s"], rel=1e-9
    )


def test_the_lap_parts_carry_each_stages_own_idle_cost(tmp_path):
    """The report's predicted parts: the bundle's own idle cost off, each stage's on (stage
    0's on the drafting, the first work after its idle)."""
    b = load_bundle(make_bundle(tmp_path / "b", idle=IDLE))
    cell, f = Cell(3, 20.0, 4), Factors(compute=2.0, draft=2.0, forward=1.0, back=1.0)
    base = predicted_components(cell, b, f)
    parts = predicted_components(cell, b, f, idle_extra_ms=[0.7, 0.5, 0.3])
    assert parts["draft_ms"] == pytest.approx(base["draft_ms"] + 0.7 - 0.1)
    assert np.subtract(parts["stage_service_ms"], base["stage_service_ms"]) == pytest.approx(
        [0.0, 0.4, 0.2]
    )


ROLES = {
    **IDLE,
    "stages": {
        "drafting": {"points": [[10.0, 0.0], [100.0, 1.0]], "reference_extra_ms": 0.2},
        "pass": {"points": [[20.0, 0.0], [120.0, 0.5]], "reference_extra_ms": 0.1},
    },
}


def test_stage_0_idles_into_its_drafting(tmp_path):
    """Per-role tables: a draft-model cell's stage 0 pays the drafting table and sheds its
    reference, every other stage the pass table; an MTP cell's stages (stage 0 included: its
    pipeline was profiled without drafting there) the pass table."""
    b = load_bundle(make_bundle(tmp_path / "b", idle=ROLES, mtp=True))
    plain = load_bundle(make_bundle(tmp_path / "p", mtp=True))
    f = Factors()
    for cell, first in ((Cell(3, 20.0, 4), "drafting"), (Cell(3, 20.0, 4, drafter="mtp"), "pass")):
        a = cell_scenario(cell, b, tmp_path / "a", f, des_requests=40)
        ref = cell_scenario(cell, plain, tmp_path / "r", f, des_requests=40)
        tables = [t["points"] for t in a["model"]["stage_idle_cost"]]
        want = [ROLES["stages"][first]["points"]] + [ROLES["stages"]["pass"]["points"]] * 2
        assert tables == want, cell
        held = np.subtract(ref["model"]["stage_overhead_ms"], a["model"]["stage_overhead_ms"])
        first_ref = ROLES["stages"][first]["reference_extra_ms"]
        assert held == pytest.approx([first_ref, 0.1, 0.1], abs=1e-12), cell
    bad = make_bundle(tmp_path / "bad", idle={**ROLES, "stages": {"other": IDLE}})
    with pytest.raises(WansimInputError, match=r"idle_cost\.stages"):
        load_bundle(bad)


def test_a_shared_host_cell_follows_the_hosts_idle(tmp_path):
    """A bundle with the tables at the host's idle (``idle_cost.host``) on a host of
    ``host_cores``: the cells' stages pay those tables and follow the host's idle (``model.
    idle_follows: host``); the same bundle without them, its stages' own; a bundle written
    before them fits them from its ``idle_passes.csv`` (the same fit as the profile's)."""
    host = {
        "drafting": {"points": [[5.0, 0.0], [50.0, 1.0]], "reference_extra_ms": 0.0},
        "pass": {"points": [[5.0, 0.0], [50.0, 0.8]], "reference_extra_ms": 0.0},
    }
    b = load_bundle(make_bundle(tmp_path / "h", idle={**ROLES, "host": host}))
    assert b.idle_host_roles["pass"] == (((5.0, 0.0), (50.0, 0.8)), 0.0)
    a = cell_scenario(Cell(3, 20.0, 4), b, tmp_path / "a", Factors(), des_requests=40)
    assert a["model"]["idle_follows"] == "host"
    assert [t["points"] for t in a["model"]["stage_idle_cost"]] == [
        [[5.0, 0.0], [50.0, 1.0]],
        [[5.0, 0.0], [50.0, 0.8]],
        [[5.0, 0.0], [50.0, 0.8]],
    ]
    own = load_bundle(make_bundle(tmp_path / "s", idle=ROLES))
    s = cell_scenario(Cell(3, 20.0, 4), own, tmp_path / "s_", Factors(), des_requests=40)
    assert s["model"]["idle_follows"] == "stage"
    # written before the host tables: fitted from the sweep's rows on load
    old = make_bundle(tmp_path / "old", idle=ROLES)
    rows = _rows({5.0: (15.0, 3.1, 2.1), 50.0: (105.0, 3.5, 2.4)})
    rows.to_csv(old / "idle_passes.csv", index=False)
    fitted = load_bundle(old).idle_host_roles
    assert fitted["pass"][0] == ((5.95, 0.0), (50.75, 0.3)) and "drafting" in fitted
    # a sweep of one latency cannot be fitted: one line naming the file
    rows[rows["latency_ms"] == 5.0].to_csv(old / "idle_passes.csv", index=False)
    with pytest.raises(WansimInputError, match=r"idle_passes\.csv holds no idle sweep") as err:
        load_bundle(old)
    assert "\n" not in str(err.value)
    with pytest.raises(WansimInputError, match=r"idle_cost\.host"):
        load_bundle(make_bundle(tmp_path / "bad", idle={**ROLES, "host": {"other": IDLE}}))


def test_message_rows_and_fit_by_hand():
    """Per verify pass after the first and hop: the lap less the hop's per-message cost is its
    sender's idle; the fit: per latency the mean cost less the shortest latency's, averaged
    over the two hop roles, clamped at 0, at the median idle."""
    from wansim.calibrate.idle_profile import fit_message_idle_cost, idle_message_rows

    passes = pd.DataFrame(
        {
            "kind": ["prefill", "verify", "verify", "verify"],
            "step": [np.nan, 0, 1, 2],
            "lap_ms": [np.nan, 30.0, 31.0, 29.0],
            "hop0_error_ms": [0.5, 0.4, 0.6, 0.5],
            "hop1_error_ms": [np.nan, 0.3, 0.2, np.nan],
        }
    )
    rows = idle_message_rows(passes, 20.0)
    assert rows[["role", "idle_ms", "error_ms"]].values.tolist() == [
        ["forward", 30.4, 0.6],
        ["forward", 28.5, 0.5],
        ["return", 30.8, 0.2],
    ]
    spec = {0.0: (8.0, 0.40, 0.30), 5.0: (19.0, 0.45, 0.33), 50.0: (110.0, 0.60, 0.40)}
    data = [
        (lat, 0, role, idle, cost)
        for lat, (idle, fwd, ret) in spec.items()
        for role, cost in (("forward", fwd), ("return", ret))
    ]
    fit = fit_message_idle_cost(
        pd.DataFrame(data, columns=["latency_ms", "prompt_index", "role", "idle_ms", "error_ms"]),
        5.0,
    )
    assert fit["points"] == [[8.0, 0.0], [19.0, 0.04], [110.0, 0.15]]
    assert fit["reference_extra_ms"] == pytest.approx(0.04)


MESSAGES = {**ROLES, "message": {"points": [[20.0, 0.0], [110.0, 0.2]], "reference_extra_ms": 0.05}}


def test_a_cell_takes_the_message_table(tmp_path):
    """The message table goes to network.idle_cost (x the message load factor) and every
    hop's per_message_ms sheds the bundle's own (x the factor); the report's per-message parts
    carry each role's hops' extras less it."""
    b = load_bundle(make_bundle(tmp_path / "b", idle=MESSAGES))
    plain = load_bundle(make_bundle(tmp_path / "p", idle=ROLES))
    cell, f = Cell(3, 20.0, 4), Factors(compute=1.0, draft=1.0, forward=2.0, back=2.0)
    a = cell_scenario(cell, b, tmp_path / "a", f, des_requests=40)
    ref = cell_scenario(cell, plain, tmp_path / "r", f, des_requests=40)
    assert a["network"]["idle_cost"] == {"points": [[20.0, 0.0], [110.0, 0.4]]}
    assert "idle_cost" not in ref["network"]
    shed = [
        r["per_message_ms"] - h["per_message_ms"]
        for r, h in zip(ref["network"]["hops"], a["network"]["hops"], strict=True)
    ]
    assert shed == pytest.approx([0.1] * 3, abs=1e-12)
    base = predicted_components(cell, b, f)
    parts = predicted_components(cell, b, f, hop_extra_ms=[0.3, 0.5, 0.2])
    assert parts["per_message_ms"]["forward"] == pytest.approx(
        base["per_message_ms"]["forward"] + 0.4 - 0.1
    )
    assert parts["per_message_ms"]["return"] == pytest.approx(
        base["per_message_ms"]["return"] + 0.2 - 0.1
    )
