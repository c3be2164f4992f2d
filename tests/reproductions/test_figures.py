"""Every paper figure script regenerates its PNG and PDF (fast mode: same code, coarse grids)."""

from __future__ import annotations

import matplotlib.image as mpimg
import pytest

from tests.conftest import ROOT
from wansim.results.report import figure_caption, figure_scripts, run_figures

SCRIPTS = figure_scripts()
# what each figure writes besides NAME.png and NAME.pdf
EXTRA = {
    "wan_ceiling": ["wan_ceiling.csv", "wan_ceiling.md"],
    "depth_wall": ["depth_wall.csv", "depth_wall.md"],
}


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


def test_run_out_writes_requests_and_plots(run_cli, tmp_path):
    """``wansim run --out``: metrics, the DES per-request table, and the three plots."""
    import json

    import pandas as pd

    from tests.conftest import REFERENCE

    out = tmp_path / "run"
    code, _, err = run_cli(
        "run",
        REFERENCE,
        "--engine",
        "both",
        "--set",
        "workload.requests=12",
        "--set",
        "workload.output_tokens=200",
        "--out",
        out,
    )
    assert code == 0 and "warning" not in err, err
    metrics = json.loads((out / "metrics.json").read_text())["des"]
    requests = pd.read_csv(out / "requests.csv")
    assert len(requests) == 12 and (requests["decode_tokens"] == 199).all()
    assert requests["tokens_per_s"].mean() == pytest.approx(metrics["tokens_per_s"], rel=1e-5)
    assert requests["ttft_ms"].mean() == pytest.approx(metrics["ttft_ms_mean"], rel=1e-5)
    assert (requests["finish_ms"] > requests["first_token_ms"]).all()
    for name in ("lap_breakdown", "stage_utilization", "latency_cdf"):
        image = mpimg.imread(out / f"{name}.png")
        assert image.shape[1] > 500 and image[..., :3].std() > 0.05, name


def test_lap_breakdown_adds_up_to_the_analytical_lap():
    import wansim
    from tests.conftest import REFERENCE
    from wansim.results.plots import lap_breakdown_table

    for over in ({}, {"network.hops": [{"latency_ms": 5.0 * i} for i in range(10)]}):
        sc = wansim.load_scenario(REFERENCE, over)
        table = lap_breakdown_table(sc)
        parts = table[["compute_ms", "draft_ms", "propagation_ms", "serialisation_ms"]]
        assert float(parts.to_numpy().sum()) == pytest.approx(
            wansim.analyze(sc).metrics["lap_ms_mean"], rel=1e-9
        )
        assert list(table["hop"])[-1] == "S9->S0 (return)"
