"""The block schedule in the DES (wansim.sim.async_speculation): async in-pipe speculation and the
overlapped drafter.

- lossless: for the same seed every request's (step, A, committed) sequence equals the sync
  run's (the valid blocks consume the sync passes' acceptance draws in order);
- wasted work recomputed from the event record (stage slices, verify log) equals the metric and
  the engine's cancelled stage-token count;
- cancellations travel the links (bytes counted) and no stage starts a block after it heard the
  block was cancelled;
- the max(.) law holds exactly where the bets always win; a lost bet pays lap + draft;
- placements/policies that cannot run async are one-line input errors.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from tests.conftest import REFERENCE
from wansim import speculation
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.sim import simulate
from wansim.sim.async_speculation import CANCEL, VERDICT, guess_rates
from wansim.sim.messages import VERIFY
from wansim.sim.verifier import Verifier

BASE = {
    "name": "async-small",
    "stages": 5,
    "model": {
        "hidden_size": 512,
        "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.1},
    },
    "network": {
        "latency_ms": 10,
        "bandwidth_mbps": 100,
        "jitter": {"kind": "lognormal", "std_ms": 2},
    },
    "drafter": {
        "draft_ms": 1.5,
        "placement": "first_stage",
        "kind": "draft_model",
        "acceptance": {"alpha": 0.75},
    },
    "speculation": {"policy": "chain", "k": 3},
    "schedule": {"kind": "async", "max_inflight_blocks": 4},
    "workload": {"requests": 16, "prompt_tokens": 32, "output_tokens": 60},
}


def scenario(**overrides):
    return load_scenario(data=BASE, overrides=overrides)


def sync_of(sc_overrides: dict):
    over = {**sc_overrides, "schedule.kind": "sync", "schedule.max_inflight_blocks": 1}
    over["drafter.overlap"] = False
    return scenario(**over)


def verify_sequence(result) -> np.ndarray:
    """Verify log rows (rid, step, n, A, remaining, committed) sorted by request and step."""
    log = np.array(result.details["timeline"].verify_log)
    log = log[np.lexsort((log[:, 1], log[:, 0]))]
    return log[:, [0, 1, 3, 4, 5, 6]].astype(np.int64)


def verify_passes(passes):
    return [p for p in passes if p.kind == VERIFY]


CASES = [
    {},
    {"schedule.max_inflight_blocks": 2},
    {"schedule.max_inflight_blocks": 64, "speculation.k": 1},
    {"workload.concurrency": 3},
    {"workload.concurrency": 3, "schedule.batching": "continuous"},
    {"drafter.overlap": True},
    {"drafter.overlap": True, "workload.concurrency": 4, "schedule.batching": "continuous"},
    {"drafter.acceptance.dispersion": 0.3, "network.loss_rate": 0.02},
    {"stages": 1},
    {"stages": 2, "drafter.acceptance.alpha": 0.95},
]


@pytest.mark.parametrize("over", CASES, ids=[str(c) for c in CASES])
def test_async_commits_exactly_what_sync_commits(over):
    sc = scenario(**over)
    res, ref = simulate(sc, timeline=True), simulate(sync_of(over), timeline=True)
    assert np.array_equal(verify_sequence(res), verify_sequence(ref))
    rec, rec_ref = res.details["record"], ref.details["record"]
    assert np.array_equal(rec.committed, rec_ref.committed)
    assert np.array_equal(rec.passes, rec_ref.passes)
    assert res.metrics["tau"] == ref.metrics["tau"]
    m = sc.workload.output_tokens - 1
    assert np.all(rec.committed == m)
    # valid steps are 1..N in verification order for every request
    log = np.array(res.details["timeline"].verify_log)
    for rid in range(sc.workload.requests):
        steps = log[log[:, 0] == rid, 1]
        assert np.array_equal(steps, np.arange(1, len(steps) + 1))


@pytest.mark.parametrize("over", CASES, ids=[str(c) for c in CASES])
def test_wasted_work_recomputed_from_the_event_record(over):
    sc = scenario(**over)
    res = simulate(sc, timeline=True)
    tl = res.details["timeline"]
    p = sc.stages
    # every stage-token computed for a verify pass, from the stage slices
    computed = sum(pa.n for s in tl.stage_slices if s[3] != "draft" for pa in verify_passes(s[4]))
    log = np.array(tl.verify_log)
    verified_tokens = int(log[:, 3].sum())
    committed = int(log[:, 6].sum())
    cancelled = computed - p * verified_tokens
    assert cancelled == res.details["blocks"]["cancelled_stage_tokens"] >= 0
    wasted = (p * (verified_tokens - committed) + cancelled) / (p * verified_tokens + cancelled)
    assert res.metrics["wasted_token_fraction"] == pytest.approx(wasted, rel=1e-12)
    # per block: a verified block was computed by every stage once; without batching the last
    # stage never computes a cancelled block, so the cancelled ones are those computed by fewer
    per_block: dict[int, list] = {}
    for s in tl.stage_slices:
        if s[3] != "draft":
            for pa in verify_passes(s[4]):
                per_block.setdefault(id(pa), [pa, 0])[1] += 1
    assert max(c for _, c in per_block.values()) <= p
    if sc.schedule.batching == "none":  # (a batch may hold a block its neighbour cancels)
        full = [pa for pa, c in per_block.values() if c == p]
        assert len(full) == len(log)
        assert sum(pa.n * c for pa, c in per_block.values() if c < p) == cancelled


def test_async_wastes_work_and_the_window_bounds_it():
    """More blocks in flight: more cancelled work (and never less than sync's rejected tokens)."""
    sync = simulate(sync_of({})).metrics["wasted_token_fraction"]
    wasted = [
        simulate(scenario(**{"schedule.max_inflight_blocks": b})).metrics["wasted_token_fraction"]
        for b in (1, 2, 4, 16)
    ]
    assert wasted[0] == pytest.approx(sync, rel=1e-12)
    assert wasted == sorted(wasted) and wasted[-1] > wasted[0] + 0.1


def test_cancellations_travel_the_links_and_stages_never_start_cancelled_work():
    sc = scenario(**{"stages": 6, "workload.concurrency": 3, "schedule.max_inflight_blocks": 6})
    res = simulate(sc, timeline=True)
    tl = res.details["timeline"]
    cancels = [t for t in tl.transfers if t[7][0].kind == CANCEL]
    assert len(cancels) == res.details["blocks"]["cancel_messages"] > 0
    # they ride the forward hops S0->S1 .. S(P-3)->S(P-2), each of cancel_bytes on the wire
    assert {t[0] for t in cancels} == set(range(sc.stages - 2))
    assert all(t[5] == sc.payload.cancel_bytes for t in cancels)
    # the link bytes are the sum of every transfer, cancellations and verdicts included
    per_hop = np.zeros(sc.stages)
    for t in tl.transfers:
        per_hop[t[0]] += t[5] * (1 + t[6])
    assert np.allclose(per_hop, res.details["record"].link_bytes)
    verdicts = [t for t in tl.transfers if t[7][0].kind == VERDICT]
    assert verdicts and {t[0] for t in verdicts} == {sc.stages - 1}
    # FIFO: a cancellation follows every stale block of its request sent before it on its hop,
    # and after it is delivered to stage i + 1 that stage starts no stale block of the request
    starts: dict[int, list] = {}
    for stage, start, _end, what, passes in tl.stage_slices:
        if what != "draft":
            for pa in verify_passes(passes):
                starts.setdefault(stage, []).append((start, pa))
    for hop, _offer, _s, _b, delivery, _n, _g, (c,) in cancels:
        later_sends = [
            t
            for t in tl.transfers
            if t[0] == hop and t[1] > _offer and t[7][0].kind == VERIFY
            for pa in t[7]
            if pa.request is c.request and pa.epoch < c.epoch
        ]
        assert not later_sends  # S0 / the stage forwards no stale block after the cancellation
        started_after = [
            pa
            for start, pa in starts.get(hop + 1, [])
            if start >= delivery and pa.request is c.request and pa.epoch < c.epoch
        ]
        assert not started_after


def test_window_of_one_is_the_sync_schedule():
    a = simulate(scenario(**{"schedule.max_inflight_blocks": 1})).metrics
    s = simulate(sync_of({})).metrics
    for key in ("tokens_per_s", "lap_ms_mean", "bytes_per_token", "wasted_token_fraction"):
        assert a[key] == pytest.approx(s[key], rel=1e-12), key


def test_bets_win_with_all_drafts_and_the_guess_accepted():
    """The bet on a block wins with P(A = K) p_{K+1}: pooled over requests, inside a binomial
    interval; the guess rate is the request's own rate at position K + 1."""
    sc = scenario(
        **{
            "drafter.acceptance.alpha": None,
            "drafter.acceptance.per_position": [0.9, 0.8, 0.7],
            "drafter.acceptance.dispersion": 0.2,
            "workload.requests": 60,
        }
    )
    res = simulate(sc)
    won, lost = res.details["blocks"]["bets_won"], res.details["blocks"]["bets_lost"]
    seq = np.random.SeedSequence(sc.seed).spawn(3 + 2 * sc.stages)
    p_guess = guess_rates(speculation.policy(sc), np.random.default_rng(seq[1]), 60)
    ver = Verifier(sc, np.random.default_rng(seq[0]), np.random.default_rng(seq[1]))
    assert np.all((p_guess > 0) & (p_guess < 1)) and np.ptp(p_guess) > 0  # per request
    # per request P(win) = S_K(Z) p_{K+1}(Z), weighted by the request's verified blocks
    passes = res.details["record"].passes
    p_win = ver.survival[:, -1] * p_guess
    assert won + lost == passes.sum()
    sd = np.sqrt((passes * p_win * (1 - p_win)).sum())
    assert abs(won - (passes * p_win).sum()) < stats.norm.ppf(1 - 1e-4) * sd


def deterministic(**over):
    data = {
        **BASE,
        "network": {"latency_ms": 7, "bandwidth_mbps": 1e5, "jitter": {"kind": "none"}},
        "drafter": {
            "draft_ms": 3.0,
            "placement": "first_stage",
            "kind": "draft_model",
            "acceptance": {"per_position": [1.0], "extrapolate": True},
        },
        "schedule": {"kind": "sync", "max_inflight_blocks": 1},
        "workload": {"requests": 3, "prompt_tokens": 8, "output_tokens": 81},
    }
    return load_scenario(data=data, overrides=over)


@pytest.mark.parametrize("placement", ["first_stage", "last_stage"])
@pytest.mark.parametrize("draft_ms", [3.0, 200.0])
def test_max_law_when_every_bet_wins(placement, draft_ms):
    """Every draft and guess accepted: a step costs draft + lap without overlap and exactly
    max(draft, lap without drafting) with it."""
    over = {"drafter.placement": placement, "drafter.draft_ms": draft_ms}
    plain = simulate(deterministic(**over)).metrics
    over_ = simulate(deterministic(**over, **{"drafter.overlap": True}))
    lap0 = plain["lap_ms_p50"] - draft_ms  # no jitter: every lap is the same
    assert plain["lap_ms_p99"] == pytest.approx(plain["lap_ms_p50"])
    laps = over_.details["record"].laps_ms
    # the first lap after prefill drafts from the first token (nothing to overlap yet)
    steady = np.array(
        [lap for rid in range(3) for lap in laps[over_.details["record"].lap_request == rid][1:]]
    )
    assert np.allclose(steady, max(draft_ms, lap0), rtol=1e-9)
    assert over_.details["blocks"]["bets_lost"] == 0
    assert (
        over_.metrics["stage_utilization"][0 if placement == "first_stage" else -1]
        < (plain["stage_utilization"][0 if placement == "first_stage" else -1])
    )


def test_a_lost_bet_redrafts_from_the_correction():
    """Every guess rejected (p_{K+1} = 0 beyond K): no bet wins, overlap changes nothing but
    where the drafting runs: every lap is draft + lap without drafting."""
    acc = {"per_position": [1.0, 0.0], "extrapolate": False}
    sc = deterministic(**{"speculation.k": 1, "drafter.acceptance": acc})
    ov = deterministic(**{"speculation.k": 1, "drafter.acceptance": acc, "drafter.overlap": True})
    a, b = simulate(sc), simulate(ov)
    assert b.details["blocks"]["bets_won"] == 0
    assert np.allclose(b.details["record"].laps_ms, a.details["record"].laps_ms, rtol=1e-9)


def test_async_issues_back_to_back_when_every_bet_wins():
    """All accepted, window larger than the lap: S0 is the bottleneck, verdicts arrive every
    draft + compute, and nothing is wasted but the final block's overshoot."""
    sc = deterministic(**{"schedule.kind": "async", "schedule.max_inflight_blocks": 64})
    res = simulate(sc)
    compute = 2.0 + 0.1 * (sc.k + 1)  # stage_ms(K + 1)
    s0 = sc.drafter.draft_ms + compute
    laps = res.details["record"].laps_ms
    assert np.median(laps) == pytest.approx(s0, rel=1e-9)
    assert res.details["blocks"]["cancelled_blocks"] == 0
    # overlap: the drafter and S0 work side by side, a block every max(draft, compute)
    ov = simulate(
        deterministic(
            **{
                "schedule.kind": "async",
                "schedule.max_inflight_blocks": 64,
                "drafter.overlap": True,
            }
        )
    )
    assert np.median(ov.details["record"].laps_ms) == pytest.approx(max(3.0, compute), rel=1e-9)


def ends(lap_request: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Masks of each request's first lap and of its laps but the first and the last (a block
    the room rule held back until a verdict is drafted from the committed tokens)."""
    first = lap_request != np.roll(lap_request, 1)
    last = lap_request != np.roll(lap_request, -1)
    return first, ~first & ~last


@pytest.mark.parametrize(
    ("protocol", "guess"),
    [("cancel_on_divergence", 1), ("flush_on_full_acceptance", 0)],
)
def test_a_bet_drafts_the_guess_first(protocol, guess):
    """An autoregressive drafter (one pass per token) drafts a block behind another in flight
    from the earlier block's drafts and its own guess of the token after them: K + 1 passes,
    as the real pipeline does (wansim.real.async_schedule); the first block of a chain, drafted
    from a verified token, K. Hand-worked: every bet wins and S0 is the bottleneck, so the
    verdicts come every (K + 1) d + c, the first lap of a request is K d + c + the rest of the
    ring; flush_on_full_acceptance has no guess (K d + c). The analytical recursion gives the
    same laps (no jitter: exact; a request of 80 tokens in blocks of K + 1 = 4 tokens has no
    held-back block at its end)."""
    over = {
        "schedule.kind": "async",
        "schedule.max_inflight_blocks": 64,
        "schedule.async_protocol": protocol,
        "drafter.parallel": False,
    }
    sc = deterministic(**over)
    res = simulate(sc)
    k, d = sc.k, sc.drafter.draft_ms
    compute = 2.0 + 0.1 * (k + 1)
    laps = res.details["record"].laps_ms
    first, inner = ends(res.details["record"].lap_request)
    assert np.allclose(laps[inner], (k + guess) * d + compute, rtol=1e-9)
    sync_lap = simulate(deterministic(**{"drafter.parallel": False})).metrics["lap_ms_p50"]
    assert np.allclose(laps[first], sync_lap, rtol=1e-9)  # K d + the whole ring
    assert res.details["blocks"]["drafter_passes"] == 0  # S0 drafts (no overlapped device)
    if guess:  # (flush: its 80 tokens end in a held-back block, which the model spreads)
        ana = analyze(sc).metrics
        assert ana["lap_ms_mean"] == pytest.approx(float(np.mean(laps)), rel=1e-9)
    # the overlapped drafter drafts its bets at the same cost, off S0: a block every
    # max((K + 1) d, c); its device's busy time counts K d for the first block of a request
    ov = simulate(deterministic(**over, **{"drafter.overlap": True}))
    blocks = ov.details["blocks"]
    passes = blocks["drafter_passes"]
    assert blocks["drafter_busy_ms"] == pytest.approx(
        3 * k * d + (passes - 3) * (k + guess) * d, rel=1e-12
    )
    laps = ov.details["record"].laps_ms
    steady = laps[ends(ov.details["record"].lap_request)[1]]
    assert np.median(steady) == pytest.approx(max((k + guess) * d, compute), rel=1e-9)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"drafter.placement": "last_stage"}, "drafter.placement"),
        ({"speculation.policy": "none"}, "speculation.policy"),
        ({"schedule.kind": "sync", "schedule.max_inflight_blocks": 3}, "max_inflight_blocks"),
    ],
)
def test_async_needs_a_drafter_on_s0_and_a_chain(overrides, field):
    with pytest.raises(ScenarioError, match=field):
        scenario(**overrides)


def test_trees_and_hedges_with_async_are_refused_by_the_des():
    sc = load_scenario(
        REFERENCE,
        [
            "drafter.placement=first_stage",
            "drafter.kind=draft_model",
            "schedule.kind=async",
            "schedule.max_inflight_blocks=2",
            "speculation.policy=tree",
        ],
    )
    with pytest.raises(ScenarioError, match=r"schedule\.kind.*trees"):
        simulate(sc)


def test_cli_async_on_the_reference_names_the_placement(run_cli):
    code, out, err = run_cli("run", REFERENCE, "--engine", "des", "--set", "schedule.kind=async")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "drafter.placement" in lines[0] and "last_stage" in lines[0]


@settings(max_examples=25)
@given(
    stages=st.integers(1, 7),
    k=st.integers(1, 6),
    window=st.integers(1, 12),
    alpha=st.floats(0.2, 0.97),
    concurrency=st.integers(1, 4),
    batching=st.sampled_from(["none", "continuous"]),
    overlap=st.booleans(),
    draft_ms=st.sampled_from([0.5, 3.0, 40.0]),
    latency=st.sampled_from([0.0, 2.0, 30.0]),
    output=st.integers(2, 50),
    seed=st.integers(0, 1000),
)
def test_async_invariants_over_random_scenarios(
    stages, k, window, alpha, concurrency, batching, overlap, draft_ms, latency, output, seed
):
    over = {
        "stages": stages,
        "speculation.k": k,
        "schedule.max_inflight_blocks": window,
        "drafter.acceptance.alpha": alpha,
        "workload.concurrency": concurrency,
        "schedule.batching": batching,
        "drafter.overlap": overlap,
        "drafter.draft_ms": draft_ms,
        "network.latency_ms": latency,
        "workload.output_tokens": output,
        "workload.requests": 6,
        "seed": seed,
    }
    res = simulate(scenario(**over), timeline=True)
    ref = simulate(sync_of(over), timeline=True)
    assert np.array_equal(verify_sequence(res), verify_sequence(ref))
    tl = res.details["timeline"]
    computed = sum(pa.n for s in tl.stage_slices if s[3] != "draft" for pa in verify_passes(s[4]))
    log = np.array(tl.verify_log)
    assert (
        computed - stages * int(log[:, 3].sum()) == res.details["blocks"]["cancelled_stage_tokens"]
    )
