"""The DES engine: conservation, FIFO links, seeds, concurrency, batching, exact cases."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import REFERENCE
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.links.wire_bytes import forward_bytes
from wansim.sim import simulate
from wansim.sim.messages import PREFILL
from wansim.sim.metrics import REQUEST_CI
from wansim.stages.compute import stage_ms

SMALL = {
    "name": "small",
    "stages": 4,
    "model": {
        "hidden_size": 512,
        "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.1},
    },
    "network": {
        "latency_ms": 10,
        "bandwidth_mbps": 100,
        "jitter": {"kind": "lognormal", "std_ms": 2},
    },
    "drafter": {"draft_ms": 1.5, "acceptance": {"alpha": 0.7}},
    "speculation": {"policy": "chain", "k": 4},
    "workload": {"requests": 12, "prompt_tokens": 32, "output_tokens": 40},
}


def small(**overrides):
    return load_scenario(data=SMALL, overrides=overrides)


def test_token_conservation_every_pass_and_request():
    for sc in (small(), small(**{"workload.concurrency": 3, "schedule.batching": "continuous"})):
        r = simulate(sc, timeline=True)
        log = np.array(r.details["timeline"].verify_log)  # rid, step, t, n, A, remaining, committed
        rid, step, n, a, remaining, committed = (log[:, i] for i in (0, 1, 3, 4, 5, 6))
        assert np.all(committed == np.minimum(a + 1, remaining))
        assert np.all((a >= 0) & (a <= sc.k)) and np.all(n == sc.k + 1)
        m = sc.workload.output_tokens - 1
        for req in range(sc.workload.requests):
            mine = rid == req
            assert committed[mine].sum() == m
            assert np.array_equal(step[mine], np.arange(1, mine.sum() + 1))  # one block at a time
        record = r.details["record"]
        assert np.all(record.committed == m)
        assert record.tokens_committed == committed.sum() == m * sc.workload.requests
        assert r.metrics["tau"] == pytest.approx(committed.sum() / len(log))
        assert r.metrics["wasted_token_fraction"] == pytest.approx(1 - committed.sum() / n.sum())


def test_links_are_fifo_and_propagation_does_not_occupy_them():
    # heavy normal jitter: without the no-overtaking rule later messages would arrive first
    sc = small(
        **{
            "network.jitter": {"kind": "normal", "std_ms": 8},
            "workload.concurrency": 4,
            "workload.requests": 20,
        }
    )
    r = simulate(sc, timeline=True)
    tl = r.details["timeline"]
    transfers = tl.transfers
    overlapped = 0
    for hop in range(sc.stages):
        mine = [t for t in transfers if t[0] == hop]  # in send order
        offer, start, busy_end, delivery = (np.array([t[i] for t in mine]) for i in (1, 2, 3, 4))
        assert np.all(np.diff(offer) >= 0)
        assert np.all(start >= offer) and np.all(start[1:] >= busy_end[:-1] - 1e-9)  # one at a time
        assert np.all(np.diff(delivery) >= 0)  # never overtakes
        assert np.all(delivery >= busy_end)
        overlapped += int(np.sum(start[1:] < delivery[:-1]))  # sent while the previous flies
    assert overlapped > 0
    # and the stages receive in that order: each stage computes a request's steps in order
    seen: dict[tuple[int, int], int] = {}
    for stage, _start, _end, what, passes in sorted(tl.stage_slices, key=lambda s: s[1]):
        if what == "verify":
            (p,) = passes
            key = (stage, p.request.rid)
            assert seen.get(key, 0) < p.step
            seen[key] = p.step


def test_small_messages_are_not_limited_by_latency():
    """The known simulator bug: if propagation held the link, 64 messages of 50 bytes on a
    100 ms link would take 6.4 s; serialisation alone takes microseconds."""
    sc = small(
        **{
            "stages": 1,
            "network.latency_ms": 100,
            "network.jitter": {"kind": "none"},
            "network.bandwidth_mbps": 1000,
            "workload.concurrency": 64,
            "workload.requests": 64,
            "workload.output_tokens": 2,
            "model.compute.base_ms": 0.0,
            "model.compute.per_token_ms": 0.0,
            "drafter.draft_ms": 0.0,
        }
    )
    r = simulate(sc, timeline=True)
    return_hop = [t for t in r.details["timeline"].transfers if t[0] == 0]
    assert len(return_hop) == 64
    assert max(t[4] for t in return_hop) < 101.0


def test_same_seed_same_results_different_seed_different_samples():
    a, b = simulate(small()), simulate(small())
    assert a.metrics == b.metrics
    assert np.array_equal(a.details["record"].laps_ms, b.details["record"].laps_ms)
    c = simulate(small(seed=1))
    assert c.metrics["tokens_per_s"] != a.metrics["tokens_per_s"]
    assert not np.array_equal(a.details["record"].passes, c.details["record"].passes)
    assert not np.array_equal(a.details["record"].laps_ms[:5], c.details["record"].laps_ms[:5])


def test_streams_are_independent_by_purpose():
    """Changing the link jitter leaves the acceptance draws alone (their own stream)."""
    a = simulate(small())
    b = simulate(small(**{"network.jitter": {"kind": "normal", "std_ms": 1}}))
    assert np.array_equal(a.details["record"].passes, b.details["record"].passes)
    assert not np.array_equal(a.details["record"].laps_ms, b.details["record"].laps_ms)


def test_deterministic_case_equals_closed_forms_exactly():
    """No jitter, no loss, no speculation: every metric is a number both engines must hit."""
    for extra in (
        {},
        {"stages": 1},
        {"drafter.placement": "first_stage", "drafter.kind": "draft_model"},
    ):
        sc = small(
            **{
                "network.jitter": {"kind": "none"},
                "speculation.policy": "none",
                "workload.requests": 3,
                **extra,
            }
        )
        des, ana = simulate(sc), analyze(sc)
        for name, value in ana.metrics.items():
            if isinstance(value, bool):
                assert des.metrics[name] is value, name
            else:
                assert des.metrics[name] == pytest.approx(value, rel=1e-9), name
        lo, hi = des.metrics["tokens_per_s_ci95"]
        assert lo == pytest.approx(hi) == pytest.approx(des.metrics["tokens_per_s"])


def test_hand_worked_lap_and_ttft():
    sc = small(**{"network.jitter": {"kind": "none"}, "workload.requests": 2})
    r = simulate(sc)
    ser = lambda b: b * 8 / (100 * 1000)  # noqa: E731  ms at 100 Mbit/s
    n = sc.k + 1
    fwd = 10 + ser(float(forward_bytes(sc.payload, 512, n)))
    lap = 1.5 + 4 * (2.0 + 0.1 * n) + 3 * fwd + 10 + ser(50)
    prefill = 4 * (2.0 + 0.1 * 32) + 3 * (10 + ser(float(forward_bytes(sc.payload, 512, 32))))
    assert r.metrics["lap_ms_p50"] == pytest.approx(lap) and r.metrics[
        "lap_ms_p99"
    ] == pytest.approx(lap)
    assert r.metrics["ttft_ms_mean"] == pytest.approx(prefill)


def test_per_hop_overrides_and_loss():
    hops = [{"latency_ms": 5 * (i + 1), "jitter": {"kind": "none"}} for i in range(4)]
    sc = small(
        **{"network.hops": hops, "network.jitter": {"kind": "none"}, "speculation.policy": "none"}
    )
    r = simulate(sc)
    n_bytes = float(forward_bytes(sc.payload, 512, 1))
    lap = 4 * (2.0 + 0.1) + (5 + 10 + 15 + 20) + 3 * n_bytes * 8 / 1e5 + 50 * 8 / 1e5
    assert r.metrics["lap_ms_mean"] == pytest.approx(lap)
    lossy = simulate(
        small(**{"network.loss_rate": 0.2, "network.retransmit_ms": 50}), timeline=True
    )
    transfers = lossy.details["timeline"].transfers
    assert any(t[6] > 0 for t in transfers)
    record = lossy.details["record"]
    wire = sum(t[5] * (1 + t[6]) for t in transfers)
    assert record.link_bytes.sum() == pytest.approx(wire)
    for t in transfers:  # a lost message holds the link for its retransmissions
        assert t[3] - t[2] == pytest.approx((1 + t[6]) * t[5] * 8 / 1e5)


def test_concurrency_fills_bubbles_and_respects_the_limit():
    one = simulate(small(**{"workload.requests": 16}))
    four = simulate(small(**{"workload.requests": 16, "workload.concurrency": 4}))
    u1, u4 = np.mean(one.metrics["stage_utilization"]), np.mean(four.metrics["stage_utilization"])
    assert u4 > 2.5 * u1
    assert four.metrics["throughput_tokens_per_s"] > 2.5 * one.metrics["throughput_tokens_per_s"]
    rec = four.details["record"]
    events = sorted([(t, 1) for t in rec.admitted_ms] + [(t, -1) for t in rec.finish_ms])
    assert max(np.cumsum([d for _, d in events])) <= 4
    assert four.details["warmup_requests"] == 4 and one.details["warmup_requests"] == 0
    assert four.details["ci_method"].startswith("batch means")


def test_continuous_batching_takes_the_whole_mailbox_as_one_pass():
    sc = small(
        **{
            "workload.concurrency": 4,
            "workload.requests": 8,
            "schedule.batching": "continuous",
            "network.jitter": {"kind": "none"},
        }
    )
    r = simulate(sc, timeline=True)
    slices = r.details["timeline"].stage_slices
    batched = [s for s in slices if len(s[4]) > 1 and s[3] != "draft"]
    assert batched
    for _stage, start, end, _what, passes in batched:
        tokens = sum(32 if p.kind == PREFILL else sc.k + 1 for p in passes)
        assert tokens == sum(p.n for p in passes)
        assert end - start == pytest.approx(float(stage_ms(sc.model.compute, tokens)))


def test_poisson_arrivals_wait_for_admission():
    sc = small(
        **{
            "workload.arrival": "poisson",
            "workload.rate_per_s": 50.0,
            "workload.requests": 40,
            "workload.concurrency": 2,
        }
    )
    r = simulate(sc)
    rec = r.details["record"]
    gaps = np.diff(rec.arrival_ms)
    assert np.all(gaps >= 0) and rec.arrival_ms[0] > 0
    assert 5 < gaps.mean() < 60  # 20 ms expected
    assert np.any(rec.admitted_ms > rec.arrival_ms)  # some waited: arrivals outpace service
    assert r.metrics["ttft_ms_mean"] > np.mean((rec.first_token_ms - rec.admitted_ms)[2:])


def test_drafting_occupies_the_stage_it_runs_on():
    for placement, stage in (("last_stage", 3), ("first_stage", 0)):
        sc = small(**{"drafter.placement": placement, "workload.requests": 2})
        r = simulate(sc, timeline=True)
        drafts = [s for s in r.details["timeline"].stage_slices if s[3] == "draft"]
        assert drafts and {s[0] for s in drafts} == {stage}
        passes = r.details["record"].verify_passes
        assert len(drafts) == passes  # after prefill and every verify but the last: N per request
        u = r.metrics["stage_utilization"]
        assert u[stage] > max(u[i] for i in range(4) if i != stage)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("speculation.policy", "tree"),
        ("schedule.hedge_branches", 2),
        ("schedule.max_inflight_blocks", 3),
    ],
)
def test_options_the_des_cannot_honour_are_input_errors(field, value):
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        simulate(small(**{field: value}))


def test_reference_agrees_with_analytical_within_the_interval():
    sc = load_scenario(REFERENCE)
    des, ana = simulate(sc), analyze(sc)
    lo, hi = des.metrics["tokens_per_s_ci95"]
    assert lo <= ana.metrics["tokens_per_s"] <= hi
    assert des.details["ci_method"] == REQUEST_CI


@pytest.mark.slow
def test_hundred_thousand_tokens_cost_bounded_events():
    """100k tokens cost a bounded number of SimPy events per verify pass (one long-lived process
    per stage, one timeout per pass, no per-token events): the work bound that makes the DES
    fast, counted rather than timed (a wall-clock assert fails by chance under load)."""
    sc = load_scenario(REFERENCE, ["workload.requests=391"])  # 100,096 output tokens
    r = simulate(sc, per_event=True)  # the event engine (a lone request: the lone ring, below)
    assert r.details["record"].output_tokens >= 100_000
    assert 0 < r.details["events"] <= 4 * sc.stages * r.details["verify_passes"]
    lone = simulate(sc)  # the vectorised lone ring: no event at all, the same metrics
    assert lone.details["events"] == 0 and lone.metrics == r.metrics
