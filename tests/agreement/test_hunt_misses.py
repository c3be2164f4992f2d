"""Regressions from the agreement hunt's misses (``wansim.agreement_case(seed)``
rebuilds each case, ``base_scenario(seed, serving=False)``: the draw before the serving and WAN mechanisms
joined it), each against the DES on the scenario that exposed it:

- one request's own async blocks behind a lost message (seeds 89, 156, 250): the ring stalls
  once per loss, not once per held block (``wansim.analytical.blocks.loss_stalls``; the
  per-message resequencing hold gave -68%, -73%, -19%);
- an overlapped drafter saturated by 16 requests (seed 297): its FIFO queue holds one draft
  per request, so every draft starts after its bet is settled and none is stale (-33%);
- prefills queued behind each other on 100 Mbit/s hops (seed 210): equal-length requests
  that start a prefill's serialisation apart never finish together (+391%);
- the mean TTFT on rings without link randomness (seeds 43, 83): a prefill enters in its
  predecessor's phase and waits for no one (+85%, +19%).

Each DES run is seeded (deterministic); the tolerance is the regime's documented band plus
twice the DES's 95% half-width, the hunt's own criterion."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pandas as pd
import pytest

from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.sim import simulate
from wansim.studies import agreement_hunt as hunt


def case(seed: int) -> dict:
    """The scenario the hunt drew for ``seed`` when it exposed the miss (before the serving
    mechanisms joined the draw)."""
    return hunt.base_scenario(seed, serving=False)


def _both(data: dict) -> tuple[float, float, float, tuple]:
    sc = load_scenario(data=data)
    des = simulate(sc).metrics
    low, high = des["tokens_per_s_ci95"]
    return analyze(sc).metrics["tokens_per_s"], des["tokens_per_s"], (high - low) / 2, (low, high)


@pytest.mark.parametrize("seed", [89, 156, 250])
def test_async_blocks_behind_a_lost_message_stall_once(seed):
    """One request, window > 1, loss: within the async band (10%) + 2 half-widths (before:
    -68%, -73%, -19% against half-widths of 4.4%, 14.8%, 3.8%)."""
    ana, des, half, _ = _both(case(seed))
    assert abs(ana - des) <= 0.10 * des + 2 * half, (seed, ana, des, half)


def test_async_window_of_one_with_loss_is_the_sync_lap():
    """B = 1: nothing is in flight behind a block, every loss costs its whole repair; the
    block schedule must give the sync closed form (hand-checkable limit), at 0%, 1%, 4%."""
    base = case(89)
    for loss in (0.0, 0.01, 0.04):
        a = copy.deepcopy(base)
        a["network"]["loss_rate"] = loss
        a["schedule"]["max_inflight_blocks"] = 1
        s = copy.deepcopy(a)
        s["schedule"]["kind"] = "sync"
        x = analyze(load_scenario(data=a)).metrics["tokens_per_s"]
        y = analyze(load_scenario(data=s)).metrics["tokens_per_s"]
        assert x == pytest.approx(y, rel=5e-3), loss


@pytest.mark.parametrize("seed", [89, 156, 250])
def test_async_rate_falls_with_loss(seed):
    """More loss never speeds a request up (the issue's async case rose 20.8 -> 32.1 tokens/s
    from 0% to 4% loss)."""
    rates = []
    for loss in (0.0, 0.001, 0.01, 0.04):
        data = case(seed)
        data["network"]["loss_rate"] = loss
        rates.append(analyze(load_scenario(data=data)).metrics["tokens_per_s"])
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(rates)), rates


def test_saturated_overlapped_drafter_drafts_after_the_verdicts():
    """Seed 297: 16 requests share a 4 ms overlapped drafter on a 57 ms ring; (N - 1) d = 60 ms
    outlasts a pass's travel, so no draft is stale and the drafter runs back to back. Within
    the concurrent band (15%) + 2 half-widths (before: -33.4%, half-width 2.3%)."""
    ana, des, half, _ = _both(case(297))
    assert abs(ana - des) <= 0.15 * des + 2 * half, (ana, des, half)


def test_staggered_prefills_do_not_finish_together():
    """Seed 210: 8 requests of 2 passes whose 7 MB prefills take 590 ms a hop: the analytical
    tokens/s lies inside the DES's 95% interval (before: 2.84 against an interval of
    0.17-0.99)."""
    ana, _, _, (low, high) = _both(case(210))
    assert low <= ana <= high, (ana, low, high)


@pytest.mark.parametrize("seed", [43, 83])
def test_prefill_enters_its_predecessors_phase(seed):
    """Seeds 43 and 83: 2 and 4 requests on rings without link randomness; a new request's
    prefill enters in the phase its predecessor leaves and waits for no one (the DES's TTFT
    is the prefill alone for every measured request at seed 43). The analytical mean TTFT
    within the concurrent TTFT band (before: +85% and +19%, validated)."""
    sc = load_scenario(data=case(seed))
    ana = analyze(sc)
    des = simulate(sc).metrics["ttft_ms_mean"]
    assert ana.approximation["validated"]
    band = ana.approximation["error_band"]["ttft_ms_mean"]
    assert abs(ana.metrics["ttft_ms_mean"] - des) <= min(band, 0.05) * des, (
        ana.metrics["ttft_ms_mean"],
        des,
    )


@pytest.mark.parametrize(("seed", "before"), [(3773, -0.30), (3829, -0.42)])
def test_a_prefill_queues_at_a_saturated_bottleneck_whatever_its_phase(seed, before):
    """Fresh hunt seeds 3773 and 3829 (seeds 3600-3899): several requests beyond the ring's
    capacity (N x the bottleneck's pass > the lap alone). A saturated bottleneck parks every
    customer whatever its phase, so a new request's prefill queues there as a verify pass
    does; the in-phase rule (seeds 43 and 83, above) had spared it: mean TTFT -30% and -42%
    against the DES. Now within 15% (measured +5.5% and 0.0%); on seed 3816 made sync
    (16 requests on 2 stages) -69% -> -31%."""
    sc = load_scenario(data=hunt.draw_scenario(seed))
    ana = analyze(sc).metrics["ttft_ms_mean"]
    des = simulate(sc).metrics["ttft_ms_mean"]
    assert abs(ana - des) <= 0.15 * des, (ana, des, before)


SEED_8192 = {
    "name": "hunt-8192",
    "seed": 8192,
    "stages": 8,
    "model": {
        "hidden_size": 7168,
        "compute": {"kind": "linear", "base_ms": 6.0, "per_token_ms": 0.02},
    },
    "network": {
        "latency_ms": 5.0,
        "bandwidth_mbps": 1000.0,
        "jitter": {"kind": "pareto", "std_ms": 2.0},
        "loss_rate": 0.0,
        "hops": [
            {"latency_ms": 10.0, "bandwidth_mbps": 30000.0},
            {"latency_ms": 10.0, "bandwidth_mbps": 3000.0},
            {"latency_ms": 40.0, "bandwidth_mbps": 30000.0},
            {"latency_ms": 1.0, "bandwidth_mbps": 3000.0},
            {"latency_ms": 40.0, "bandwidth_mbps": 3000.0},
            {"latency_ms": 40.0, "bandwidth_mbps": 300.0},
            {"latency_ms": 1.0, "bandwidth_mbps": 3000.0},
            {"latency_ms": 10.0, "bandwidth_mbps": 30000.0},
        ],
    },
    "drafter": {
        "kind": "draft_model",
        "placement": "first_stage",
        "draft_ms": 0.5,
        "overlap": False,
        "acceptance": {"alpha": 0.999, "dispersion": 0.0, "extrapolate": True},
    },
    "speculation": {"policy": "chain", "k": 5},
    "schedule": {"kind": "async", "max_inflight_blocks": 4, "batching": "none"},
    "workload": {"requests": 16, "concurrency": 4, "prompt_tokens": 512, "output_tokens": 128},
}


def _scaled(data: dict, field: str, factor: float) -> dict:
    out = copy.deepcopy(data)
    out["network"][field] *= factor
    for hop in out["network"]["hops"]:
        hop[field] *= factor
    return out


def test_convoys_pass_continuously_from_equal_lengths_to_spread():
    """Hunt seed 8192: async, 4 requests of ~22 passes each (alpha 0.999). The laps' jitter
    spreads the requests' lengths by ~0.2 laps^2 at this latency and ~0.47 at half of it; the
    passes' distribution jumped from two points (no spread: the slots finish together, no
    prefill convoys anyone) to a discretised normal at sd 1/2, so halving the latency lowered
    tokens/s by 6.7% (95.99 -> 89.55). Now monotone in latency and bandwidth, and the error
    against the DES no worse than it was (15%: 95.99 against 83.3)."""
    rate = analyze(load_scenario(data=SEED_8192)).metrics["tokens_per_s"]
    for field, factor in (("latency_ms", 0.5), ("bandwidth_mbps", 4.0)):
        faster = analyze(load_scenario(data=_scaled(SEED_8192, field, factor)))
        assert faster.metrics["tokens_per_s"] >= rate, (field, rate, faster.metrics)
    des = simulate(load_scenario(data=SEED_8192)).metrics["tokens_per_s"]
    assert abs(rate - des) <= 0.15 * des, (rate, des)


def test_passes_pmf_keeps_the_spread_below_half_a_pass():
    """The passes' pmf keeps its node's mean and variance below sd 1/2 (hand-checkable:
    mean 22, variance 0.2 -> P(21) = P(23) = 0.1, P(22) = 0.8), and moves continuously in
    the variance across sd 1/2 (the share of convoys by at most a few hundredths)."""
    from wansim.analytical.slots import passes_pmf, synchrony

    pmf = passes_pmf([1.0], [22.0], [0.2])
    assert pmf[21] == pytest.approx(0.1) and pmf[23] == pytest.approx(0.1)
    assert pmf[22] == pytest.approx(0.8)
    k = range(len(pmf))
    mean = sum(i * p for i, p in zip(k, pmf, strict=True))
    assert mean == pytest.approx(22.0)
    assert sum((i - mean) ** 2 * p for i, p in zip(k, pmf, strict=True)) == pytest.approx(0.2)
    shares = [synchrony(passes_pmf([1.0], [22.0], [v]), 9.35, 4.0) for v in (0.2, 0.3)]
    assert shares[0] > 0.2  # no longer 0: the spread already mixes the waves
    assert all(b >= a for a, b in itertools.pairwise(shares))


def test_passes_pmf_is_continuous_across_the_lattice_and_the_normal():
    """The lattice (sd below 1/2) and the discretised normal (above 3/4) are blended in
    between: no step at either end (the normal's centre cell at sd 1/2 is 0.683 against the
    lattice's 0.75, a step of 0.067 in the pmf and so in the convoys' share), and the mean
    stays the node's (the normal's discretisation is symmetric about an integer mean)."""
    from wansim.analytical.slots import passes_pmf

    for mean in (22.0, 22.3):
        for sd in (0.5, 0.75):
            below = passes_pmf([1.0], [mean], [(sd - 1e-7) ** 2])
            above = passes_pmf([1.0], [mean], [(sd + 1e-7) ** 2])
            size = max(len(below), len(above))
            below, above = (np.pad(p, (0, size - len(p))) for p in (below, above))
            assert np.abs(below - above).max() < 1e-5, (mean, sd)
    for sd in np.linspace(0.3, 1.0, 15):
        pmf = passes_pmf([1.0], [22.0], [sd**2])
        assert pmf @ np.arange(len(pmf)) == pytest.approx(22.0, abs=1e-9)


@pytest.mark.parametrize("seed", [32, 62])
def test_micro_batches_with_extra_tensors_are_answered(seed):
    """Hunt seeds 32 and 62 (micro-batches, auxiliary hidden states on the ring): the
    analytical engine crashed (the return message's features asked for the ring's size that
    the micro-batched ring never passes); now it answers, and the hunt's rule holds: within
    the documented band plus twice the DES's half-width, or ``validated: false``."""
    row = hunt.evaluate(seed)
    assert not row["refused"], row["refused"]
    assert not row["out_of_band"] or not row["validated"], row


@pytest.mark.parametrize("seed", [32, 62, 285])
def test_micro_batches_wait_behind_a_lost_message(seed):
    """Hunt seeds 32, 62, 285 (micro-batches on a ring with 4% loss): links deliver in order,
    so a retransmission (200 ms, several laps) holds the other micro-batches' messages too.
    Each micro-batch's own losses alone had given +190%, +150%, +134%; with the resequencing
    wait of the others' messages (``wansim.analytical.micro_batched.hol_wait_ms``) the rate
    lies within the micro-batched band plus twice the DES's half-width."""
    row = hunt.evaluate(seed)
    band = hunt.documented_band(row["regime"])
    assert abs(row["err tokens_per_s"]) <= band + 2 * row["des_half_rel"], row


def test_micro_batches_head_of_line_wait_limits():
    """The head-of-line wait is zero with one micro-batch (no other message in flight) and on
    links without loss or jitter; with loss it lengthens the lap, more with more loss."""
    from wansim.analytical.micro_batched import hol_wait_ms, micro_batched_run
    from wansim.analytical.sync import lap_parts

    def wait(batches: float, **network) -> float:
        data = copy.deepcopy(hunt.draw_scenario(32))
        data["network"].update(network)
        sc = load_scenario(data=data)
        return float(hol_wait_ms(sc, micro_batched_run(sc, lap_parts(sc)).ring, batches))

    assert wait(6.0, loss_rate=0.0, jitter={"kind": "none"}) == 0.0
    assert wait(1.0) == 0.0
    waits = [wait(6.0, loss_rate=q, jitter={"kind": "none"}) for q in (0.0, 0.01, 0.04)]
    assert waits[0] == 0.0 < waits[1] < waits[2], waits
    # 4% loss, 200 ms RTO: far more than a lap, so a loss holds most of the ring
    assert waits[2] > 20.0, waits


def test_hunt_seed_1011_micro_batches_carry_the_extra_tensors():
    """Hunt seed 1011 (6 micro-batches of 16 users, a tree, two extra tensors that accumulate,
    100 Mbit/s, a 1.3x drift): the micro-batched model ignored payload.extra_tensors, +181% on
    tokens/s against the DES (+175% without the drift). With the per-hop sizes +1% (0% without
    the drift); bound: the micro-batched band (12%) plus twice the DES's half-width."""
    row = hunt.evaluate(1011)
    band = hunt.documented_band(row["regime"])
    assert abs(row["err tokens_per_s"]) <= band + 2 * row["des_half_rel"], row
    assert abs(row["err tokens_per_s"]) <= 0.10, row


def test_hunt_seed_1429_a_prefill_back_inside_the_rto_warms_the_ring():
    """Hunt seed 1429 (one request at a time, tcp, 5 ms hops, a 16 kB tree frame, 15 ms of
    drafting): a lap under the initial window idles each hop 2.5 ms past the 200 ms RTO, so the
    first request stays cold (lap 222 ms), but the next prompt, which skips the drafter, comes
    back inside it and every later request runs warm (152 ms). The walk of one request from its
    start stayed cold: -31% on tokens/s and +49% on the mean TTFT while validated (a silent
    error). Walked request by request: -1.6% and 0%; bound: the sync band (3%) plus twice the
    DES's half-width, and the TTFT within its own band plus twice its half-width."""
    row = hunt.evaluate(1429)
    assert row["validated"], row
    assert abs(row["err tokens_per_s"]) <= row["band"] + 2 * row["des_half_rel"], row
    assert abs(row["err tokens_per_s"]) <= 0.05, row
    assert not bool(hunt.ttft_beyond(pd.DataFrame([row])).iloc[0]), row


def test_prefill_share_by_hand():
    """No speculation (E[N] = output - 1 verify passes of one token): a stage of 10 ms + 0.1
    ms a token computes a 100-token prompt in 20 ms and a pass in 10.1 ms, so of a request's
    work 20 / (20 + 10 x 10.1) = 16.5% is its prefill."""
    from wansim.analytical.regime import prefill_share

    assert prefill_share(_plain_ring(100, 11)) == pytest.approx(20.0 / 121.0, rel=1e-12)


def _plain_ring(prompt: int, output: int):
    """4 of 8 requests without speculation on 3 stages of 10 ms + 0.1 ms a token."""
    data = {
        "stages": 3,
        "model": {"compute": {"kind": "linear", "base_ms": 10.0, "per_token_ms": 0.1}},
        "speculation": {"policy": "none"},
        "workload": {
            "requests": 8,
            "concurrency": 4,
            "prompt_tokens": prompt,
            "output_tokens": output,
        },
    }
    return load_scenario(data=data)


def test_prefills_that_crowd_the_decode_are_not_validated():
    """Agreement hunt seed 1590 (fresh hunt 1550-1649): 16 requests of 9 tokens behind
    512-token prompts, async with a window of 4 on 6 stages at 1 Gbit/s. A request's prefill
    is 59% of a stage's work; the analytical tokens/s 5.99 against the DES's 12.40-13.15 at
    256 requests (three DES seeds, half-widths ~5%): -52%, where it had said validated
    (masked in the hunt by 64 requests' half-width of 24%). Now not validated, naming the
    share. The same ring with 129-token outputs (12%) stays validated (-5% there)."""
    data = hunt.draw_scenario(1590)
    ana = analyze(load_scenario(data=data))
    assert not ana.approximation["validated"]
    assert "prefill is 59% of a stage's work" in ana.approximation["why"]
    data["workload"]["output_tokens"] = 129
    assert analyze(load_scenario(data=data)).approximation["validated"]


def test_prefill_lead_by_hand():
    """2 stages of 10 ms + 0.1 ms a token, a chain of K = 3 (4 tokens a pass) for 4 users in
    one batch (16 tokens, the drafter at the last stage), 4-token prompts, 256-wide fp16
    activations with a 64-byte header at 10 Mbit/s: the stage takes 10.4 ms for a prompt and
    11.6 ms for the batch (ratio 0.897); hop 0 carries 4 x 256 x 2 + 64 = 2,112 bytes (1.6896
    ms) against 8,256 (6.6048 ms; ratio 0.256). The prompt outruns the batch everywhere; its
    lead is the largest ratio, 10.4 / 11.6."""
    from wansim.analytical.batched import prefill_lead

    data = {
        "stages": 2,
        "model": {
            "hidden_size": 256,
            "compute": {"kind": "linear", "base_ms": 10.0, "per_token_ms": 0.1},
        },
        "network": {"latency_ms": 5.0, "bandwidth_mbps": 10.0, "jitter": {"kind": "none"}},
        "payload": {"activation_bits": 16, "header_bytes": 64, "return_bytes": 50},
        "drafter": {
            "kind": "draft_model",
            "placement": "last_stage",
            "draft_ms": 1.0,
            "acceptance": {"alpha": 0.7},
        },
        "speculation": {"policy": "chain", "k": 3},
        "schedule": {"kind": "sync", "batching": "continuous"},
        "workload": {"requests": 16, "concurrency": 4, "prompt_tokens": 4, "output_tokens": 32},
    }
    assert prefill_lead(load_scenario(data=data)) == pytest.approx(10.4 / 11.6, rel=1e-12)
    data["workload"]["prompt_tokens"] = 64  # 16.4 ms against 11.6: the batch waits behind it
    assert prefill_lead(load_scenario(data=data)) > 1.0


def test_replacements_that_outrun_the_batch_are_not_validated():
    """Agreement hunt seed 1796 (fresh hunt 1750-1899): continuous batching of 8 users, a
    16-node tree, 2 ms a sequence per stage, 16-token prompts on 4 stages of 60 ms hops. Each
    replacement's prefill (6.3 ms a stage) outruns the batch (22.7 ms) and travels alone: the
    DES's stage 0 ran passes of 1.06 sequences on average, where the lockstep model keeps 8,
    so tokens/s came out -17% to -19% against the DES (three seeds, 192 requests) while
    validated (band 8%). Now not validated, naming the lead. With 2,048-token prompts the
    batch waits behind each prompt and merges (the DES's passes average 3.2 sequences): the
    prefills no longer outrun it, and without the cost per sequence (not validated on its
    own, :func:`test_continuous_batching_with_a_cost_per_sequence_is_not_validated`) the
    point is validated and within its band."""
    data = hunt.draw_scenario(1796)
    ana = analyze(load_scenario(data=data))
    assert not ana.approximation["validated"]
    assert "prefills outrun the batch" in ana.approximation["why"]
    data["workload"]["prompt_tokens"] = 2048
    assert "prefills outrun" not in analyze(load_scenario(data=data)).approximation["why"]
    del data["model"]["sequence_ms"], data["drafter"]["sequence_ms"]  # (a rule of its own)
    ana, des, half, _ = _both(data)
    assert analyze(load_scenario(data=data)).approximation["validated"]
    assert abs(ana - des) <= 0.08 * des + 2 * half, (ana, des, half)


def test_heavy_jitter_behind_an_async_window_is_not_validated():
    """Agreement hunt seed 256: one request, async with a window of 11 one-token blocks on 8
    stages, 25 ms hops with empirical jitter drawn from 0.8-87 ms. Blocks queue behind late
    ones (no overtaking) as several requests' messages do, and the analytical tokens/s is +17%
    against the DES (three seeds of 256 requests; +10% in the hunt, masked by its 7.7%
    half-width) while validated: the jitter rule of loaded rings now covers async windows.
    With a window of one nothing queues: validated, and within the async band (10%) of the DES
    plus twice its half-width."""
    data = hunt.draw_scenario(256)
    ana = analyze(load_scenario(data=data))
    assert not ana.approximation["validated"]
    assert ana.approximation["why"].startswith("jitter beyond 5 ms (or heavy-tailed)")
    data["schedule"]["max_inflight_blocks"] = 1
    assert analyze(load_scenario(data=data)).approximation["validated"]
    ana, des, half, _ = _both(data)
    assert abs(ana - des) <= 0.10 * des + 2 * half, (ana, des, half)


def test_workload_prefill_share_by_hand():
    """Requests that differ: the prefills' share of the workload's work, not a node's. A stage
    of 10 ms + 0.1 ms a token without speculation: a 100-token prompt with 11 output tokens
    brings 20 ms of prefill and 10 x 10.1 ms of decode (16.5%), a 1,000-token prompt with 2
    brings 110 and 10.1 (91.6%). Weighted 3:1, the workload's share is (0.75 x 20 + 0.25 x
    110) / (0.75 x 121 + 0.25 x 120.1) = 35.2%."""
    from wansim.analytical.regime import prefill_share, workload_prefill_share

    short, long = _plain_ring(100, 11), _plain_ring(1000, 2)
    assert prefill_share(long) == pytest.approx(110.0 / 120.1, rel=1e-12)
    share = workload_prefill_share([(0.75, short), (0.25, long)])
    assert share == pytest.approx((0.75 * 20 + 0.25 * 110) / (0.75 * 121 + 0.25 * 120.1), rel=1e-12)


def test_varied_lengths_judge_the_workloads_prefill_share():
    """The approximation grid's varied-lengths point (8 users, lognormal lengths with CVs of
    1.0, no batching; measured within its band): its node of the longest prompts and shortest
    outputs is over half prefill on its own, which had made the whole workload not validated;
    the workload's prefills are under half of its work, so it is validated again."""
    from wansim.analytical.mixture import nodes
    from wansim.analytical.regime import (
        PREFILL_SHARE_MEASURED,
        prefill_share,
        workload_prefill_share,
    )
    from wansim.studies.approximation_error import REFERENCE, points

    over = next(
        o
        for g, o in points(["varied-length tails"])
        if o.get("workload.lengths.kind") == "lognormal"
        and o.get("schedule.batching") == "none"
        and o["workload.concurrency"] == 8
    )
    sc = load_scenario(REFERENCE, over)
    weighted = nodes(sc)
    assert max(prefill_share(n) for _, n in weighted) > PREFILL_SHARE_MEASURED
    assert workload_prefill_share(weighted) < PREFILL_SHARE_MEASURED
    assert analyze(sc).approximation["validated"]


def test_jitter_share_by_hand():
    """Two stages of 1 ms, 10 ms hops with 2 ms of normal jitter at 100 Gbit/s, no
    speculation: a lap is 1 + 10 + 1 + 10 ms (the bytes' wire time ~0, a jitter five sds
    below the latency ~never clamped), and the ring's jitter sqrt(2) x 2 ms: 12.9% of it."""
    from wansim.analytical.regime import jitter_share

    data = {
        "stages": 2,
        "model": {
            "hidden_size": 64,
            "compute": {"kind": "linear", "base_ms": 1.0, "per_token_ms": 0.0},
        },
        "network": {
            "latency_ms": 10.0,
            "bandwidth_mbps": 100_000.0,
            "jitter": {"kind": "normal", "std_ms": 2.0},
        },
        "speculation": {"policy": "none"},
        "workload": {"requests": 4, "prompt_tokens": 8, "output_tokens": 8},
    }
    assert jitter_share(load_scenario(data=data)) == pytest.approx(2.0 * 2**0.5 / 22.0, rel=1e-3)


def test_jitter_against_the_lap_behind_an_async_window():
    """Agreement hunt seed 2028 (fresh hunt 1900-2099): async with a window of 4 and an
    overlapped drafter, one request at a time (one KV slot), 4 stages of 5 ms hops with 5 ms
    of lognormal jitter: 22% of the lap, where the async grid measured up to 13% (its 2-stage,
    5 ms points). Tokens/s +14% and the mean TTFT -11% against the DES while validated (bands
    8% and 1%). Now not validated, naming the share. With 1 ms of jitter (7%) it is
    validated and within its band plus twice the DES's half-width (+3%)."""
    data = hunt.draw_scenario(2028)
    ana = analyze(load_scenario(data=data))
    assert not ana.approximation["validated"]
    assert "of the lap behind an async window" in ana.approximation["why"]
    data["network"]["jitter"]["std_ms"] = 1.0
    assert analyze(load_scenario(data=data)).approximation["validated"]
    ana, des, half, _ = _both(data)
    assert abs(ana - des) <= 0.08 * des + 2 * half, (ana, des, half)


def test_kv_admission_with_requests_that_differ_is_not_validated():
    """Agreement hunt seed 1926: 4 users of the shipped trace's lengths behind an 8,225-token
    KV cache. Each kind of request was queued for slots of its own size (a long prompt's node
    as if every user were as long), where the DES's requests share one pool: the mean TTFT
    537 ms against the DES's 318-370 on 256 requests (four seeds), +45% to +69%, while
    validated (band 45%; the regime's name had even lost the queue). Now not validated, and
    the queue named."""
    ana = analyze(load_scenario(data=hunt.draw_scenario(1926)))
    assert not ana.approximation["validated"]
    assert "KV admission queue" in ana.approximation["regime"]
    assert ana.approximation["why"].startswith("KV admission with requests that differ")


def test_requests_that_differ_on_a_ring_that_locks_their_phases_are_not_validated():
    """Agreement hunt seed 2198 (fresh hunt 2100-2399, found by ``--deepen``): 8 users of the
    shipped trace's lengths without speculation on 10 stages of 5 ms hops without jitter or
    loss. Each node of like requests is a deterministic ring whose requests never wait (lap
    111 ms), while the run's unequal lengths mix their phases and they queue (lap 155 ms):
    tokens/s +37% against the DES on 192 requests (deterministic: every seed alike) while
    validated (band 20%). Now not validated. With 3 ms of jitter (phases mixed in both
    engines) it is validated again, and within its band of the DES (+6% on 192 requests)."""
    data = hunt.draw_scenario(2198)
    ana = analyze(load_scenario(data=data))
    assert not ana.approximation["validated"]
    assert ana.approximation["why"].startswith("requests that differ without speculation")
    data["network"]["jitter"] = {"kind": "lognormal", "std_ms": 3.0}
    assert analyze(load_scenario(data=data)).approximation["validated"]
    ana, des, half, _ = _both(data)
    assert abs(ana - des) <= 0.20 * des + 2 * half, (ana, des, half)


def test_continuous_batching_with_a_cost_per_sequence_is_not_validated():
    """Agreement hunt seed 2485 (fresh hunt 2400-2699, found by ``--deepen``): 4 users batched
    on 3 stages, 2 ms a stage for each sequence beyond the first, a chain of 3 at 95%
    acceptance. The sequences finish apart and the DES's batch splits into groups that pay
    less of the cost than the lockstep batch: tokens/s -12% against the DES on 192 requests
    (half-width 1.3%) while validated (band 8%). Now not validated; without the cost per
    sequence it is validated and within its band (+1%)."""
    data = hunt.draw_scenario(2485)
    ana = analyze(load_scenario(data=data))
    assert not ana.approximation["validated"]
    assert "cost per sequence" in ana.approximation["why"]
    del data["model"]["sequence_ms"], data["drafter"]["sequence_ms"]
    assert analyze(load_scenario(data=data)).approximation["validated"]
    ana, des, half, _ = _both(data)
    assert abs(ana - des) <= 0.08 * des + 2 * half, (ana, des, half)


def test_batched_requests_that_differ_in_output_without_speculation_are_not_validated():
    """Agreement hunt seed 2095 (fresh hunt 1900-2099, found by ``--deepen``): 4 users batched
    on 10 stages without speculation, lognormal lengths (prompt CV 1.0, output CV 0.6). Each
    node's batch of like requests finishes together and refills in one wave of 4 prompts;
    the run's outputs end apart and their replacements prefill in small groups: the mean
    TTFT 1,703 ms against the DES's ~1,000 (+70% to +87%) while validated (band 45%); tokens/s
    exact. Now not validated; with equal outputs (prompts still varied) it stays validated."""
    data = hunt.draw_scenario(2095)
    ana = analyze(load_scenario(data=data))
    assert not ana.approximation["validated"]
    assert ana.approximation["why"].startswith("continuous batching of requests that differ")
    data["workload"]["lengths"]["output_cv"] = 0.0
    assert analyze(load_scenario(data=data)).approximation["validated"]


def test_blocks_that_outrun_a_hop_are_not_validated():
    """Agreement hunt seed 3973 (one request, the per-round hybrid at 0.8, window 4, K = 7,
    hidden 7168 on 100 Mbit/s hops): each block's 114,752 bytes hold the forward hop 9.18 ms,
    while S0 issues a block every lap / 4 = 5.4 ms, so the blocks queue at that hop; the block
    recursion takes hops as pure delays: tokens/s +19% against the DES while it was validated
    (band 12%). Its ratio by hand, and not validated now; at 10 Gbit/s the hop keeps up (the
    ratio is the later stage's compute against S0's) and the rule says nothing."""
    from wansim.analytical.regime import block_stream_ratio
    from wansim.analytical.sync import sync_metrics

    sc = load_scenario(data=hunt.draw_scenario(3973))
    ser_ms = 114_752 * 8 / 100e6 * 1e3
    lap = float(sync_metrics(sc)["lap_ms_mean"])
    assert block_stream_ratio(sc) == pytest.approx(ser_ms / (lap / 4), rel=1e-9)
    trust = analyze(sc).approximation
    assert trust["validated"] is False
    assert "outrun" in trust["why"]
    fast = hunt.draw_scenario(3973)
    fast["network"] = {**fast["network"], "bandwidth_mbps": 10_000.0}
    assert block_stream_ratio(load_scenario(data=fast)) < 1.0
    ana, des = analyze(sc).metrics["tokens_per_s"], simulate(sc).metrics["tokens_per_s"]
    assert ana / des - 1.0 > 0.12, (ana, des)  # the miss the rule names


def test_batches_of_requests_that_differ_beyond_the_measured_users_are_not_validated():
    """The slow suite's fresh examples found 32 users of the shipped trace in one continuous
    batch (4 stages, K = 3: the batch would not gain from splitting) validated while off by
    +38% on throughput and +117% on the mean TTFT against the DES; the varied-length grid's
    validated batches have 8 users (its 32-user ones split and are not validated). Beyond 8
    users such a batch is not validated; at 8 it still is."""
    from tests.conftest import REFERENCE

    over = {
        "seed": 0,
        "stages": 4,
        "speculation.k": 3,
        "workload.output_tokens": 128,
        "schedule.batching": "continuous",
        "workload.lengths.kind": "trace",
        "workload.trace": "traces/requests/synthetic-chat-code.csv",
        "workload.requests": 96,
    }
    wide = analyze(load_scenario(REFERENCE, {**over, "workload.concurrency": 32}))
    assert wide.approximation["validated"] is False
    assert "beyond 8 users" in wide.approximation["why"]
    narrow = analyze(load_scenario(REFERENCE, {**over, "workload.concurrency": 8}))
    assert narrow.approximation["validated"] is True


def test_a_replacements_prefill_waits_for_the_last_stages_drafting():
    """Agreement hunt seed 4430 (2 stages, a 60 ms DSpark drafter on the last stage, 8 users
    of continuous batching, trees of 8 nodes): at the verdict that admits a replacement the
    last stage drafts the continuing sequences for 60 ms, and the replacement's prefill, there
    ~17 ms later (13 ms at S0, a 30 Gbit/s hop), waits for the rest: the DES's mean TTFT 73.9
    ms against 33.9 while validated (band 15%). By hand: prefill of 512 tokens at 3 + 0.02 x
    512 = 13.24 ms a stage, the 7.3 MB prompt on the 1 ms, 30 Gbit/s hop ~3 ms, so a wait of
    ~44 ms. Now within the TTFT band (measured +2.7%); with the drafter on S0 nothing waits."""
    sc = load_scenario(data=hunt.draw_scenario(4430))
    ana = analyze(sc)
    des = simulate(sc).metrics  # (seeded: the hunt's run, its TTFT half-width 4.4%)
    # (its tokens/s, +17% on a long run, is the groups that alternate at that drafting pass:
    # not validated, test_groups_that_alternate_at_a_long_drafting_pass_are_not_validated)
    assert "slower split" in ana.approximation["why"]
    err = ana.metrics["ttft_ms_mean"] / des["ttft_ms_mean"] - 1.0
    assert abs(err) <= 0.15, (ana.metrics["ttft_ms_mean"], des["ttft_ms_mean"])
    first = hunt.draw_scenario(4430)
    first["drafter"] = {**first["drafter"], "placement": "first_stage"}
    lone = analyze(load_scenario(data=first)).metrics["ttft_ms_mean"]
    assert lone < 40.0  # no drafting at the last stage to wait for


def test_groups_that_alternate_at_a_long_drafting_pass_are_not_validated():
    """Agreement hunt seed 4436 (6 stages of ~1 ms on 0.5 ms links, a 60 ms drafter on S0, 4
    users of continuous batching with the trace's lengths): the batch's pass at S0 takes ~61
    ms against ~13 ms for the rest of its lap, so a replacement's group misses the batch there,
    waits behind it, and the two groups alternate at S0 without ever both waiting when it
    frees: each lap takes two drafting passes (the DES's lap 119 ms against the lockstep 74 ms,
    tokens/s +52% while validated). The split's gain now counts the drafting (it was left out:
    0.0 where it is -66%), and a split that runs slower is not validated."""
    from wansim.analytical.batched import split_gain

    sc = load_scenario(data=hunt.draw_scenario(4436))
    assert split_gain(sc) < -0.5
    trust = analyze(sc).approximation
    assert trust["validated"] is False and "slower split" in trust["why"]
    # seed 4430 (the last stage's 60 ms drafting against 46 ms for the rest of the lap):
    # -15%, its tokens/s +17% against a long DES run while validated (band 8%)
    seed_4430 = load_scenario(data=hunt.draw_scenario(4430))
    assert -0.2 < split_gain(seed_4430) < -0.1
    assert analyze(seed_4430).approximation["validated"] is False
    lone = hunt.draw_scenario(4436)
    lone["drafter"] = {**lone["drafter"], "draft_ms": 1.0}
    assert split_gain(load_scenario(data=lone)) > -0.2  # a short drafting pass: no alternation
    ana = analyze(sc).metrics["tokens_per_s"]
    des = simulate(sc).metrics["tokens_per_s"]
    assert ana / des - 1.0 > 0.3, (ana, des)  # the miss the rule names
