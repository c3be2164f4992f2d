"""Installable anywhere: the wheel, installed into a fresh virtual environment, runs the
reference scenario and lists the drafters from an empty directory (the shipped data found
through importlib.resources, not through the source tree)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, strict_loads


def run(cmd: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_runs_from_an_empty_directory(tmp_path):
    """Build the wheel offline (no build isolation), install it without dependencies into a
    fresh venv whose only other path is this environment's site-packages (numpy, simpy, ...:
    added through a .pth line, which does not run this environment's editable-install hook),
    then run the CLI from an empty folder. ~20 s."""
    # build from a copy: setuptools writes build/ beside the sources
    src = tmp_path / "src"
    shutil.copytree(ROOT / "wansim", src / "wansim", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-q", "-w", dist, src], cwd=tmp_path)  # fmt: skip
    (wheel,) = dist.glob("wansim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "wansim/data/scenarios/v4pro-dspark-10stage-wan.yaml" in names
    assert "wansim/data/traces/reference/dspark-v4pro.yaml" in names

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
         "--no-index", "-q", wheel], cwd=tmp_path)  # fmt: skip
    purelib = Path(
        run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=tmp_path).stdout.strip()
    )  # fmt: skip
    ours = sysconfig.get_paths()["purelib"]
    assert ours in site.getsitepackages()
    (purelib / "deps.pth").write_text(ours + "\n")

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WANSIM_MODELS")}
    where = run([python, "-c", "import wansim; print(wansim.__file__)"], empty, env).stdout
    assert where.startswith(str(venv)), where  # the installed wheel, not the source tree
    wansim = venv / "bin" / "wansim"
    out = run([wansim, "run", "scenarios/v4pro-dspark-10stage-wan.yaml", "--engine",
               "analytical", "--json"], empty, env).stdout  # fmt: skip
    data = strict_loads(out)
    assert data["scenario"] == "v4pro-dspark-10stage-wan" and data["metrics"]["tokens_per_s"] > 0
    out = run([wansim, "drafters"], empty, env).stdout
    assert "dspark" in out
    out = run([wansim, "drafters", "--json"], empty, env).stdout
    assert strict_loads(out)
    assert list(empty.iterdir()) == []  # nothing written where it ran
