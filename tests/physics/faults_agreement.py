"""The check the faults' agreement tests share: the analytical answer against the DES's mean
over a few seeds (tokens/s, throughput and goodput relative; availability absolute)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from wansim.analytical import analyze
from wansim.sim import simulate


def agrees_with_des_mean(
    scenario, case: str, seeds: int, tokens_rel: float, rates_rel: float, availability_abs: float
):
    """Assert the bounds; returns the analytical result (for the caller's regime checks)."""
    ana = analyze(scenario)
    runs = [simulate(dataclasses.replace(scenario, seed=seed)).metrics for seed in range(seeds)]
    for key, tol in (
        ("tokens_per_s", tokens_rel),
        ("throughput_tokens_per_s", rates_rel),
        ("goodput_tokens_per_s", rates_rel),
    ):
        des = float(np.mean([r[key] for r in runs]))
        assert ana.metrics[key] == pytest.approx(des, rel=tol), (case, key)
    des_avail = float(np.mean([r["availability"] for r in runs]))
    assert ana.metrics["availability"] == pytest.approx(des_avail, abs=availability_abs), case
    return ana
