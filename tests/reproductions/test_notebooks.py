"""The what-if notebooks: paired (jupytext percent .py <-> .ipynb) and executed end to end."""

from __future__ import annotations

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))


def test_there_is_a_notebook():
    assert NOTEBOOKS


@pytest.mark.parametrize("script", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_paired(script):
    """The .ipynb holds exactly the cells of the reviewable .py (``jupytext --sync``)."""
    ipynb = script.with_suffix(".ipynb")
    assert ipynb.exists(), f"run: jupytext --sync {script}"
    a, b = jupytext.read(script), jupytext.read(ipynb)
    cells = lambda nb: [(c.cell_type, c.source.strip()) for c in nb.cells]  # noqa: E731
    assert cells(a) == cells(b), f"out of sync: jupytext --sync {script}"


@pytest.mark.parametrize("script", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(script):
    nb = nbformat.read(script.with_suffix(".ipynb"), as_version=4)
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(script.parent)}},
    )
    client.execute()  # raises CellExecutionError on any failing cell (the DES check included)
    text = "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    images = [
        out
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    ]
    if script.stem == "what_if_10stage_ring":
        assert "configurations evaluated" in text and "95% CI" in text
        assert len(images) == 1
    if script.stem == "serving_many_users":
        assert "micro-batches deliver" in text and "from the DES" in text
        assert len(images) == 1
