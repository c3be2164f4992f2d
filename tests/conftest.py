"""Shared test fixtures: paths and a quick way to run the CLI in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "scenarios" / "v4pro-dspark-10stage-wan.yaml"
NO_SPEC = ROOT / "scenarios" / "v4pro-10stage-wan-no-spec.yaml"
PROFILE = ROOT / "traces" / "reference" / "dspark-v4pro.yaml"

# Hypothesis profiles. "default": derandomised (the same examples every run: the default suite
# cannot fail by chance). "fresh": new random examples every run, same sizes, for hunting bugs
# (HYPOTHESIS_PROFILE=fresh). "slow": fresh examples and more of them (400 unless a test sets
# its own count); loaded automatically by `pytest -m slow` (make test-slow).
_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("default", derandomize=True, **_COMMON)
settings.register_profile("fresh", derandomize=False, **_COMMON)
settings.register_profile("slow", derandomize=False, max_examples=400, **_COMMON)


def pytest_configure(config):
    """HYPOTHESIS_PROFILE wins; otherwise a run selecting slow tests (-m slow) draws fresh
    examples and the default run stays derandomised."""
    markexpr = (config.getoption("markexpr", "") or "").replace("not slow", "")
    name = os.environ.get("HYPOTHESIS_PROFILE") or ("slow" if "slow" in markexpr else "default")
    settings.load_profile(name)


@pytest.fixture(autouse=True, scope="session")
def every_module_imported() -> None:
    """Every module of the package imported before the first test of each process that runs
    tests (not pytest-xdist's controller). Hypothesis mixes the literal constants of the
    project's loaded modules into what it draws, so a derandomised test's examples would
    otherwise depend on which modules earlier tests happened to import lazily in the same
    worker (pytest-xdist hands tests out as workers free up): the same commit could draw
    different examples from run to run."""
    import contextlib
    import importlib
    import pkgutil

    import wansim

    for module in pkgutil.walk_packages(wansim.__path__, "wansim."):
        if module.name.rsplit(".", 1)[-1] != "__main__":
            # an optional extra not installed: the module is absent in every worker alike
            with contextlib.suppress(ImportError):
                importlib.import_module(module.name)


def _reject_constant(name: str):
    raise ValueError(f"not strict JSON (RFC 8259): {name}")


def strict_loads(text: str):
    """``json.loads`` that rejects NaN, Infinity and -Infinity (json.loads accepts them)."""
    return json.loads(text, parse_constant=_reject_constant)


@pytest.fixture
def run_cli(capsys):
    """Run ``wansim`` in-process: returns (exit code, stdout, stderr)."""
    from wansim.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        code = main([str(a) for a in argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def start_held(cmd: list[str], hold_after: str) -> subprocess.Popen:
    """Start ``cmd`` (a wansim command) in a child that pauses right after its checkpoint
    ``hold_after`` (``LABEL:N``, see :mod:`wansim.support.hold`) until a signal arrives, so a
    test interrupts it at a known moment instead of racing it under load. SIGINT is restored to
    its default in the child: a suite started in the background (nohup, ``&`` without job
    control) passes it on as ignored, and Python then never turns it into Ctrl-C."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANSIM_HOLD_AFTER": hold_after}
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
