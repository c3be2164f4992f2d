"""The prompt sample's tau band (wansim.calibrate.workload_sample) and its place in the report:
hand-worked pass counts, the bootstrap against exact enumeration, bounds, and the report's
flags. Torch-free."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wansim.calibrate.matrix import Cell
from wansim.calibrate.report import add_workload_sample
from wansim.calibrate.workload_profile import recorded_profiles
from wansim.calibrate.workload_sample import (
    cell_band,
    drafter_kind,
    passes_per_prompt,
    prompt_passes,
    sample_tau,
    steps_reached,
)


def test_prompt_passes_hand_worked():
    # a real K = 7 prompt: commits 8, 4, 2, 8, 8, 8, 8, 8 -> 46 after 7 passes, 54 after 8
    accepted = [7, 3, 1, 7, 7, 7, 7, 7]
    assert prompt_passes(accepted, 47) == 8
    assert prompt_passes(accepted, 46) == 7
    assert prompt_passes(accepted, 55) is None  # the trace ends first
    assert prompt_passes(accepted, 0) == 0
    assert prompt_passes([0, 0, 0], 3) == 3  # nothing accepted: one token a pass


def test_steps_reached_hand_worked():
    """The steps a request of M decode tokens reaches: those starting before M committed
    tokens (the step that crosses M is kept), per prompt and K, in step order."""
    # prompt 0 commits 8, 1, 4, 8 (starts at 0, 8, 9, 13); prompt 1 commits 1, 1, 1 (0, 1, 2)
    trace = _trace({0: [7, 0, 3, 7], 1: [0, 0, 0]}, k=7)
    trace = pd.concat([trace.iloc[::-1], _trace({0: [1, 1]}, k=2)], ignore_index=True)

    def reached(m: int) -> dict:
        r = steps_reached(trace, m)
        return {(k, p): list(g["step"]) for (k, p), g in r.groupby(["k", "prompt_id"])}

    assert reached(1) == {(2, 0): [0], (7, 0): [0], (7, 1): [0]}
    assert reached(2) == {(2, 0): [0], (7, 0): [0], (7, 1): [0, 1]}
    assert reached(9) == {(2, 0): [0, 1], (7, 0): [0, 1], (7, 1): [0, 1, 2]}
    assert reached(13) == {(2, 0): [0, 1], (7, 0): [0, 1, 2], (7, 1): [0, 1, 2]}
    assert len(steps_reached(trace, 100)) == len(trace)
    # the passes prompt_passes counts are exactly the steps reached
    for m in range(1, 14):
        r = steps_reached(trace, m)
        p0 = r[(r["k"] == 7) & (r["prompt_id"] == 0)]
        assert len(p0) == (prompt_passes([7, 0, 3, 7], m) or 4)


def _trace(per_prompt: dict[int, list[int]], k: int, drafter: str = "chain") -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"drafter": drafter, "prompt_id": p, "k": k, "step": s, "accepted": a}
            for p, acc in per_prompt.items()
            for s, a in enumerate(acc)
        ]
    )


def test_bootstrap_against_exact_enumeration():
    """tau of 2 prompts drawn with replacement from 3 (pass counts 10, 12, 15, M = 29): the
    bootstrap's mean and percentiles against the 9 equally likely ordered pairs."""
    passes = np.array([10.0, 12.0, 15.0])
    tokens = 30
    exact = sorted(2 * 29 / (a + b) for a, b in itertools.product(passes, repeat=2))
    band = sample_tau(passes, prompts=2, tokens=tokens, draws=40_000, seed=3)
    assert band["tau_mean"] == pytest.approx(np.mean(exact), rel=2e-3)
    assert band["tau_workload"] == pytest.approx(3 * 29 / 37)
    # the 2.5% / 97.5% quantiles of a 9-atom distribution are its smallest and largest atoms
    assert band["tau_p2_5"] == pytest.approx(exact[0])
    assert band["tau_p97_5"] == pytest.approx(exact[-1])
    assert band["half_width"] == pytest.approx((exact[-1] - exact[0]) / 2 / band["tau_workload"])


def test_band_bounds_and_shrinking_with_more_prompts():
    passes = np.array([5.0, 10.0, 20.0, 40.0])
    one, many = (sample_tau(passes, n, tokens=41, seed=0) for n in (1, 16))
    for b in (one, many):  # a sample's tau lies between its slowest and fastest prompt's
        assert 40 / 40 <= b["tau_p2_5"] <= b["tau_p97_5"] <= 40 / 5
        assert b["half_width"] >= 0
    assert many["half_width"] < one["half_width"] / 2  # ~1/sqrt(16) of it
    same = sample_tau(np.array([9.0, 9.0]), 4, tokens=46)
    assert same["half_width"] == 0.0 and same["tau_mean"] == pytest.approx(45 / 9)


def test_cell_band_reads_the_cells_drafter_k_and_tokens():
    trace = pd.concat(
        [
            _trace({0: [2, 2, 2, 2], 1: [0, 1, 2, 0, 1, 2]}, k=2),
            _trace({0: [4, 4], 1: [1, 1, 1, 1, 1]}, k=4, drafter="tree"),
        ]
    )
    chain = Cell(
        4, 20.0, 2, prompts=2, tokens=7
    )  # M = 6: prompt 0 in 2 passes (3 + 3), 1 in 3 (1 + 2 + 3)
    tree = Cell(4, 20.0, 4, policy="tree", prompts=2, tokens=7)
    assert drafter_kind(chain) == "chain" and drafter_kind(tree) == "tree"
    assert list(passes_per_prompt(trace, "chain", 2, 7)) == [2.0, 3.0]
    band = cell_band(trace, chain, real_tau=2.4)
    assert band["drafter"] == "chain" and band["tau_workload"] == pytest.approx(12 / 5)
    assert 0.0 <= band["real_quantile"] <= 1.0
    assert cell_band(trace, tree, None)["tau_workload"] == pytest.approx(12 / (2 + 3))
    assert cell_band(trace, Cell(4, 20.0, 7, prompts=2, tokens=7), 3.0) is None  # K unprofiled
    assert cell_band(None, chain, 3.0) is None  # a bundle without traces
    assert cell_band(trace, Cell(4, 20.0, 2, prompts=2, tokens=40), 3.0) is None  # too short


def _entry(err: float, spread: float) -> dict:
    return {
        "real": {"tau": 3.0, "spread": {"tokens_per_s": spread}},
        "des": {"error": {"tokens_per_s": err}},
        "analytical": {"error": {"tokens_per_s": -err}},
    }


def test_report_flags_errors_within_the_spread_plus_the_sample_band():
    trace = _trace({0: [2, 2, 2, 2], 1: [0, 1, 2, 0, 1, 2], 2: [1, 1, 1]}, k=2)
    cell = Cell(4, 20.0, 2, prompts=2, tokens=7)
    half = cell_band(trace, cell, 3.0)["half_width"]
    assert half > 0.1
    inside, outside = _entry(0.019 + half, 0.01), _entry(0.021 + half + 0.01, 0.01)
    add_workload_sample(inside, cell, trace)
    add_workload_sample(outside, cell, trace)
    assert inside["workload_sample"]["half_width"] == pytest.approx(half)
    assert inside["des"]["within_2x_spread_or_sample"] is True
    assert inside["analytical"]["within_2x_spread_or_sample"] is True
    assert outside["des"]["within_2x_spread_or_sample"] is False
    none = _entry(0.5, 0.01)
    add_workload_sample(none, cell, None)  # no traces: no band, no flag
    assert none["workload_sample"] is None and none["des"]["within_2x_spread_or_sample"] is None


def test_recorded_workload_profiles_are_found_by_name(tmp_path: Path):
    for name in ("acceptance_chain_4x48_k7.yaml", "acceptance_tree_3x32_k2.yaml", "other.yaml"):
        (tmp_path / name).write_text("x: 1\n")
    found = recorded_profiles(tmp_path)
    assert set(found) == {("chain", 4, 48, 7), ("tree", 3, 32, 2)}
    assert recorded_profiles(tmp_path / "absent") == {}
