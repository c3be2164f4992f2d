"""Compute noise and intermittent stragglers (wansim.stages.slowdown): the draws against their stated
moments, the analytical lap (mean, variance, percentiles) against Monte Carlo, and both engines
against each other; strict validation."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from wansim.analytical import analyze
from wansim.analytical.sync import sync_metrics
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.sim import simulate
from wansim.stages.slowdown import StageSlowdown, stage_moments

BASE = {
    "stages": 4,
    "model": {
        "hidden_size": 1024,
        "compute": {"kind": "linear", "base_ms": 10.0, "per_token_ms": 0.0},
    },
    "network": {"latency_ms": 5.0, "bandwidth_mbps": 1000.0},
    "speculation": {"policy": "chain", "k": 3},
    "drafter": {"kind": "dspark", "draft_ms": 1.0, "acceptance": {"alpha": 0.7}},
    "workload": {"requests": 200, "prompt_tokens": 8, "output_tokens": 100},
}


def scenario(**model):
    data = copy.deepcopy(BASE)
    data["model"].update(model)
    return load_scenario(data=data)


@pytest.mark.parametrize(
    "model",
    [
        {"noise": {"kind": "lognormal", "cv": 0.3}},
        {"noise": {"kind": "gamma", "cv": 0.8}},
        {"straggler": {"fraction": 0.1, "factor": 4.0}},
        {"noise": {"kind": "gamma", "cv": 0.5}, "straggler": {"fraction": 0.3, "factor": 2.5}},
    ],
)
def test_draws_have_the_stated_moments(model):
    """200k per-pass factors (seeded) against m = 1 + f (s - 1) and
    Var = (1 + cv^2)(1 - f + f s^2) - m^2: within 5 standard errors (deterministic seed)."""
    sc = scenario(**model)
    draw = StageSlowdown(sc.model, 0, np.random.default_rng(7))
    x = np.array([draw.factor(float(t)) for t in range(200_000)])
    m, var = stage_moments(sc.model, 0)
    se = np.sqrt(var / len(x))
    assert abs(x.mean() - m) < 5 * se
    # the sample variance's standard error from the fourth moment of the draws themselves
    se_var = np.sqrt(np.mean((x - x.mean()) ** 4) / len(x))
    assert abs(x.var() - var) < 5 * se_var


def test_hand_worked_moments():
    # f = 0.25, s = 3, cv = 0.5: m = 1.5; E[(XY)^2] = 1.25 * (0.75 + 2.25) = 3.75; Var = 1.5
    sc = scenario(noise={"kind": "gamma", "cv": 0.5}, straggler={"fraction": 0.25, "factor": 3.0})
    assert stage_moments(sc.model, 2) == pytest.approx((1.5, 1.5))


def test_episodes_slow_the_stated_share_of_time():
    """Episodes of mean 50 ms, 20% of the time: the state sampled every 10 ms over 2e7 ms is
    slow 20% of the time (about 8e4 episodes: the share's sd is ~0.002; 0.01 is 5 sd)."""
    sc = scenario(straggler={"fraction": 0.2, "factor": 2.0, "episode_ms": 50.0})
    draw = StageSlowdown(sc.model, 0, np.random.default_rng(3))
    slow = np.array([draw.factor(t) > 1.0 for t in np.arange(0.0, 2e7, 10.0)])
    assert slow.mean() == pytest.approx(0.2, abs=0.01)
    # episodes, not independent passes: a slow sample is followed by a slow one far more often
    assert np.mean(slow[1:][slow[:-1]]) > 0.7


def _mc_laps(sc, n=400_000, seed=11) -> np.ndarray:
    """Laps by Monte Carlo straight from the module docstring's model (independent passes):
    deterministic part + sum over stages of c X Y."""
    rng = np.random.default_rng(seed)
    lap_fixed = 1.0 + 4 * (5.0 + (64 + 4 * 2048) * 8 / 1e6)  # drafter + hops (fwd; ret below)
    lap_fixed += -(64 + 4 * 2048) * 8 / 1e6 + 50 * 8 / 1e6  # the return hop carries 50 bytes
    total = np.full(n, lap_fixed)
    noise, strag = sc.model.noise, sc.model.straggler
    for i in range(4):
        x = np.ones(n)
        if noise.kind == "lognormal" and (not noise.stages or i in noise.stages):
            s2 = np.log1p(noise.cv**2)
            x = rng.lognormal(-s2 / 2, np.sqrt(s2), n)
        if strag.fraction and (not strag.stages or i in strag.stages):
            x = x * np.where(rng.random(n) < strag.fraction, strag.factor, 1.0)
        total += 10.0 * x
    return total


@pytest.mark.parametrize(
    "model",
    [
        {"noise": {"kind": "lognormal", "cv": 0.3}},
        {"straggler": {"fraction": 0.1, "factor": 4.0}},
        {
            "noise": {"kind": "lognormal", "cv": 0.3},
            "straggler": {"fraction": 0.2, "factor": 2.0, "stages": [0, 2]},
        },
    ],
)
def test_analytical_lap_against_monte_carlo_and_des(model):
    sc = scenario(**model)
    laps = _mc_laps(sc)
    an = analyze(sc)
    assert an.approximation["validated"]
    am = an.metrics
    assert am["lap_ms_mean"] == pytest.approx(laps.mean(), rel=2e-3)
    # the lap's variance, c^2 Var(XY) per stage (jitter-free hops add none), vs Monte Carlo
    assert float(sync_metrics(sc)["lap_ms_var"]) == pytest.approx(laps.var(), rel=0.02)
    # percentiles: exact distribution (FFT grid) vs 4e5 Monte Carlo laps
    for q, key in ((0.5, "lap_ms_p50"), (0.99, "lap_ms_p99")):
        assert am[key] == pytest.approx(np.quantile(laps, q), rel=0.01)
    # the DES: its laps' mean within 5 standard errors of the analytical mean (seeded)
    des = simulate(sc)
    d_laps = np.asarray(des.details["record"].laps_ms)
    assert abs(d_laps.mean() - am["lap_ms_mean"]) < 5 * d_laps.std() / np.sqrt(len(d_laps))
    assert am["tokens_per_s"] == pytest.approx(des.metrics["tokens_per_s"], rel=0.02)
    assert am["lap_ms_p99"] == pytest.approx(des.metrics["lap_ms_p99"], rel=0.03)


def test_episodes_are_flagged_not_validated():
    sc = scenario(straggler={"fraction": 0.1, "factor": 4.0, "episode_ms": 5000.0})
    appr = analyze(sc).approximation
    assert not appr["validated"] and "episode" in appr["why"]


def test_features_off_leave_runs_unchanged():
    """No noise and no stragglers: no draws, identical laps to a scenario without the keys."""
    off = scenario(noise={"kind": "none", "cv": 0.0}, straggler={"fraction": 0.0})
    plain = load_scenario(data=BASE)
    assert simulate(off).metrics == simulate(plain).metrics


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"noise": {"kind": "lognormal"}}, "model.noise.cv"),
        ({"noise": {"kind": "none", "cv": 0.2}}, "model.noise.cv"),
        ({"noise": {"kind": "weibull", "cv": 0.2}}, "model.noise.kind"),
        ({"noise": {"kind": "gamma", "cv": 0.2, "stages": [4]}}, "model.noise.stages[0]"),
        ({"straggler": {"fraction": 0.1}}, "model.straggler.factor"),
        ({"straggler": {"fraction": 1.0, "factor": 2.0}}, "model.straggler.fraction"),
        ({"straggler": {"fraction": 0.1, "factor": 0.5}}, "model.straggler.factor"),
        (
            {"straggler": {"fraction": 0.1, "factor": 2, "episode_ms": -1}},
            "model.straggler.episode_ms",
        ),
    ],
)
def test_validated(model, field):
    with pytest.raises(ScenarioError) as err:
        scenario(**model)
    assert str(err.value).startswith(field)
