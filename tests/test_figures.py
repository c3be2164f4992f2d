"""Every paper figure script regenerates its PNG and PDF (fast mode: same code, coarse grids)."""

from __future__ import annotations

import matplotlib.image as mpimg
import pytest

from tests.conftest import ROOT
from wansim.report import figure_caption, figure_scripts, run_figures

SCRIPTS = figure_scripts()
# what each figure writes besides NAME.png and NAME.pdf
EXTRA = {"wan_ceiling": ["wan_ceiling.csv", "wan_ceiling.md"]}


def test_every_script_has_a_question_and_a_scenario():
    assert len(SCRIPTS) >= 4
    for name, script in SCRIPTS.items():
        caption = figure_caption(script)
        assert "Question:" in caption and "Scenario:" in caption, name
        assert script.parent == ROOT / "paper_figures"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_figure_regenerates(tmp_path, name):
    [(stem, ok, _, tail)] = run_figures([name], out=tmp_path, fast=True)
    assert ok, tail
    png, pdf = tmp_path / f"{name}.png", tmp_path / f"{name}.pdf"
    assert pdf.read_bytes()[:5] == b"%PDF-"
    image = mpimg.imread(png)
    assert image.shape[0] > 400 and image.shape[1] > 800
    assert image[..., :3].std() > 0.05  # not a blank canvas
    for extra in EXTRA.get(name, []):
        assert (tmp_path / extra).stat().st_size > 100
    captions = (tmp_path / "CAPTIONS.md").read_text()
    assert all(f"## {n}" in captions for n in SCRIPTS)
    assert stem == f"fig_{name}"


def test_figures_cli_list_and_bad_name(run_cli):
    code, out, _ = run_cli("figures", "--list")
    assert code == 0 and all(f"{n}: " in out for n in SCRIPTS)
    code, _, err = run_cli("figures", "no_such_figure")
    assert code == 2 and "figures: no such figure (have: " in err and "'no_such_figure'" in err
