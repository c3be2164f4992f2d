"""Shared fixtures for the real-execution tests (torch + the committed tiny pair)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "tiny-target"
DRAFTER = ROOT / "models" / "tiny-drafter"


@pytest.fixture(scope="session")
def tiny_dirs() -> tuple[str, str]:
    """The committed tiny target/drafter checkpoints (they must exist: they are in the repo)."""
    assert (TARGET / "model.safetensors").is_file(), f"missing checkpoint {TARGET}"
    assert (DRAFTER / "model.safetensors").is_file(), f"missing checkpoint {DRAFTER}"
    return str(TARGET), str(DRAFTER)


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs):
    pytest.importorskip("torch")
    from wansim.real.model import load_lm

    target_dir, drafter_dir = tiny_dirs
    return target_dir, drafter_dir, load_lm


@pytest.fixture(scope="session")
def code_prompts():
    from wansim.real.prompts import builtin_prompts

    return builtin_prompts("code", n=3, prompt_tokens=48, seed=1)
