"""The agreement hunt (``wansim.studies.agreement_hunt``): random valid scenarios across every
mechanism, both engines. A point whose analytical tokens/s lies beyond its own error band plus
twice the DES's 95% half-width must say ``validated: false`` (no silent error); properties
over concurrency > 1: more bandwidth or less latency never lowers tokens/s (analytical: at
all; DES: beyond its interval), and no stage is busy more than all the time.

The default suite runs a slice; ``-m slow`` runs a few hundred points and the properties on
fresh examples (``derandomize=False``)."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.errors import WansimInputError
from wansim.sim import simulate
from wansim.studies import agreement_hunt as hunt

# a slice across the mechanisms (sync, trees, loss, per-hop links, async, overlap, concurrency,
# continuous batching; issue 13's per-message costs, payload per hop, noise, stragglers, drift,
# faults, tcp, flush, hybrid), each cheap for the DES; 26 and 43: validated TTFT on deterministic
# rings
FAST_SEEDS = (3, 8, 10, 16, 20, 24, 25, 26, 33, 43, 53, 70, 75, 83, 103, 137, 151, 152)
WAN_PHYSICS = {
    "per-message",
    "payload-hops",
    "noise",
    "stragglers",
    "drift",
    "faults",
    "tcp",
    "flush",
    "hybrid",
}


def check(row: dict) -> None:
    assert not row["refused"].startswith("analytical crashed"), row
    if row["refused"]:
        return
    if row["out_of_band"]:
        assert not row["validated"], (row["seed"], row["mechanisms"], row["err tokens_per_s"])
    # validated: the mean TTFT within its band too (plus twice the DES's half-width on it)
    ttft_beyond = bool(hunt.ttft_beyond(pd.DataFrame([row])).iloc[0])
    assert not (row["validated"] and ttft_beyond), (row["seed"], row["err ttft_ms_mean"])
    assert row["ana max_utilization"] <= 1.0 + 1e-9, row


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_hunt_slice_agrees_or_says_so(seed):
    check(hunt.evaluate(seed))


# async and overlap points of the hunt with an autoregressive drafter (one pass per token):
# a block drafted on a bet drafts the guess first, K + 1 passes (one rule in both engines,
# wansim.speculation.block_schedule.bet_draft_ms); with it in the DES alone, seed 29 was
# +36.8% and seed 80 +17.7% (hybrid 8, overlap 20 and 67, loaded 80, both 106). Not here:
# seed 71 (4 requests, S0 saturated by 360-420 ms drafts): tokens/s +0.6%, but the mean TTFT
# -58% (-53% before bets cost the guess), validated: a prefill waits behind the other
# requests' blocks parked at S0, which the prefill's phase rule spares it (docs/schedules.md)
AUTOREGRESSIVE_SEEDS = (8, 20, 29, 67, 80, 106)


@pytest.mark.parametrize("seed", AUTOREGRESSIVE_SEEDS)
def test_hunt_block_schedule_with_an_autoregressive_drafter(seed):
    data = hunt.draw_scenario(seed)
    data["drafter"]["parallel"] = False
    row = hunt.evaluate(seed, data)
    assert not row["refused"], row["refused"]
    assert "async" in row["mechanisms"] or "overlap" in row["mechanisms"]
    check(row)


def test_hunt_slice_covers_the_mechanisms():
    tags = {t for s in FAST_SEEDS for t in hunt.mechanisms(hunt.draw_scenario(s)).split("+")}
    assert {"async", "overlap", "concurrent", "batching", "tree", "loss", "hops"} <= tags
    assert tags >= WAN_PHYSICS


@pytest.mark.slow
def test_hunt_a_few_hundred_points():
    table = hunt.run(range(300), workers=2)
    for _, row in table.iterrows():
        check(row.to_dict())
    s = hunt.summary(table)
    assert s["silent"] == 0 and s["ttft_silent"] == 0, s
    # the target: fewer than 2% of the points beyond their regime's documented band + 2x the
    # DES's half-width, validated or not
    assert s["beyond_documented_share"] < 0.02, s


# ----------------------------------------------------------------------------- properties
def _loaded(seed: int) -> dict:
    """A hunt scenario with at least two requests in flight."""
    data = hunt.draw_scenario(seed)
    wl = data["workload"]
    if wl["concurrency"] < 2:
        wl["concurrency"] = 4
        wl["requests"] = max(wl["requests"], 16)
    return data


def _faster(data: dict, field: str, factor: float) -> dict:
    out = copy.deepcopy(data)
    out["network"][field] *= factor
    for hop in out["network"].get("hops", []):
        hop[field] *= factor
    return out


def _analytical_monotone(seed: int) -> None:
    data = _loaded(seed)
    try:
        base = analyze(load_scenario(data=data))
    except WansimInputError:
        return
    assert max(base.metrics["stage_utilization"]) <= 1.0 + 1e-9
    rate = base.metrics["tokens_per_s"]
    # the block schedule on a loaded ring solves its stale blocks as a fixed point over 4
    # Laguerre nodes of S0's wait, and how many stale blocks S0 starts before the verdict is a
    # step function of the lap against S0's service: 1.8% in 60 hunt points, 3.7% at seed
    # 792290 (S0 saturated, no jitter: latency x0.9 steps TTFT +23 ms, tokens/s -3.7% at the
    # same throughput; the DES itself steps there, +33% throughput between latency x1.0 and
    # x0.97, as the verdict comes just after or just before S0 starts the stale block). That
    # step is the tolerance there; elsewhere the bisections' 0.1% (seed 704: 0.012%)
    blocks_loaded = "concurrent" in base.approximation["regime"] and (
        "async" in base.approximation["regime"] or "overlap" in base.approximation["regime"]
    )
    # a loaded ring is a closed loop: a faster prefill returns a request to the decode
    # queues sooner, so more of them decode at once and each one's rate can dip while the
    # throughput rises (seed 1012: 16 requests, no speculation, bandwidth x4: -0.3%)
    loaded = "concurrent" in base.approximation["regime"]
    tolerance = 0.04 if blocks_loaded else 5e-3 if loaded else 1e-3
    # ... and in a closed loop the requests' cycle time is N / X: where the throughput X does
    # not fall, Little's law moves the TTFT a faster link saves into the decode, so the rate
    # per request may fall to M / (D + saved TTFT) (seed 152, a station saturated: TTFT
    # -37.5 ms, tokens/s -2.8% on 1.28 s of decode, throughput unchanged; seeds 617613 and
    # 902833, near saturation: bandwidth x4 saves 0.18 s and 1.3 s of TTFT, tokens/s -0.95%
    # and -3.8% while the throughput rises 0.1% and 16%)
    saturated = loaded and max(base.metrics["stage_utilization"]) >= 1.0 - 1e-9
    decode_s = (data["workload"]["output_tokens"] - 1) / rate
    for field, factor in (("bandwidth_mbps", 4.0), ("latency_ms", 0.5)):
        better = analyze(load_scenario(data=_faster(data, field, factor))).metrics
        floor = rate
        if saturated:
            assert better["throughput_tokens_per_s"] >= base.metrics["throughput_tokens_per_s"] * (
                1 - 1e-3
            ), (seed, field)
        throughput_kept = better["throughput_tokens_per_s"] >= base.metrics[
            "throughput_tokens_per_s"
        ] * (1 - 1e-3)
        if loaded and throughput_kept:
            saved_s = max(base.metrics["ttft_ms_mean"] - better["ttft_ms_mean"], 0.0) / 1e3
            floor = rate * decode_s / (decode_s + saved_s)
        assert better["tokens_per_s"] >= floor * (1 - tolerance), (seed, field)


@settings(max_examples=15)
@given(seed=st.integers(0, 10**6))
@example(seed=617613)  # near saturation: Little's law (found by the fresh run)
@example(seed=902833)
@example(seed=18660)  # drift, micro-batches and a failure: the averaged ring had no makespan
@example(seed=2058)  # 16 requests behind 158 ms prefills: the stagger's switch (found fresh)
def test_analytical_monotone_and_utilisation_at_most_one(seed):
    _analytical_monotone(seed)


@pytest.mark.slow
@settings(max_examples=200, derandomize=False)
@given(seed=st.integers(0, 10**6))
@example(seed=792290)  # the stale-block step (~1 minute)
@example(seed=902031)  # tcp: a train idling past the RTO every third frame (~45 s)
@example(seed=6049)  # a saturated drafter stage: the parked prefill kept Little's law
def test_analytical_monotone_and_utilisation_at_most_one_fresh(seed):
    _analytical_monotone(seed)


def _des_monotone(seed: int) -> None:
    data = _loaded(seed)
    base = simulate(load_scenario(data=data)).metrics
    assert max(base["stage_utilization"]) <= 1.0 + 1e-9
    low = base["tokens_per_s_ci95"][0]
    for field, factor in (("bandwidth_mbps", 4.0), ("latency_ms", 0.5)):
        better = simulate(load_scenario(data=_faster(data, field, factor))).metrics
        b_high = better["tokens_per_s_ci95"][1]
        # beyond noise: the faster run's interval lies wholly below the base run's
        assert not b_high < low, (seed, field, base["tokens_per_s"], better["tokens_per_s"])


@settings(max_examples=4)
@given(seed=st.integers(0, 10**6))
def test_des_monotone_and_utilisation_at_most_one(seed):
    _des_monotone(seed)


@pytest.mark.slow
@settings(max_examples=60, derandomize=False)
@given(seed=st.integers(0, 10**6))
def test_des_monotone_and_utilisation_at_most_one_fresh(seed):
    _des_monotone(seed)


def test_the_hunts_text_names_only_the_mechanisms_its_table_has():
    """docs/approximations.md once claimed issue 13's draws for a table made before them: the
    paragraph now reads them from the table's ``mechanisms``."""
    older = pd.DataFrame({"mechanisms": ["sync", "async+loss", "concurrent+hops"]})
    assert "predate" in hunt.drawn_in(older)
    newer = pd.DataFrame({"mechanisms": ["loss+tcp", "async+flush+hybrid", "sync"]})
    text = hunt.drawn_in(newer)
    assert "tcp (1)" in text and "the flush protocol (1)" in text and "hybrid (1)" in text
    assert "per-message" not in text and "drift" not in text


def test_reanswered_keeps_the_des_and_repeats_an_unchanged_engine():
    """``reanswered`` (``--reanswer CSV``) answers a table's points again with the analytical
    engine and keeps the DES's columns: on an unchanged engine the table comes back as it
    was, a stale analytical column is replaced (its error and verdict with it), a refused
    point passes through."""
    rows = [hunt.evaluate(seed) for seed in (20, 24)]
    five = hunt.mechanisms(hunt.draw_scenario(5))
    rows.append({"seed": 5, "mechanisms": five, "refused": "network.transport: ..."})
    table = pd.DataFrame(rows)
    table["refused"] = table["refused"].fillna("")
    again = hunt.reanswered(table)
    pd.testing.assert_frame_equal(again, table)
    stale = table.copy()
    stale.loc[0, "ana tokens_per_s"] *= 2.0
    stale.loc[0, "err tokens_per_s"] = 1.0
    stale.loc[1, "des tokens_per_s"] *= 2.0  # the DES's columns are the table's
    fixed = hunt.reanswered(stale)
    assert fixed.loc[0, "ana tokens_per_s"] == table.loc[0, "ana tokens_per_s"]
    assert fixed.loc[0, "err tokens_per_s"] == table.loc[0, "err tokens_per_s"]
    d, a = stale.loc[1, "des tokens_per_s"], table.loc[1, "ana tokens_per_s"]
    assert fixed.loc[1, "err tokens_per_s"] == (a - d) / d
    # a point drawn differently now (its mechanisms differ) is another scenario: both engines
    moved = table.copy()
    moved.loc[0, "mechanisms"] = "sync"
    moved.loc[0, "des tokens_per_s"] *= 2.0
    rerun = hunt.reanswered(moved)
    assert rerun.loc[0, "mechanisms"] == table.loc[0, "mechanisms"]
    assert rerun.loc[0, "des tokens_per_s"] == table.loc[0, "des tokens_per_s"]


def test_reanswer_of_a_table_where_nothing_was_refused(tmp_path, capsys):
    """A hunt with no refused point writes its ``refused`` column empty, which pandas reads
    back as floats: ``--reanswer`` blanks it without a pandas warning (filling floats with a
    string warns in pandas 3 and is an error in pandas 4) and repeats the table's answer."""
    import warnings

    table = tmp_path / "hunt.csv"
    pd.DataFrame([hunt.evaluate(20)]).assign(refused="").to_csv(table, index=False)
    assert pd.read_csv(table, keep_default_na=False, na_values=[""])["refused"].dtype == float
    out = tmp_path / "again.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hunt.main(["--reanswer", str(table), "--out", str(out)]) == 0
    assert "refused: 0" in capsys.readouterr().out
    again = pd.read_csv(out)
    assert again["ana tokens_per_s"].iloc[0] == pytest.approx(
        pd.read_csv(table)["ana tokens_per_s"].iloc[0], rel=1e-5
    )


@pytest.mark.parametrize("flag", ["--reanswer", "--deepen"])
def test_rework_of_a_missing_or_foreign_table_is_one_line(flag, tmp_path, capsys):
    """``--reanswer`` or ``--deepen`` of a file that is not there, or of a CSV without the
    hunt's columns: exit 2 and one line naming the option, the file and what is missing; no
    output table is written."""
    out = tmp_path / "o.csv"
    assert hunt.main([flag, str(tmp_path / "none.csv"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{flag}:") and "none.csv" in err and "\n" not in err
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("seed,mechanisms\n1,sync\n")
    assert hunt.main([flag, str(foreign), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{flag}:") and "foreign.csv" in err and "\n" not in err
    assert "lacks the columns refused, " in err and "mechanisms" not in err.split("lacks")[1]
    assert not out.exists()


def test_the_hunt_draws_its_scenarios_from_any_folder(tmp_path, monkeypatch):
    """Seed 44 sizes a KV capacity from the shipped request trace; the draw read it relative to
    the working folder, so a hunt started outside the checkout stopped at its first such point
    (seed 1090 of a hunt run from another folder). It reads the shipped copy now."""
    monkeypatch.chdir(tmp_path)
    data = hunt.draw_scenario(44)
    assert data["workload"]["kv_capacity_tokens"] > 0
    load_scenario(data=data)


def test_deepen_candidates_are_validated_points_inside_their_noise_only():
    """A validated point whose error is beyond its band but inside the band plus twice the
    DES's half-width is a candidate (tokens/s or TTFT); one inside its band, one already
    counted silent (out of band), and an unvalidated one are not."""
    base = {
        "seed": 1,
        "refused": "",
        "regime": "sync",
        "band": 0.03,
        "validated": True,
        "out_of_band": False,
        "err tokens_per_s": 0.0,
        "err ttft_ms_mean": 0.0,
        "des ttft_ms_mean": 100.0,
        "des_ttft_half_rel": 0.5,
    }
    rows = [
        {**base, "err tokens_per_s": 0.05},  # beyond 3%, inside its noise
        {**base, "err ttft_ms_mean": 0.05},  # beyond the sync TTFT band (1%), inside 1% + 100%
        {**base, "err tokens_per_s": 0.02},  # inside its band
        {**base, "err tokens_per_s": 0.30, "out_of_band": True},  # counted silent already
        {**base, "err tokens_per_s": 0.05, "validated": False},
    ]
    assert list(hunt.deepen_candidates(pd.DataFrame(rows))) == [True, True, False, False, False]


def test_deepened_runs_the_des_again_on_the_candidates():
    """Seed 2 (validated, sync band 3%): +7.4% against the DES's 16 requests, whose half-width
    is 24% - a candidate. Deepened (2 seeds of 64 requests) its pooled half-width shrinks and
    the answer stays inside band + 2 half-widths (not silent); seed 20 (+0.2%) is not run."""
    table = pd.DataFrame([hunt.evaluate(2), hunt.evaluate(20)])
    table["refused"] = table["refused"].fillna("")
    deep = hunt.deepened(table)
    first, second = deep.iloc[0], deep.iloc[1]
    assert first["deep des_half_rel"] < first["des_half_rel"] / 2
    assert abs(first["deep err tokens_per_s"]) <= 0.03 + 2 * first["deep des_half_rel"]
    assert not first["deep silent"] and not first["deep ttft_silent"]
    assert pd.isna(second["deep des tokens_per_s"])
    s = hunt.summary(deep)
    assert (s["deepened"], s["deep_silent"], s["deep_ttft_silent"]) == (1, 0, 0)
    assert hunt.main(["--deepen", "/nonexistent.csv"]) == 2
