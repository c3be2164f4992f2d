"""Shared test fixtures: paths and a quick way to run the CLI in-process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "scenarios" / "v4pro-dspark-10stage-wan.yaml"
NO_SPEC = ROOT / "scenarios" / "v4pro-10stage-wan-no-spec.yaml"
PROFILE = ROOT / "traces" / "reference" / "dspark-v4pro.yaml"

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile(
    "slow", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=400
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def run_cli(capsys):
    """Run ``wansim`` in-process: returns (exit code, stdout, stderr)."""
    from wansim.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        code = main([str(a) for a in argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
