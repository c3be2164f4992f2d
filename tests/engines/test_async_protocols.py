"""Async protocols (``schedule.async_protocol``): cancel_on_divergence (wansim's first) and
flush_on_full_acceptance (a block's K drafts count only when all are accepted, no bonus token,
else the target's one token at the divergence; stale blocks computed wherever they arrive, no
cancellation), in both engines (wansim/sim/async_speculation.py, wansim/analytical/blocks.py,
the commit rule in wansim.speculation.commit_survival)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.sim import simulate
from wansim.sim.async_speculation import CANCEL
from wansim.sim.messages import VERIFY

FLUSH = "flush_on_full_acceptance"
K, ALPHA = 3, 0.8
S_K = ALPHA**K


def async_case(protocol=FLUSH, **over) -> dict:
    data = {
        "stages": 4,
        "seed": 5,
        "network": {"latency_ms": 10, "jitter": {"kind": "normal", "std_ms": 1}},
        "drafter": {
            "kind": "draft_model",
            "placement": "first_stage",
            "draft_ms": 2.0,
            "acceptance": {"alpha": ALPHA},
        },
        "speculation": {"policy": "chain", "k": K},
        "schedule": {"kind": "async", "max_inflight_blocks": 3, "async_protocol": protocol},
        "workload": {"requests": 20, "prompt_tokens": 32, "output_tokens": 401},
    }
    for key, value in over.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    return data


def test_expected_tokens_per_round_hand_worked():
    """flush: a valid block commits K = 3 tokens with probability S_3 = 0.8^3 = 0.512, else
    one: 3 x 0.512 + 0.488 = 2.024 per block (cancel_on_divergence: 1 + 0.8 + 0.64 + 0.512 =
    2.952). The analytical tau (exact pass moments, the request's last block truncated) and
    the DES's (Monte Carlo over ~4,000 blocks, per-block sd 2 sqrt(0.512 x 0.488) = 1.0)."""
    hand = K * S_K + (1 - S_K)
    assert hand == pytest.approx(2.024)
    sc = load_scenario(data=async_case())
    ana = analyze(sc).metrics["tau"]
    # truncation at a request's end costs at most one block's tokens per request of 400
    assert ana == pytest.approx(hand, rel=3 / 400)
    des = simulate(sc)
    record = des.details["record"]
    blocks = record.verify_passes
    se = 2 * np.sqrt(S_K * (1 - S_K)) / np.sqrt(blocks)
    assert abs(des.metrics["tau"] - ana) < 5 * se
    cancel = load_scenario(data=async_case("cancel_on_divergence"))
    assert analyze(cancel).metrics["tau"] == pytest.approx(1 + 0.8 + 0.64 + 0.512, rel=4 / 400)


def test_the_bet_wins_with_all_k_drafts_and_no_guess():
    """flush: the next block starts right after the K drafts, so its bet wins with S_K (no
    guess at position K + 1): the DES's share of won bets against 0.512 (5 standard errors)."""
    res = simulate(load_scenario(data=async_case()))
    b = res.details["blocks"]
    n = b["bets_won"] + b["bets_lost"]
    assert abs(b["bets_won"] / n - S_K) < 5 * np.sqrt(S_K * (1 - S_K) / n)
    ana = analyze(load_scenario(data=async_case()))
    assert ana.details["bet_win_rate"] == pytest.approx(S_K, rel=1e-9)


def test_stale_blocks_are_computed_wherever_they_arrive():
    """flush: no cancellation travels; a stale block S0 forwarded is computed by S1..S(P-1)
    (the last stage included) and dropped at the verdict; cancel_on_divergence: the last stage
    never computes one."""
    for protocol, last_computes in ((FLUSH, True), ("cancel_on_divergence", False)):
        sc = load_scenario(data=async_case(protocol, stages=6))
        res = simulate(sc, timeline=True)
        tl = res.details["timeline"]
        cancels = [t for t in tl.transfers if t[7][0].kind == CANCEL]
        last = [s for s in tl.stage_slices if s[0] == sc.stages - 1 and s[3] == "verify"]
        stale_at_last = len(last) - res.details["record"].verify_passes
        if last_computes:
            assert not cancels and res.details["blocks"]["cancel_messages"] == 0
            assert stale_at_last > 0
        else:
            assert cancels and stale_at_last == 0


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"stages": 8, "schedule": {"max_inflight_blocks": 4}},
        {"stages": 2, "schedule": {"max_inflight_blocks": 2}},
        {"drafter": {"overlap": True}},
    ],
    ids=["4-stages-B3", "8-stages-B4", "2-stages-B2", "overlap"],
)
def test_flush_agrees_across_engines(over):
    """tokens/s, tau and the wasted fraction of flush_on_full_acceptance in both engines (the
    block schedule's chain model with the flush commit rule and bet): within the async band
    (10%; wasted fraction 0.04 absolute)."""
    sc = load_scenario(data=async_case(**over))
    des, ana = simulate(sc).metrics, analyze(sc).metrics
    assert ana["tokens_per_s"] == pytest.approx(des["tokens_per_s"], rel=0.10)
    assert ana["tau"] == pytest.approx(des["tau"], rel=0.03)
    assert ana["wasted_token_fraction"] == pytest.approx(des["wasted_token_fraction"], abs=0.04)


def test_flush_is_slower_than_cancel_at_high_acceptance_loss():
    """No bonus token and a wasted partial block: flush commits fewer tokens per block, so at
    the same ring it decodes slower (both engines)."""
    for engine in (simulate, analyze):
        fl = engine(load_scenario(data=async_case())).metrics["tokens_per_s"]
        ca = engine(load_scenario(data=async_case("cancel_on_divergence"))).metrics["tokens_per_s"]
        assert fl < ca


@pytest.mark.parametrize(
    ("over", "path"),
    [
        ({"schedule": {"kind": "sync", "max_inflight_blocks": 1}}, "schedule.async_protocol"),
        ({"speculation": {"k": 1}}, "speculation.k"),
        ({"drafter": {"kind": "mtp"}}, "drafter.kind"),  # the placement rule covers it
        ({"drafter": {"kind": "dspark"}}, "drafter.kind"),
    ],
)
def test_impossible_combinations_name_the_field(over, path):
    with pytest.raises(ScenarioError) as info:
        load_scenario(data=async_case(**over))
    assert str(info.value).startswith(path + ":") and "\n" not in str(info.value)


def test_an_unknown_protocol_is_refused():
    with pytest.raises(ScenarioError, match=r"schedule\.async_protocol: must be one of"):
        load_scenario(data=async_case("flush"))


@settings(max_examples=20, deadline=None)
@given(
    stages=st.integers(1, 7),
    k=st.integers(2, 6),
    window=st.integers(1, 8),
    alpha=st.floats(0.2, 0.97),
    concurrency=st.integers(1, 3),
    batching=st.sampled_from(["none", "continuous"]),
    overlap=st.booleans(),
    latency=st.sampled_from([0.0, 2.0, 30.0]),
    output=st.integers(2, 60),
    seed=st.integers(0, 1000),
)
def test_flush_invariants_over_random_scenarios(
    stages, k, window, alpha, concurrency, batching, overlap, latency, output, seed
):
    """flush_on_full_acceptance in the DES, any window, concurrency, batching, overlap: every
    valid block commits K or 1 token (or what its request still needs); no cancellation
    travels; the wasted stage-tokens recomputed from the timeline (every verify token a stage
    computed, minus P x the verified ones) equal the engine's count."""
    data = async_case(
        stages=stages,
        seed=seed,
        network={"latency_ms": latency},
        drafter={"overlap": overlap, "acceptance": {"alpha": alpha}},
        speculation={"k": k},
        schedule={"max_inflight_blocks": window, "batching": batching},
        workload={"requests": 6, "concurrency": concurrency, "output_tokens": output},
    )
    res = simulate(load_scenario(data=data), timeline=True)
    tl = res.details["timeline"]
    log = np.array(tl.verify_log)  # (rid, step, time, n, accepted, remaining, committed)
    committed, remaining = log[:, 6], log[:, 5]
    assert np.all((committed == k) | (committed == 1) | (committed == remaining))
    assert res.details["blocks"]["cancel_messages"] == 0
    assert not [t for t in tl.transfers if t[7][0].kind == CANCEL]
    computed = sum(
        p.n for s in tl.stage_slices if s[3] != "draft" for p in s[4] if p.kind == VERIFY
    )
    assert (
        computed - stages * int(log[:, 3].sum()) == res.details["blocks"]["cancelled_stage_tokens"]
    )
