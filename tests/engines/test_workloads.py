"""Workloads from data: length distributions, request traces (CSV/Parquet), bursty arrivals,
per-request acceptance mixes, in the DES and the analytical engine; the shipped trace."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import wansim
from tests.conftest import REFERENCE
from wansim.analytical.mixture import nodes
from wansim.config.scenario import load_scenario
from wansim.data import shipped
from wansim.serving.workload import arrival_gaps_ms, length_nodes, plan_requests, read_trace

SHIPPED = "traces/requests/synthetic-chat-code.csv"
FAST = ["workload.requests=40", "workload.output_tokens=64"]


def _sc(*sets):
    return load_scenario(REFERENCE, [*FAST, *sets])


def test_shipped_trace_is_package_data_and_says_how_it_was_made():
    path = shipped(SHIPPED)
    assert path is not None and path.is_file()
    head = path.read_text().splitlines()[:8]
    assert any("SYNTHETIC" in line for line in head)
    trace = read_trace(str(path))
    assert len(trace.prompt_tokens) == 300
    assert (np.diff(trace.arrival_ms) >= 0).all() and trace.arrival_ms[0] == 0
    assert trace.output_tokens.min() >= 2


def test_gamma_gaps_have_the_mean_and_cv_asked():
    """10^5 seeded gaps: mean within 2% (sd of the mean 0.3% at cv 1, 1% at cv 3)."""
    for cv in (0.5, 1.0, 3.0):
        wl = _sc(
            "workload.arrival=gamma", f"workload.arrival_cv={cv}", "workload.rate_per_s=2"
        ).workload
        gaps = arrival_gaps_ms(wl, np.random.default_rng(1), 100_000)
        assert gaps.mean() == pytest.approx(500.0, rel=0.04)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_onoff_rate_is_the_on_rate_times_the_duty_cycle():
    wl = _sc(
        "workload.arrival=onoff",
        "workload.rate_per_s=4",
        "workload.on_ms=2000",
        "workload.off_ms=6000",
    ).workload
    gaps = arrival_gaps_ms(wl, np.random.default_rng(2), 50_000)
    # long-run rate 4 * 2/8 = 1/s; 50,000 arrivals span ~12,500 on/off cycles: within 3%
    assert 1e3 * len(gaps) / gaps.sum() == pytest.approx(1.0, rel=0.03)
    assert gaps.std() / gaps.mean() > 1.3  # burstier than Poisson (cv 1)


def test_lognormal_lengths_have_the_means_asked():
    wl = _sc(
        "workload.lengths.kind=lognormal",
        "workload.lengths.prompt_cv=0.8",
        "workload.lengths.output_cv=0.5",
        "workload.requests=50000",
        "workload.output_tokens=200",
    ).workload
    plan = plan_requests(wl, np.random.default_rng(3))
    assert plan.prompt_tokens.mean() == pytest.approx(512, rel=0.02)
    assert plan.output_tokens.mean() == pytest.approx(200, rel=0.02)
    assert plan.prompt_tokens.std() / plan.prompt_tokens.mean() == pytest.approx(0.8, rel=0.08)
    w, p, o = length_nodes(wl)
    # Gauss-Hermite nodes in log space reproduce the means (up to rounding)
    assert w @ p == pytest.approx(512, rel=0.01) and w @ o == pytest.approx(200, rel=0.01)


def test_des_runs_the_trace_rows_in_order():
    sc = _sc(f"workload.trace={SHIPPED}", "workload.arrival=trace", "workload.lengths.kind=trace")
    rec = wansim.simulate(sc).details["record"]
    trace = read_trace(str(shipped(SHIPPED)))
    np.testing.assert_array_equal(rec.decode_tokens, trace.output_tokens[:40] - 1)
    np.testing.assert_allclose(rec.arrival_ms, trace.arrival_ms[:40], atol=1e-6)


def test_parquet_trace_equals_its_csv(tmp_path):
    trace = read_trace(str(shipped(SHIPPED)))
    frame = pd.DataFrame(
        {
            "arrival_ms": trace.arrival_ms,
            "prompt_tokens": trace.prompt_tokens,
            "output_tokens": trace.output_tokens,
        }
    )
    frame.to_parquet(tmp_path / "t.parquet")
    common = ["workload.arrival=trace", "workload.lengths.kind=trace"]
    a = wansim.simulate(_sc(f"workload.trace={tmp_path / 't.parquet'}", *common)).metrics
    b = wansim.simulate(_sc(f"workload.trace={SHIPPED}", *common)).metrics
    assert a["tokens_per_s"] == b["tokens_per_s"] and a["e2e_ms_p99"] == b["e2e_ms_p99"]


def test_a_fixed_workload_draws_as_before():
    """The default lengths draw nothing: a Poisson run's arrivals are the exponential gaps of
    the arrival stream, as before the workload fields existed."""
    from wansim.links.draws import ring_seeds

    sc = _sc("workload.arrival=poisson", "workload.rate_per_s=0.5")
    rec = wansim.simulate(sc).details["record"]
    rng = np.random.default_rng(ring_seeds(sc.seed, sc.stages)[2])
    np.testing.assert_allclose(rec.arrival_ms, np.cumsum(rng.exponential(2000.0, 40)))


def test_mix_gives_each_request_its_rows_acceptance():
    """A 50/50 math/chat mix: the DES's tau sits between the all-math and all-chat runs', and
    the analytical engine's expectation agrees with the DES within 5%."""
    many = ["workload.requests=400", "workload.output_tokens=32"]
    tau = {}
    for row in ("math", "chat"):
        tau[row] = wansim.simulate(_sc(*many, f"drafter.acceptance.workload={row}")).metrics["tau"]
    # 400 requests: the realised share of each row has sd 2.5%, ~1.5% of tau
    sc = _sc(*many, "workload.mix=[{workload: math, share: 1}, {workload: chat, share: 1}]")
    des, ana = wansim.simulate(sc).metrics, wansim.analyze(sc)
    assert tau["chat"] < des["tau"] < tau["math"]
    assert ana.metrics["tau"] == pytest.approx(des["tau"], rel=0.05)
    assert ana.approximation["validated"] is False


@pytest.mark.parametrize(
    "sets",
    [
        [
            "workload.lengths.kind=lognormal",
            "workload.lengths.prompt_cv=0.8",
            "workload.lengths.output_cv=0.8",
            "workload.requests=200",
        ],
        [f"workload.trace={SHIPPED}", "workload.lengths.kind=empirical", "workload.requests=200"],
    ],
)
def test_engines_agree_on_means_over_lengths(sets):
    """Expectations over the length distribution: the means within 5% (the DES's 200 requests
    carry ~2-3% sampling error in their mean lengths), TTFT p50/p99 within 25%."""
    sc = _sc(*sets)
    des, ana = wansim.simulate(sc).metrics, wansim.analyze(sc).metrics
    for name in ("tokens_per_s", "throughput_tokens_per_s", "tau", "lap_ms_mean", "ttft_ms_mean"):
        assert ana[name] == pytest.approx(des[name], rel=0.05), name
    for name in ("ttft_ms_p50", "ttft_ms_p99"):
        assert ana[name] == pytest.approx(des[name], rel=0.25), name


def test_nodes_weigh_to_one_and_carry_the_rows():
    sc = _sc(
        "workload.lengths.kind=lognormal",
        "workload.lengths.prompt_cv=0.5",
        "workload.mix=[{workload: math, share: 3}, {workload: code, share: 1}]",
    )
    got = nodes(sc)
    assert sum(w for w, _ in got) == pytest.approx(1.0)
    by_row = {}
    for w, node in got:
        by_row[node.drafter.acceptance.workload] = (
            by_row.get(node.drafter.acceptance.workload, 0) + w
        )
        assert node.workload.lengths.kind == "fixed" and not node.workload.mix
    assert by_row == pytest.approx({"math": 0.75, "code": 0.25})


def _write(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "rows, needle",
    [
        ("0,10,-5\n1,10,20\n", "workload.trace[row 1].output_tokens: must be a whole number"),
        ("0,-3,5\n", "workload.trace[row 1].prompt_tokens: must be a whole number"),
        ("0,10,5\n50,10,5\n20,10,5\n", "workload.trace[row 3].arrival_ms: times must be sorted"),
        ("0,10,5.5\n", "output_tokens: must be a whole number"),
        ("nan,10,5\n", "arrival_ms: must be a finite number"),
    ],
)
def test_bad_trace_is_one_line(run_cli, tmp_path, rows, needle):
    path = _write(tmp_path, "arrival_ms,prompt_tokens,output_tokens\n" + rows)
    code, out, err = run_cli(
        "run",
        REFERENCE,
        "--engine",
        "des",
        "--set",
        f"workload.trace={path}",
        "--set",
        "workload.arrival=trace",
        "--set",
        "workload.lengths.kind=trace",
        "--set",
        "workload.requests=1",
    )
    assert code == 2 and out == ""
    assert needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "sets, needle",
    [
        (["workload.arrival=trace"], "workload.trace: arrival: trace needs a trace file"),
        ([f"workload.trace={SHIPPED}"], "workload.trace: is read only by arrival: trace"),
        (
            [f"workload.trace={SHIPPED}", "workload.lengths.kind=trace", "workload.requests=301"],
            "workload.requests: the trace has 300 rows",
        ),
        (["workload.lengths.prompt_cv=0.5"], "prompt_cv/output_cv need kind: lognormal"),
        (
            ["workload.mix=[{workload: poetry, share: 1}]"],
            "workload.mix[0].workload: not in profile",
        ),
        (["workload.arrival=burst"], "workload.arrival"),
    ],
)
def test_bad_workload_fields_are_one_line(run_cli, sets, needle):
    argv = [a for s in sets for a in ("--set", s)]
    code, _, err = run_cli("validate", REFERENCE, *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_analytical_engine_answers_open_arrivals_with_faults(run_cli):
    """Every fault kind with open arrivals is answered (tests/physics/test_open_faults.py
    checks the numbers against the DES)."""
    sets = ["workload.arrival=gamma", "faults.recovery=fail", "faults.events=[{stage: 1, at_s: 1}]"]
    code, out, err = run_cli("run", REFERENCE, "--json", *[a for s in sets for a in ("--set", s)])
    assert code == 0, err
    metrics = json.loads(out)["metrics"]
    assert metrics["availability"] < 1.0 and metrics["failed_requests"] > 0
