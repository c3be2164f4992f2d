"""``wansim capacity`` (SLO capacity search) and ``optimize`` on any metric with constraints."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import wansim
from tests.conftest import REFERENCE, strict_loads
from wansim.config.scenario import load_scenario
from wansim.studies.capacity import DES_ROUNDS, RANGE_RATIO, metric_band, search_index, widened
from wansim.studies.constraints import BOUNDABLE, parse_bound

SMALL = ["--set", "workload.output_tokens=48", "--set", "workload.requests=24"]


@given(st.integers(-50, 50), st.integers(-60, 60), st.integers(-50, 0), st.integers(0, 50))
def test_search_finds_the_threshold_of_a_monotone_predicate(threshold, start, low, high):
    start = min(max(start, low), high)
    calls = []

    def holds(i):
        calls.append(i)
        return i <= threshold

    got = search_index(holds, start, low, high)
    want = None if threshold < low else min(threshold, high)
    assert got == want
    assert len(calls) == len(set(calls))  # each point run once
    assert all(low <= i <= high for i in calls)


def test_bounds_parse_and_check():
    b = parse_bound("--slo", "tpot_ms_p99<=60")
    assert (b.metric, b.op, b.value) == ("tpot_ms_p99", "<=", 60.0)
    assert b.holds({"tpot_ms_p99": 60.0}) and not b.holds({"tpot_ms_p99": 60.1})
    assert not b.holds({"tpot_ms_p99": None})  # undefined never meets a bound
    g = parse_bound("--constraint", "goodput_requests_per_s>=0.5")
    assert g.holds({"goodput_requests_per_s": 0.5}) and not g.holds({"goodput_requests_per_s": 0.4})


def test_capacity_closed_loop_is_the_largest_concurrency_meeting_the_slo(run_cli):
    # an SLO whose analytical range is well inside RANGE_RATIO ([11, 15]; at tpot_ms_p99<=300
    # it is [9, 14], 1.56x, just beyond it, so not validated: the rule the next tests cover)
    slo = ["--slo", "tpot_ms_p99<=320", "--slo", "ttft_ms_p99<=2500"]
    code, out, err = run_cli(
        "capacity", REFERENCE, *slo, *SMALL, "--set", "schedule.batching=continuous", "--json"
    )
    assert code == 0, err
    data = strict_loads(out)
    c = data["max_concurrency"]
    assert data["engine"] == "des" and data["searched"] == "workload.concurrency"
    assert c is not None and c >= 2
    # the DES confirmed it: the answer holds and the next concurrency fails, in the DES
    des = {
        e["workload.concurrency"]: e["holds"] for e in data["evaluations"] if e["engine"] == "des"
    }
    assert des[c] is True and des[c + 1] is False
    assert data["at"]["tpot_ms_p99"] <= 320 and data["at"]["ttft_ms_p99"] <= 2500
    # the analytical answer, checked by running the analytical engine at it and one above
    a = data["analytical"]
    sets = [s for s in SMALL if s != "--set"] + ["schedule.batching=continuous"]

    def meets(conc):
        requests = max(24, DES_ROUNDS * conc)  # the scenario the DES runs at conc users
        m = wansim.analyze(
            load_scenario(
                REFERENCE, [*sets, f"workload.concurrency={conc}", f"workload.requests={requests}"]
            )
        ).metrics
        return m["tpot_ms_p99"] <= 320 and m["ttft_ms_p99"] <= 2500

    assert meets(a) and not meets(a + 1)
    # its range under the model's own band brackets it, narrow enough to vouch for it here
    low, high = data["analytical_range"]
    assert low <= a <= high and data["analytical_validated"] is True


def test_analytical_search_runs_the_users_the_des_runs(run_cli):
    """c users need c requests: the analytical search ran the scenario's 64 requests whatever
    the concurrency, so beyond 64 users nothing changed and tpot_ms_p99<=250 'held' up to the
    search's end (1024) where the DES found 61. Brute force over the concurrencies, each with
    the requests the DES runs, gives the same threshold as the search."""
    code, out, err = run_cli(
        "capacity", REFERENCE, "--slo", "tpot_ms_p99<=250", "--engine", "analytical", "--json"
    )
    assert code == 0, err
    data = strict_loads(out)
    a = data["max_concurrency"]
    assert "at_search_limit" not in data and a < 64

    def holds(conc):
        sets = [f"workload.concurrency={conc}", f"workload.requests={max(64, DES_ROUNDS * conc)}"]
        return wansim.analyze(load_scenario(REFERENCE, sets)).metrics["tpot_ms_p99"] <= 250

    assert [holds(c) for c in range(a - 3, a + 4)] == [True] * 4 + [False] * 3
    low, high = data["analytical_range"]
    assert low < a < high


def test_an_answer_resting_on_a_flat_metric_is_not_validated(run_cli):
    """TTFT p99 on the reference ring is one prefill lap, nearly flat in the users (978 ms at
    8 users, 1017 at 32 in the DES): within the model's band it holds from 1 user to ~100, so
    the analytical answer (38-40 users; the DES: 10-16) is flagged, with the reason."""
    code, out, err = run_cli(
        "capacity", REFERENCE, "--slo", "ttft_ms_p99<=1000", "--engine", "analytical", "--json"
    )
    assert code == 0, err
    data = strict_loads(out)
    low, high = data["analytical_range"]
    assert data["analytical_validated"] is False
    assert "changes by less than the analytical engine's error band" in data["analytical_why"]
    assert low is None or high > RANGE_RATIO * low


def test_bands_move_bounds_the_documented_way():
    band = {
        "tokens_per_s": 0.1,
        "throughput_tokens_per_s": 0.2,
        "ttft_ms_mean": 0.4,
        "bubble_fraction": 0.05,
        "wasted_token_fraction": 0.02,
    }
    assert metric_band("tpot_ms_p99", band) == (0.1, True)
    assert metric_band("ttft_ms_p50", band) == (0.4, True)
    assert metric_band("queue_ms_mean", band) == (0.4, True)
    assert metric_band("goodput_requests_per_s", band) == (0.2, True)
    assert metric_band("bubble_fraction", band) == (0.05, False)
    assert metric_band("tpot_ms_p99", {**band, "tpot_ms_p99": 0.5}) == (0.5, True)  # measured
    up = parse_bound("--slo", "tpot_ms_p99<=100")
    assert widened(up, 0.1, True, +1).value == pytest.approx(110)
    assert widened(up, 0.1, True, -1).value == pytest.approx(90)
    down = parse_bound("--slo", "goodput_requests_per_s>=2")
    assert widened(down, 0.2, True, +1).value == pytest.approx(1.6)  # loosened: lower
    frac = parse_bound("--slo", "bubble_fraction<=0.5")
    assert widened(frac, 0.05, False, -1).value == pytest.approx(0.45)


def test_capacity_open_arrivals_search_the_rate_and_the_des_confirms(run_cli):
    """Open arrivals: the analytical engine's flow-equivalent queue brackets the rate, the DES
    confirms on the same grid (the answer is the DES's; the analytical one is not validated)."""
    code, out, err = run_cli(
        "capacity",
        REFERENCE,
        "--slo",
        "queue_ms_mean<=2000",
        *SMALL,
        "--set",
        "workload.arrival=poisson",
        "--set",
        "workload.rate_per_s=0.05",
        "--json",
    )
    assert code == 0, err
    data = strict_loads(out)
    rate = data["max_request_rate_per_s"]
    assert data["engine"] == "des" and data["analytical"] is not None
    assert data["analytical_validated"] is False and "open arrivals" in data["analytical_why"]
    runs = {
        e["workload.rate_per_s"]: e["holds"] for e in data["evaluations"] if e["engine"] == "des"
    }
    assert runs[rate] is True
    above = min(r for r in runs if r > rate)
    assert runs[above] is False and above / rate == pytest.approx(1.02)
    assert data["at"]["queue_ms_mean"] <= 2000


def test_capacity_none_sustainable_is_null_with_a_reason(run_cli):
    code, out, _ = run_cli("capacity", REFERENCE, "--slo", "tpot_ms_p99<=1", *SMALL, "--json")
    data = strict_loads(out)
    assert code == 0 and data["max_concurrency"] is None and data["at"] is None
    assert "fails at the lowest" in data["reason"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--slo", "tpot_p99<=60"], "unknown metric 'tpot_p99' (known: tokens_per_s"),
        (["--slo", "tpot_ms_p99=60"], "expected METRIC<=VALUE"),
        (["--slo", "tpot_ms_p99<=fast"], "the bound must be a number"),
        ([], "--slo: give at least one"),
        (["--slo", "tpot_ms_p99<=60", "--engine", "warp"], "--engine: must be auto"),
    ],
)
def test_capacity_bad_input_is_one_line(run_cli, argv, needle):
    code, out, err = run_cli("capacity", REFERENCE, *argv)
    assert code == 2 and out == ""
    assert needle in err and len(err.strip().splitlines()) == 1
    if "unknown metric" in needle:
        assert all(name in err for name in BOUNDABLE)


def test_optimize_a_tail_with_a_constraint(run_cli):
    code, out, err = run_cli(
        "optimize",
        REFERENCE,
        "--over",
        "speculation.k=2..6",
        "--metric",
        "tpot_ms_p99",
        "--constraint",
        "ttft_ms_p99<=1000",
        "--confirm",
        "none",
        "--json",
    )
    assert code == 0, err
    data = strict_loads(out)
    assert data["metric"] == "tpot_ms_p99" and data["direction"] == "min"
    best = data["best"]
    k = best["config"]["speculation.k"]
    # the tail is the analytical engine's own, point by point
    m = wansim.analyze(load_scenario(REFERENCE, [f"speculation.k={k}"])).metrics
    assert best["tpot_ms_p99"] == pytest.approx(m["tpot_ms_p99"])
    for other in range(2, 7):
        mo = wansim.analyze(load_scenario(REFERENCE, [f"speculation.k={other}"])).metrics
        assert mo["tpot_ms_p99"] >= m["tpot_ms_p99"] or mo["ttft_ms_p99"] > 1000
    assert data["flags"] and "edge of the grid" in data["flags"][0]  # k = 6 is the top


def test_optimize_flags_extrapolated_acceptance(run_cli):
    code, out, err = run_cli(
        "optimize",
        REFERENCE,
        "--over",
        "speculation.k=4..12",
        "--set",
        "drafter.acceptance.extrapolate=true",
        "--confirm",
        "none",
        "--json",
    )
    assert code == 0, err
    data = strict_loads(out)
    assert data["best"]["config"]["speculation.k"] > 7
    assert any("extrapolated acceptance" in f and "measured 7" in f for f in data["flags"])


def test_optimize_constraint_nobody_meets_is_one_line(run_cli):
    code, _, err = run_cli(
        "optimize",
        REFERENCE,
        "--over",
        "speculation.k=2..4",
        "--constraint",
        "tokens_per_s>=1e6",
        "--confirm",
        "none",
    )
    assert code == 2 and "--constraint: no evaluated point meets" in err
    assert len(err.strip().splitlines()) == 1


def test_a_tail_without_its_own_band_is_not_vouched_for_with_varied_lengths():
    """An expectation over workload nodes vouches only for the tails its band names (TPOT
    p99); a bound on another tail says why; requests alike keep the mean's band."""
    from wansim.studies.capacity import unmeasured_tail

    varied = {
        "regime": "concurrent + expectation over 14 workload nodes",
        "validated": True,
        "error_band": {"tokens_per_s": 0.2, "ttft_ms_mean": 0.35, "tpot_ms_p99": 0.3},
    }
    assert unmeasured_tail(["tpot_ms_p99", "tokens_per_s"], varied) == ""
    why = unmeasured_tail(["ttft_ms_p99"], varied)
    assert why.startswith("ttft_ms_p99 with varied request lengths: no band measured")
    assert "measured: tpot_ms_p99" in why
    alike = {**varied, "regime": "concurrent"}
    assert unmeasured_tail(["ttft_ms_p99"], alike) == ""
