"""Light commands stay light: ``wansim --help``, ``wansim validate`` and ``wansim run --engine
analytical`` never import pandas, scipy.stats, scipy.optimize, matplotlib or torch (each costs
0.3-2 s to import;
the CLI answers in a fraction of that without them). Checked on ``sys.modules`` after the
command ran in a fresh interpreter -- not timed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REFERENCE

HEAVY = ("pandas", "scipy.stats", "scipy.optimize", "matplotlib", "torch")
PROBE = """
import contextlib, io, json, sys
from wansim.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as stop:  # --help exits
        code = stop.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def imported_by(*argv: str) -> tuple[int, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=True
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["code"], set(out["modules"])


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("validate", str(REFERENCE)),
        ("run", str(REFERENCE), "--engine", "analytical", "--json"),
    ],
    ids=["help", "validate", "run-analytical"],
)
def test_light_commands_do_not_import_heavy_modules(argv):
    code, modules = imported_by(*argv)
    assert code == 0
    heavy = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not heavy, heavy


def test_the_probe_sees_a_heavy_import(tmp_path):
    """The check can fail: writing result tables (``--out``) does import pandas."""
    out = tmp_path / "out"
    code, modules = imported_by("run", str(REFERENCE), "--engine", "analytical", "--out", str(out))
    assert code == 0
    assert "pandas" in modules


@pytest.mark.parametrize(
    "argv", [("--help",), ("validate", str(REFERENCE))], ids=["help", "validate"]
)
def test_help_and_validate_do_not_import_numpy(argv):
    """Parsing and validating a scenario is plain Python: numpy's import (~0.1-0.15 s of CPU)
    would be half of these commands' 0.3 s budget."""
    code, modules = imported_by(*argv)
    assert code == 0
    assert "numpy" not in modules
