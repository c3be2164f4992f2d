"""The async bet's guess rate in a per-K profile: position K + 1 measured by the traces at a
larger K (wansim.acceptance.trace.fit_profile_at_k), instead of the last rate held."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.special import expit, logit

from wansim.acceptance.heterogeneity import next_rate
from wansim.acceptance.profile import load_profile, write_profile
from wansim.acceptance.trace import fit_profile, fit_profile_at_k, guess_rate
from wansim.config.scenario import load_scenario
from wansim.errors import ProfileError
from wansim.sim import simulate

HEADER = {"drafter": "d", "target": "t", "temperature": 0.0, "verifier": "greedy"}


def frame(rows) -> pd.DataFrame:
    """rows: (prompt_id, k, accepted), steps numbered per prompt and k."""
    df = pd.DataFrame(rows, columns=["prompt_id", "k", "accepted"]).assign(workload="w")
    df["step"] = df.groupby(["prompt_id", "k"]).cumcount()
    return df[["workload", "prompt_id", "step", "k", "accepted"]]


def test_guess_rate_by_hand():
    """K = 2 asks P(A >= 3 | A >= 2) of the K = 4 and K = 7 steps: of the five that accepted
    2 or more (2, 3, 4, 2, 7), three accepted 3 or more."""
    f = frame(
        [(0, 2, 2), (0, 2, 0), (0, 4, 2), (0, 4, 3), (1, 4, 4), (1, 4, 1), (1, 7, 2), (1, 7, 7)]
    )
    assert guess_rate(f, 2) == (3 / 5, 5)
    assert guess_rate(f, 7) is None  # nothing deeper
    assert guess_rate(f[f["k"] < 4], 2) is None


def test_profile_at_k_adds_the_guess_and_keeps_the_rest():
    f = frame(
        [(0, 2, 2), (0, 2, 0), (1, 2, 1), (1, 2, 2), (0, 4, 2), (0, 4, 3), (1, 4, 4), (1, 4, 1)]
    )
    own = fit_profile(f[f["k"] == 2], **HEADER)
    prof = fit_profile_at_k(f, 2, **HEADER)
    wp = prof.workloads["w"]
    assert wp.guess_rate == pytest.approx(2 / 3)  # (3, 4) of (2, 3, 4)
    assert dataclasses.replace(wp, guess_rate=None) == own.workloads["w"]  # positions 1..K
    assert prof.header == own.header and wp.histogram == (1, 1, 2)
    # no larger K: the K fit unchanged
    alone = fit_profile_at_k(f[f["k"] == 2], 2, **HEADER)
    assert alone.workloads["w"] == own.workloads["w"]


def test_profile_at_k_round_trips_through_a_file(tmp_path):
    f = frame([(0, 2, 2), (0, 2, 1), (0, 4, 4), (0, 4, 2)])
    path = tmp_path / "p.yaml"
    write_profile(fit_profile_at_k(f, 2, **HEADER), path)
    back = load_profile(path)
    assert back.k == 2 and back.workloads["w"].guess_rate == 0.5


def test_guess_rate_outside_0_1_is_refused(tmp_path, run_cli):
    path = tmp_path / "p.yaml"
    write_profile(fit_profile_at_k(frame([(0, 2, 2), (0, 4, 4)]), 2, **HEADER), path)
    path.write_text(path.read_text().replace("guess_rate: 1.0", "guess_rate: 1.5"))
    with pytest.raises(ProfileError, match="guess_rate"):
        load_profile(path)
    # a scenario naming it: exit 2, one line naming the field, the value and the bound
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: g\nstages: 3\ndrafter: {draft_ms: 1.0, placement: first_stage, kind: draft_model,"
        f" acceptance: {{profile: {path}}}}}\nspeculation: {{policy: chain, k: 2,"
        " verifier: greedy}\n"
    )
    code, out, err = run_cli("run", scenario, "--engine", "des")
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0
    assert "workloads.w.guess_rate" in err and "1.5" in err and "<= 1" in err


@pytest.mark.parametrize("sigma", [0.0, 0.4, 1.3])
def test_the_fitted_guess_reproduces_the_pooled_conditional(sigma):
    """q_(K+1) of heterogeneity.next_rate gives back the measured P(A >= K+1 | A >= K) over the
    steps of requests running blocks of K, by brute force over 400,000 drawn requests (their
    step weights 1 / tau(Z), the difficulty logit-normal), within Monte Carlo error."""
    q = (0.8, 0.7, 0.9)
    target = 0.55
    nxt = next_rate(q, sigma, target)
    z = np.random.default_rng(5).standard_normal(400_000)
    p = expit(logit(np.array([*q, nxt]))[None, :] + sigma * z[:, None])
    surv = np.cumprod(p, axis=1)
    w = 1.0 / (1.0 + surv[:, :3].sum(axis=1))  # steps of a request at K = 3
    pooled = (w * surv[:, 3]).sum() / (w * surv[:, 2]).sum()
    assert pooled == pytest.approx(target, abs=3e-3)
    if sigma == 0:
        assert nxt == target


def test_tree_traces_are_refused():
    f = frame([(0, 2, 2), (0, 4, 3)]).assign(accepted_ranks=["1;1", "1;1;1"], walk_children="")
    with pytest.raises(ValueError, match="chain traces only"):
        fit_profile_at_k(f, 2, **HEADER)


def chain_trace(rates, ks, steps, seed) -> pd.DataFrame:
    """Monte Carlo chain steps of a known conditional model (no heterogeneity): at block size
    k a step accepts drafts while each position's coin lands."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in ks:
        u = rng.random((steps, k))
        ok = u < np.asarray(rates[:k])[None, :]
        acc = np.where(ok.all(axis=1), k, np.argmin(ok, axis=1))
        rows += [(i % 40, k, int(a)) for i, a in enumerate(acc)]
    return frame(rows)


def test_monte_carlo_guess_is_the_deeper_position_not_the_last_held():
    """A drafter whose 3rd token is much worse (0.5) than its 2nd (0.9): traced at K = 2 and 4,
    the K = 2 profile's 3rd rate recovers 0.5 within the binomial band; the held rate was 0.9."""
    rates = [0.85, 0.9, 0.5, 0.8]
    f = chain_trace(rates, (2, 4), 6000, seed=11)
    rate, n = guess_rate(f, 2)
    sd = np.sqrt(0.5 * 0.5 / n)
    assert abs(rate - 0.5) < stats.norm.ppf(1 - 1e-6) * sd
    wp = fit_profile_at_k(f, 2, **HEADER).workloads["w"]
    assert wp.per_position[1] > 0.85 and wp.guess_rate == rate


def ring(profile, schedule="async", dispersion=0.0, requests=40, output_tokens=200):
    """A 3-stage ring drafting K = 2 from ``profile`` (greedy), 3 blocks in flight when async."""
    return load_scenario(
        data={
            "name": "guess",
            "stages": 3,
            "model": {"hidden_size": 256, "compute": {"kind": "linear", "base_ms": 2.0}},
            "network": {"latency_ms": 10, "bandwidth_mbps": 1000},
            "drafter": {
                "draft_ms": 1.0,
                "placement": "first_stage",
                "kind": "draft_model",
                "acceptance": {"profile": str(profile), "dispersion": dispersion},
            },
            "speculation": {"policy": "chain", "k": 2, "verifier": "greedy"},
            "schedule": {"kind": schedule, "max_inflight_blocks": 3 if schedule == "async" else 1},
            "workload": {"requests": requests, "prompt_tokens": 16, "output_tokens": output_tokens},
        }
    )


def test_the_des_bets_at_the_measured_guess(tmp_path):
    """The DES with the K = 2 profile wins a bet as often as S_2 p_3 of the measured profile
    (binomial band over its verified blocks), not as S_2 p_2 (the held rate): the guess reaches
    the engines through the profile file alone."""
    rates = [0.85, 0.9, 0.5, 0.8]
    f = chain_trace(rates, (2, 4), 6000, seed=12)
    path = tmp_path / "k2.yaml"
    write_profile(fit_profile_at_k(f, 2, **HEADER), path)
    wp = load_profile(path).workloads["w"]
    p = (*wp.per_position, wp.guess_rate)
    sc = ring(path)
    blocks = simulate(sc).details["blocks"]
    won, lost = blocks["bets_won"], blocks["bets_lost"]
    n = won + lost
    measured, held = p[0] * p[1] * p[2], p[0] * p[1] * p[1]
    sd = np.sqrt(n * measured * (1 - measured))
    assert abs(won - n * measured) < stats.norm.ppf(1 - 1e-6) * sd
    assert abs(won - n * held) > 10 * sd


def test_the_guess_moves_only_the_bets_in_both_engines(tmp_path):
    """A profile with and without its guess_rate: a sync run is the same to the bit (the K
    rates and the difficulty spread are fitted as before), an async run's bets follow the
    guess in the DES and in the analytical engine (one rule: wansim.acceptance.bet)."""
    from wansim.analytical import analyze

    rates = [0.85, 0.9, 0.5, 0.8]
    f = chain_trace(rates, (2, 4), 3000, seed=13)
    with_guess, without = tmp_path / "g.yaml", tmp_path / "n.yaml"
    prof = fit_profile_at_k(f, 2, **HEADER)
    write_profile(prof, with_guess)
    write_profile(fit_profile(f[f["k"] == 2], **HEADER), without)

    def run(path, schedule):
        sc = ring(path, schedule, dispersion=0.3, requests=200, output_tokens=100)
        return simulate(sc), analyze(sc)

    (sync_g, _), (sync_n, _) = run(with_guess, "sync"), run(without, "sync")
    assert sync_g.metrics == sync_n.metrics
    (des_g, an_g), (des_n, an_n) = run(with_guess, "async"), run(without, "async")

    def des_rate(res):
        b = res.details["blocks"]
        return b["bets_won"] / (b["bets_won"] + b["bets_lost"])

    # held p_2 ~ 0.9 against the measured guess ~ 0.5: the bets fall by ~40% in both engines
    assert an_g.details["bet_win_rate"] < 0.7 * an_n.details["bet_win_rate"]
    assert des_rate(des_g) < 0.7 * des_rate(des_n)
    assert des_rate(des_g) == pytest.approx(an_g.details["bet_win_rate"], rel=0.1)
