"""Reference profiles: within the literature review's ("Literature review, Pluralis, compiled August–October 2026") ranges, declining, labelled, reproducible; file format."""

from __future__ import annotations

import runpy

import numpy as np
import pytest

from tests.conftest import PROFILE, ROOT
from wansim.acceptance import closed_form as cf
from wansim.acceptance.profile import load_profile, write_profile
from wansim.acceptance.trace import fit_profile, read_trace, write_trace
from wansim.errors import ProfileError

RANGES = {"math": (4.9, 5.3), "code": (4.9, 5.3), "chat": (2.8, 3.5)}


def test_reference_profile_lands_in_the_review_ranges():
    prof = load_profile(PROFILE)
    assert prof.header.k == 7 and prof.header.temperature == 1.0
    assert prof.header.source == "reconstructed"
    for name, (lo, hi) in RANGES.items():
        wl = prof.workloads[name]
        assert lo <= wl.tau <= hi, name
        assert np.all(np.diff(wl.per_position) < 0), "rates decline with position"
        hist = np.array(wl.histogram) / sum(wl.histogram)
        np.testing.assert_allclose(hist, cf.outcome_pmf(np.array(wl.per_position)), atol=5e-6)
        assert 0 < wl.dispersion < 1


def test_reference_file_says_it_is_reconstructed():
    head = PROFILE.read_text().splitlines()[:3]
    assert "RECONSTRUCTED" in head[0] and "NOT MEASURED" in head[0]


def test_reference_file_is_what_its_script_generates(tmp_path, monkeypatch):
    script = ROOT / "traces" / "reference" / "reconstruct_dspark_v4pro.py"
    module = runpy.run_path(str(script))
    out = tmp_path / "p.yaml"
    module["write_profile"](module["build"](), out, module["HEADER"])
    assert out.read_text() == PROFILE.read_text()


def test_write_and_load_round_trip(tmp_path):
    prof = load_profile(PROFILE)
    write_profile(prof, tmp_path / "copy.yaml", "a header")
    again = load_profile(tmp_path / "copy.yaml")
    assert again == prof


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("format: other/1\nworkloads: {a: {per_position: [0.5]}}", "format"),
        ("k: 2\nworkloads: {}", "workloads"),
        ("k: 2\nworkloads: {a: {per_position: [0.5, 1.5]}}", "per_position[1]"),
        ("k: 2\nworkloads: {a: {per_position: [0.5, 0.4], histogram: [1, 2]}}", "histogram"),
        ("k: 1\nworkloads: {a: {per_position: [0.5, 0.4]}}", "more positions"),
        ("k: 2\nsource: guessed\nworkloads: {a: {per_position: [0.5]}}", "source"),
        ("k: 2\nworkloads: {a: {per_position: [0.5], colour: red}}", "colour"),
    ],
)
def test_bad_profiles_name_the_field(tmp_path, body, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_trace_round_trip_and_fit(tmp_path):
    import pandas as pd

    frame = pd.DataFrame(
        {
            "workload": ["w"] * 6,
            "prompt_id": [0, 0, 0, 1, 1, 1],
            "step": [0, 1, 2, 0, 1, 2],
            "k": [2, 2, 2, 2, 2, 2],
            "accepted": [2, 1, 0, 2, 2, 1],
        }
    )
    write_trace(frame, tmp_path / "t.csv", {"drafter": "x"})
    back, meta = read_trace(tmp_path / "t.csv")
    assert meta == {"drafter": "x"} and back.equals(frame)
    wl = fit_profile(back).workloads["w"]
    # hand count: position 1 accepted in 5 of 6 steps; position 2 in 3 of the 5 at risk
    np.testing.assert_allclose(wl.per_position, [5 / 6, 3 / 5])
    assert wl.histogram == (1, 2, 3)


def test_bad_trace_rows_are_errors(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("workload,prompt_id,step,k,accepted\nw,0,0,2,3\n")
    with pytest.raises(ProfileError, match="accepted"):
        read_trace(path)
    with pytest.raises(ProfileError, match="not found"):
        read_trace(tmp_path / "missing.csv")
