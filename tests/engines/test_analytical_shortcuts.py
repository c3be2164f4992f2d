"""The analytical engine's shortcuts (issue 18: the agreement hunt's analytical answers took
~2 s each): the resequencing wait in closed form per segment with its rate-free part computed
once per fixed point (against a fine integration), and, to the bit, the exact pass-count
recurrences remembered per survival table and the fixed points that stop once their state no
longer moves."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engines.test_analytical_regressions import _ring
from wansim.acceptance import closed_form
from wansim.analytical import analyze, concurrent
from wansim.analytical.resequencing import Resequencing, delay_atoms
from wansim.config.network import Jitter
from wansim.config.scenario import load_scenario, scenario_to_dict


def _brute_resequencing_ms(rate: float, values: np.ndarray, weights: np.ndarray) -> float:
    """E[R] = sum_i w_i int_{v_i}^{max v} (1 - exp(-rate psi(y))) dy, psi(y) = E[(X - y)^+],
    by a fine midpoint rule (independent of the engine's 96-point grid and interpolation)."""
    top = values.max()
    total = 0.0
    for v, w in zip(values, weights, strict=True):
        if v >= top:
            continue
        y = np.linspace(v, top, 20_001)
        mid = 0.5 * (y[1:] + y[:-1])
        psi = (weights[None, :] * np.maximum(values[None, :] - mid[:, None], 0.0)).sum(1)
        total += w * float(((1.0 - np.exp(-rate * psi)) * np.diff(y)).sum())
    return total


@settings(max_examples=40)
@given(
    rates=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=6),
    loss=st.floats(0.0, 0.05),
    std_ms=st.floats(0.0, 8.0),
)
def test_one_resequencing_answers_every_rate_as_a_fresh_one(rates, loss, std_ms):
    """The object keeps nothing from one rate to the next: called at several rates in turn it
    gives each rate a fresh object's answer, to the bit, and the one-shot function's."""
    jitter = Jitter(kind="lognormal", std_ms=std_ms) if std_ms > 0 else Jitter(kind="none")
    values, weights = delay_atoms(5.0, jitter, loss, 200.0, 0.1)
    shared = Resequencing(values, weights)
    for rate in rates:
        got = shared(rate)
        assert np.array_equal(got, Resequencing(values, weights)(rate))
    both = shared(np.array(rates))  # a vector of rates at once: each rate's own answer
    assert np.array_equal(both, np.array([Resequencing(values, weights)(r) for r in rates]))


@pytest.mark.parametrize(
    ("rate", "loss", "std_ms"),
    [(0.05, 0.02, 3.0), (0.2, 0.0, 6.0), (2.0, 0.1, 1.0), (0.001, 0.3, 10.0)],
)
def test_resequencing_against_a_fine_integration(rate, loss, std_ms):
    """The closed form per segment against a 20,000-step midpoint rule. (The 96-point grid it
    replaced was 23% high in the lossless case: the zero-weight retransmission atoms stretched
    the grid to 620 ms over a jitter of ~15 ms; 0.6% in the first.)"""
    values, weights = delay_atoms(5.0, Jitter(kind="lognormal", std_ms=std_ms), loss, 200.0, 0.1)
    want = _brute_resequencing_ms(rate, values, weights)
    assert float(Resequencing(values, weights)(rate)) == pytest.approx(want, rel=1e-5)


def test_resequencing_of_many_hops_is_each_hops_own():
    """Leading axes (hops with their own latency and loss, rates per point) broadcast: each
    entry is its own hop's answer."""
    jitter = Jitter(kind="lognormal", std_ms=2.0)
    lat = np.array([[2.0, 2.0, 2.0], [8.0, 8.0, 8.0]])
    loss = np.array([[0.0, 0.01, 0.05], [0.0, 0.01, 0.05]])
    values, weights = delay_atoms(lat, jitter, loss, 150.0, 0.2)
    rates = np.array([[0.01, 0.1, 0.4], [0.05, 0.0, 1.0]])
    got = Resequencing(values, weights)(rates)
    assert got.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            one_v, one_w = delay_atoms(float(lat[i, j]), jitter, float(loss[i, j]), 150.0, 0.2)
            assert got[i, j] == pytest.approx(Resequencing(one_v, one_w)(rates[i, j]), rel=1e-12)
    assert got[1, 1] == 0.0  # nothing offered, nothing held


def test_pass_moments_are_remembered_as_copies_and_the_memo_is_bounded(monkeypatch):
    """A remembered table answers as the recurrences do, a caller's edit of an answer does not
    reach the next caller, and the memo drops its oldest entries at its bound."""
    monkeypatch.setattr(closed_form, "_EXACT_MEMO", {})
    monkeypatch.setattr(closed_form, "EXACT_MEMO_ENTRIES", 3)
    surv = np.array([[0.8, 0.6, 0.4], [0.7, 0.4, 0.2]])
    first = closed_form.passes_moments(surv, 40)
    first[0][:] = -1.0  # the caller's own copy
    again = closed_form.passes_moments(surv, 40)
    closed_form._EXACT_MEMO.clear()
    fresh = closed_form.passes_moments(surv, 40)
    assert np.array_equal(again[0], fresh[0]) and np.array_equal(again[1], fresh[1])
    assert np.all(again[0] > 1.0)
    for m in (10, 20, 30, 50):
        closed_form.passes_moments(surv, m)
    assert len(closed_form._EXACT_MEMO) == 3
    assert {key[2] for key in closed_form._EXACT_MEMO} == {20, 30, 50}
    monkeypatch.setattr(closed_form, "EXACT_MEMO_MAX_VALUES", 4)  # a table too large to keep
    big = closed_form.passes_moments(surv, 60)
    assert len(closed_form._EXACT_MEMO) == 3 and all(k[2] != 60 for k in closed_form._EXACT_MEMO)
    assert np.array_equal(big[0], closed_form.passes_moments_many([surv], [60])[0][0])


def test_many_tables_partly_remembered_answer_as_none_remembered(monkeypatch):
    """``passes_moments_many`` with some of its tables answered before (by either function)
    gives each table the value a memo-less run gives."""
    monkeypatch.setattr(closed_form, "_EXACT_MEMO", {})
    tables = [
        np.array([[0.9, 0.7], [0.6, 0.3]]),
        np.array([[0.5, 0.2, 0.1]]),
        np.array([[0.8, 0.6, 0.5, 0.3]]),
    ]
    ms = [64, 64, 64]
    cold = closed_form.passes_moments_many(tables, ms)
    closed_form._EXACT_MEMO.clear()
    closed_form.passes_moments(tables[1], 64)  # one remembered by the single-table function
    warm = closed_form.passes_moments_many(tables, ms)
    for (a_mean, a_var), (b_mean, b_var) in zip(cold, warm, strict=True):
        assert np.array_equal(a_mean, b_mean) and np.array_equal(a_var, b_var)
    again = closed_form.passes_moments_many(tables, ms)  # every one remembered now
    for (a_mean, a_var), (b_mean, b_var) in zip(cold, again, strict=True):
        assert np.array_equal(a_mean, b_mean) and np.array_equal(a_var, b_var)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_fixed_points_that_stop_when_settled_answer_as_the_full_count(monkeypatch, kind):
    """The closed network's bisection and its convoy sweeps stop once a step moves nothing;
    run to their full counts (the stop switched off) the answer is the same to the bit."""
    scenario = _ring(8, 0.01, kind)  # 8 requests on a lossy jittered ring
    calls = []
    settled = concurrent._settled

    def counted(now, before):
        calls.append(settled(now, before))
        return calls[-1]

    monkeypatch.setattr(concurrent, "_settled", counted)
    early = analyze(scenario)
    assert any(calls)  # the stop was taken
    monkeypatch.setattr(concurrent, "_settled", lambda now, before: False)
    full = analyze(scenario)
    assert json.dumps(early.metrics, sort_keys=True) == json.dumps(full.metrics, sort_keys=True)


def _dense_smoothed(atoms, weights, sd, points=4096):
    """The blurred atoms summed over every atom at every grid point (no merging, no reach)."""
    grid = np.linspace(np.min(atoms) - 6 * sd, np.max(atoms) + 6 * sd, points)
    dens = (weights[None, :] * np.exp(-0.5 * ((grid[:, None] - atoms) / sd) ** 2)).sum(1)
    return grid, dens / dens.sum()


@settings(max_examples=60, deadline=None)
@given(
    distinct=st.integers(1, 40),
    copies=st.integers(1, 50),
    span=st.floats(0.0, 2000.0),
    sd=st.floats(0.005, 50.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_smoothed_laps_are_the_dense_sum(distinct, copies, span, sd, seed):
    """The block schedule's lap density (equal atoms merged, each grid chunk summing the atoms
    within reach) is the dense sum over every atom at every point, to 1e-12 of its peak, on
    the same grid: atoms repeated (as chains x jitter nodes repeat lap values) and spread far
    beyond the kernel's reach or inside it."""
    from wansim.analytical.engine import _smoothed

    rng = np.random.default_rng(seed)
    atoms = rng.choice(rng.uniform(0.0, span, distinct), distinct * copies)
    weights = rng.random(len(atoms))
    weights /= weights.sum()
    grid, dens = _smoothed(atoms, weights, sd)
    want_grid, want = _dense_smoothed(atoms, weights, sd)
    assert np.array_equal(grid, want_grid)
    assert np.max(np.abs(dens - want)) <= 1e-12 * np.max(want)


def test_chain_lengths_of_every_horizon_are_the_formula():
    """One table of r^g (1 - r) serves every horizon: P(fail at g) = r^g (1 - r) for g < h - 1
    and r^(h - 1) at the request's end, to the bit (computed here term by term), and each
    horizon's probabilities sum to 1."""
    from wansim.analytical.blocks import ChainLengths

    r = np.array([[0.0, 0.3, 0.95], [0.5, 0.999, 1.0]])
    lengths = ChainLengths(r, 40)
    for h in (1, 2, 7, 40):
        got = lengths(h)
        want = np.empty((*r.shape, h))
        for g in range(h):
            want[..., g] = r**g * (1.0 - r)
        want[..., -1] = r ** (h - 1)
        assert np.array_equal(got, want), h
        assert np.allclose(got.sum(-1), 1.0, atol=1e-12)
    lengths(3)[..., 0] = -1.0  # a horizon's array is the caller's: the table is not touched
    assert np.array_equal(lengths(3)[..., 0], 1.0 - r)


@pytest.mark.parametrize(
    ("kind", "overlap", "waits"),
    [("async", False, 0.0), ("async", False, 7.5), ("sync", True, np.array([0.0, 3.0, 40.0]))],
)
def test_stale_counts_over_the_wait_nodes_in_one_call_are_each_nodes_own(kind, overlap, waits):
    """The stale counts averaged over S0's (or the drafter's) wait nodes (fixed + spread x_i)
    come from one call with the nodes as a leading axis: each node's values are those of its
    own call (to 1e-12; the same arithmetic, summed in the same order), the other keys the
    first node's; a grid's waits (an array) keep their shape."""
    from wansim.analytical.blocks import block_schedule_metrics

    scenario = _ring(8, 0.01, kind)
    if overlap:
        scenario = load_scenario(
            data={**scenario_to_dict(scenario), "drafter": {"overlap": True, "draft_ms": 3.0}}
        )
    queue = "draft_wait" if overlap else "s0_wait"
    x, wx = np.polynomial.laguerre.laggauss(concurrent.WAIT_NODES)
    fixed = 0.5 * np.asarray(waits)
    got = concurrent.stale_over_nodes(scenario, queue, fixed, waits, x, wx, block_schedule_metrics)
    runs = [block_schedule_metrics(scenario, **{queue: fixed + np.asarray(waits) * xi}) for xi in x]
    want = dict(runs[0])
    for key in concurrent.STALE_KEYS:
        want[key] = sum(wi * r[key] for wi, r in zip(wx, runs, strict=True))
    assert set(got) == set(want)
    for key, value in want.items():
        value = np.asarray(value, dtype=float)
        assert np.shape(got[key]) == value.shape, key
        np.testing.assert_allclose(got[key], value, rtol=1e-12, atol=0, err_msg=key)
    counted = "stale_drafts_per_request" if overlap else "stale_blocks_s0_per_request"
    assert np.all(np.asarray(want[counted]) > 0)  # the case has stale work to count


@pytest.mark.parametrize("overlap", [False, True])
def test_restarts_of_all_jitter_nodes_at_once_are_each_nodes_own(monkeypatch, overlap):
    """The chain restarts of every verdict-jitter node computed at once (a leading axis) are
    each node's own, weighted and summed in node order: to the bit, against schedules that
    hold one node each (weight 1), at every horizon."""
    from wansim.analytical import blocks

    captured = []
    real = blocks.chain_schedule

    def keep(*args, **kwargs):
        captured.append(real(*args, **kwargs))
        return captured[-1]

    scenario = _ring(1, 0.01, "sync" if overlap else "async")
    if overlap:
        scenario = load_scenario(
            data={**scenario_to_dict(scenario), "drafter": {"overlap": True, "draft_ms": 3.0}}
        )
    monkeypatch.setattr(blocks, "chain_schedule", keep)
    blocks.block_schedule_metrics(scenario)
    sched = captured[0]
    assert len(sched.weights) == blocks.JITTER_NODES and (sched.drafted is not None) == overlap
    nodes = [
        dataclasses.replace(
            sched,
            heard=sched.heard[q : q + 1],
            started=sched.started[q : q + 1],
            finished=sched.finished[q : q + 1],
            drafted=None if sched.drafted is None else sched.drafted[q : q + 1],
            weights=np.ones(1),
        )
        for q in range(len(sched.weights))
    ]
    for h in range(1, sched.started.shape[-1] + 1):
        together = sched.restart(h)
        alone = [node.restart(h) for node in nodes]
        for key in ("cycle", "s0", "fwd", "draft", "cancel"):
            want = np.zeros_like(together[key])
            for wq, one in zip(sched.weights, alone, strict=True):
                want += wq * one[key]
            assert np.array_equal(together[key], want), (h, key)
        assert np.array_equal(together["gated"], alone[0]["gated"])
