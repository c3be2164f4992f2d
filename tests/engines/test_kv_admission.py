"""Memory-aware admission (``workload.kv_capacity_tokens``): requests reserve prompt + output
at admission, queue FIFO when the KV cache is full, and are never preempted; both engines."""

from __future__ import annotations

import numpy as np
import pytest

import wansim
from tests.conftest import REFERENCE
from wansim.config.scenario import load_scenario

BASE = [
    "workload.requests=64",
    "workload.output_tokens=64",
    "workload.concurrency=8",
    "schedule.batching=continuous",
]
NEED = 512 + 64  # prompt + output of one request


def _sc(*sets):
    return load_scenario(REFERENCE, [*BASE, *sets])


def _in_flight_at_admissions(rec, need):
    """Reserved tokens just after each admission, recomputed from the record's intervals."""
    out = []
    for t in rec.admitted_ms:
        live = (rec.admitted_ms <= t) & (rec.finish_ms > t)
        out.append(float(need[live].sum()))
    return np.array(out)


@pytest.mark.parametrize("slots", [1, 3, 6])
def test_des_never_holds_more_than_the_capacity(slots):
    cap = slots * NEED + NEED // 2  # room for `slots` requests, not one more
    rec = wansim.simulate(_sc(f"workload.kv_capacity_tokens={cap}")).details["record"]
    need = np.full(len(rec.arrival_ms), float(NEED))
    reserved = _in_flight_at_admissions(rec, need)
    assert reserved.max() <= cap
    assert reserved.max() == slots * NEED  # and the capacity is used
    assert (np.diff(rec.admitted_ms) >= 0).all()  # FIFO: admitted in arrival order
    assert (rec.committed == rec.decode_tokens).all()  # nobody preempted or cut short


def test_varied_lengths_respect_the_capacity():
    cap = 3000
    sc = _sc(
        "workload.lengths.kind=lognormal",
        "workload.lengths.output_cv=1.0",
        "workload.lengths.max_output_tokens=1024",
        "workload.lengths.max_prompt_tokens=1024",
        f"workload.kv_capacity_tokens={cap}",
    )
    rec = wansim.simulate(sc).details["record"]
    need = 512.0 + rec.decode_tokens + 1.0
    assert _in_flight_at_admissions(rec, need).max() <= cap


def test_a_capacity_that_holds_the_whole_batch_changes_nothing():
    free = wansim.simulate(_sc()).metrics
    roomy = wansim.simulate(_sc(f"workload.kv_capacity_tokens={8 * NEED}")).metrics
    assert roomy == free


@pytest.mark.parametrize("cap, slots", [(2000, 3), (1000, 1)])
def test_engines_agree_on_the_admission_queue(cap, slots):
    """8 users on `slots` slots: throughput within 5%, the mean queueing delay (Little's law
    over the users' cycle in the analytical engine) within 10%."""
    sc = _sc(f"workload.kv_capacity_tokens={cap}")
    des, ana = wansim.simulate(sc), wansim.analyze(sc)
    assert ana.details["kv_admission"]["slots"] == slots
    assert "KV admission queue" in ana.approximation["regime"]
    d, a = des.metrics, ana.metrics
    assert a["throughput_tokens_per_s"] == pytest.approx(d["throughput_tokens_per_s"], rel=0.05)
    assert d["queue_ms_mean"] > 0
    assert a["queue_ms_mean"] == pytest.approx(d["queue_ms_mean"], rel=0.10)
    assert a["ttft_ms_mean"] == pytest.approx(d["ttft_ms_mean"], rel=0.10)


def test_analytical_queue_is_littles_law_by_hand():
    """One slot (kv holds one request), 4 users: W = users / X - T with X and T those of one
    request at a time."""
    alone = wansim.analyze(load_scenario(REFERENCE, ["workload.output_tokens=64"])).metrics
    sc = load_scenario(
        REFERENCE,
        [
            "workload.output_tokens=64",
            "workload.concurrency=4",
            f"workload.kv_capacity_tokens={NEED}",
        ],
    )
    m = wansim.analyze(sc).metrics
    x_per_ms = alone["throughput_tokens_per_s"] / 1e3 / 64
    residence = 1.0 / x_per_ms  # one at a time: a request's time is the run's time per request
    assert m["queue_ms_mean"] == pytest.approx(4 / x_per_ms - residence, rel=0.02)


@pytest.mark.parametrize(
    "sets, needle",
    [
        (
            ["workload.kv_capacity_tokens=700"],
            "workload.kv_capacity_tokens: holds fewer tokens than one request needs"
            " (prompt_tokens + output_tokens = 768)",
        ),
        (
            ["workload.kv_capacity_tokens=4000", "workload.lengths.kind=lognormal"],
            "(lengths.max_prompt_tokens + max_output_tokens = 163840)",
        ),
        (
            [
                "workload.kv_capacity_tokens=1000",
                "workload.trace=traces/requests/synthetic-chat-code.csv",
                "workload.lengths.kind=empirical",
            ],
            "the trace's row 146 prompt + output = 8225",
        ),
    ],
)
def test_a_batch_that_cannot_fit_is_one_line(run_cli, sets, needle):
    argv = [a for s in sets for a in ("--set", s)]
    code, out, err = run_cli("run", REFERENCE, *argv)
    assert code == 2 and out == ""
    assert needle in err and len(err.strip().splitlines()) == 1
