"""The concrete triggers the fuzzing found (issue 17), each as a named example.

Before the fixes each one crashed (the exception is in the test's name), hung, exhausted
memory or returned NaN/inf; now each is either a one-line error naming the field or a finite
result computed with bounded work.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from wansim.analytical import analyze
from wansim.config import user_yaml
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError, WansimInputError
from wansim.sim import simulate

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "scenarios" / "v4pro-dspark-10stage-wan.yaml"
SMALL = {
    "stages": 2,
    "drafter": {"acceptance": {"alpha": 0.7}},
    "speculation": {"k": 3},
    "workload": {"requests": 2, "prompt_tokens": 8, "output_tokens": 12},
}


def one_line_error(excinfo, path: str, fragment: str) -> str:
    text = str(excinfo.value)
    assert "\n" not in text and len(text) <= 400, text
    assert text.startswith(f"{path}:"), text
    assert fragment in text, text
    return text


def finite_metrics(result) -> None:
    for key, value in result.metrics.items():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float):
                assert math.isfinite(v), (key, v)


def with_(base: dict, **sections) -> dict:
    out = yaml.safe_load(yaml.safe_dump(base))
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


# ----------------------------------------------------------------------------- loading
@pytest.mark.parametrize("document", ["scenario", [1, 2], 3])
def test_attribute_error_str_has_no_get_document_not_a_mapping(document):
    """`AttributeError: 'str' object has no attribute 'get'` in scenario.py."""
    with pytest.raises(ScenarioError) as err:
        load_scenario(data=document)
    one_line_error(err, "scenario", "must be a mapping")


@pytest.mark.parametrize("kind", [["linear"], {"x": 1}])
def test_type_error_unhashable_list_where_a_kind_is_expected(kind):
    """`TypeError: unhashable type: 'list'` in validation.py."""
    with pytest.raises(ScenarioError) as err:
        load_scenario(data={"model": {"compute": {"kind": kind}}})
    one_line_error(err, "model.compute.kind", "must be one of linear | roofline | moe | table")


@pytest.mark.parametrize(
    "field, value",
    [
        ("network.latency_ms", int("9" * 400)),
        ("workload.requests", int("9" * 400)),
        ("stages", -(10**309)),
        ("network.loss_rate", 10**400),
    ],
)
def test_overflow_error_integers_over_308_digits(field, value):
    section, _, key = field.rpartition(".")
    data = {section: {key: value}} if section else {key: value}
    with pytest.raises(ScenarioError) as err:
        load_scenario(data=data)
    text = one_line_error(err, field, "must be")
    assert "-digit integer" in text  # not 400 digits in the error line


@pytest.mark.parametrize(
    "overrides, path, fragment",
    [
        (["network.latency_ms=1e308"], "network.latency_ms", "at most 1e+09 in magnitude"),
        (["network.bandwidth_mbps=1e-308"], "network.bandwidth_mbps", "at least 1e-09"),
        (["network.jitter.std_ms=1.7976931348623157e308"], "network.jitter.std_ms", "at most"),
        (["network.latency_ms=1e12"], "network.latency_ms", "at most 1e+09 in magnitude"),
        (["network.loss_rate=0.99999"], "network.loss_rate", "must be <= 0.99"),
        (["network.loss_rate=0.99999999"], "network.loss_rate", "must be <= 0.99"),
        (["workload.requests=1e9"], "workload.requests", "must be <= 1e+06"),
        (["network.latency_ms=.nan"], "network.latency_ms", "must be a finite number"),
        (["stages=&a [*a]"], "stages", "refers to a collection that contains it"),
    ],
)
def test_values_near_the_float_limits_are_rejected_with_their_field(overrides, path, fragment):
    with pytest.raises(ScenarioError) as err:
        load_scenario(REFERENCE, overrides)
    one_line_error(err, path, fragment)


def test_set_reads_1e3_as_a_number():
    sc = load_scenario(REFERENCE, ["network.bandwidth_mbps=1e3"])
    assert sc.network.bandwidth_mbps == 1000.0


def test_recursion_error_deep_nesting_in_data_and_files(tmp_path):
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ScenarioError) as err:
        load_scenario(data={"network": {"hops": deep}})
    one_line_error(err, "network.hops[0][0]...", "nested more than 32 deep")
    loop: dict = {}
    loop["x"] = loop
    with pytest.raises(ScenarioError) as err:
        load_scenario(data={"model": loop})
    one_line_error(err, "model.x.x.x...", "or contains itself")
    f = tmp_path / "deep.yaml"
    f.write_text("model: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(WansimInputError) as err:
        load_scenario(f)
    one_line_error(err, "scenario", "nested more than 32 deep")
    f.write_text("model: &a {compute: *a}\n")
    with pytest.raises(WansimInputError) as err:
        load_scenario(f)
    one_line_error(err, "scenario", "alias *a refers to a collection that contains it")


def test_unicode_decode_error_non_utf8_files(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_bytes(b"stages: 4\nname: \xff\xfe\n")
    with pytest.raises(WansimInputError) as err:
        load_scenario(f)
    one_line_error(err, "scenario", "not UTF-8 text (byte 0xff at offset 16)")
    f.write_bytes(b"\xef\xbb\xbfstages: 3\n")  # a byte-order mark is fine
    assert load_scenario(f).stages == 3
    profile = tmp_path / "p.yaml"
    profile.write_bytes(b"\xff\xff")
    with pytest.raises(WansimInputError) as err:
        load_scenario(data={"drafter": {"acceptance": {"profile": str(profile)}}})
    one_line_error(err, "profile", "not UTF-8 text")


def test_billion_laughs_is_rejected_before_any_object_is_built(tmp_path, monkeypatch):
    """A 9-level alias bomb (~400 bytes, 9**9 leaves) hung even `wansim validate`: it is now
    rejected on the parser's event stream, before construction (yaml.load is never called)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    bomb = "\n".join(lines) + "\nname: *a8\n"
    assert len(bomb) < 600
    f = tmp_path / "bomb.yaml"
    f.write_text(bomb)

    def never(*args, **kwargs):
        raise AssertionError("constructed the bomb")

    monkeypatch.setattr(user_yaml.yaml, "load", never)
    with pytest.raises(WansimInputError) as err:
        load_scenario(f)
    one_line_error(err, "scenario", "expands to more than 1,000,000 values")


def test_aliases_within_the_limit_still_work(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text(
        "stages: 2\nnetwork: {hops: [&h {latency_ms: 5}, *h]}\n"
        "drafter: {acceptance: {alpha: 0.7}}\n"
    )
    assert [h.latency_ms for h in load_scenario(f).network.hops] == [5.0, 5.0]


@pytest.mark.parametrize("content", ["nan\n1\n", "1\ninf\n", "1e400\n", "1e308\n"])
def test_value_error_jitter_samples_file_with_nan_or_inf(tmp_path, content):
    """A samples file holding nan/inf tripped the DES's unfinished-requests check and the
    analytical quantile solver (ValueError in distribution.py); it is now checked at load."""
    (tmp_path / "s.txt").write_text(content)
    jitter = {"kind": "empirical", "samples_file": "s.txt"}
    with pytest.raises(ScenarioError) as err:
        load_scenario(data=with_(SMALL, network={"jitter": jitter}), base_dir=tmp_path)
    one_line_error(err, "network.jitter.samples_file", "must be a finite number")
    hops = [{}, {"jitter": jitter}]
    with pytest.raises(ScenarioError) as err:
        load_scenario(data=with_(SMALL, network={"hops": hops}), base_dir=tmp_path)
    one_line_error(err, "network.hops[1].jitter.samples_file", "must be a finite number")


def test_error_lines_stay_one_short_line():
    with pytest.raises(ScenarioError) as err:
        load_scenario(data={"model": {"compute": {"line\nbreak": "x" * 10_000}}})
    text = one_line_error(err, "model.compute.line\\nbreak", "unknown key")
    assert len(text) < 300
    with pytest.raises(ScenarioError) as err:
        load_scenario(data={"drafter": {"acceptance": {"per_position": [0.5] * 5000}}})
    one_line_error(err, "drafter.acceptance.per_position", "at most 4,096 items")


# ----------------------------------------------------------------------------- engines
def test_sequoia_4096_nodes_is_refused_in_one_line_not_run_for_minutes():
    """A 4096-node Sequoia tree took 35 s (hours at depth 4096): its DP costs D R (N+2)^2
    steps; past MAX_SEQUOIA_STEPS both engines refuse with one line."""
    from wansim.acceptance.trees import optimal_tree_steps
    from wansim.speculation import MAX_SEQUOIA_STEPS

    sc = load_scenario(REFERENCE, ["speculation.policy=tree", "speculation.tree.budget_nodes=4096"])
    for engine in (analyze, simulate):
        with pytest.raises(ScenarioError) as err:
            engine(sc)
        one_line_error(err, "speculation.tree.budget_nodes", "steps to optimise")
    # the count is the DP's table: D depths x R ranks x (N+2)^2 (uniform rates: no D)
    rates = np.full((7, 8), 0.5)
    rates[1] = 0.4
    assert optimal_tree_steps(rates, 10) == 7 * 8 * 12**2
    assert optimal_tree_steps(np.full((20, 3), 0.5), 10) == 3 * 12**2
    assert optimal_tree_steps(rates, 1300) <= MAX_SEQUOIA_STEPS  # ~1300 nodes at depth 7 run


def test_one_request_of_1e9_is_refused_by_the_des_not_allocated():
    """`requests: 1e9` allocated 52 GiB up front; requests are now at most 1e6 and the DES
    simulates at most MAX_TOKENS tokens (requests x output_tokens)."""
    from wansim.sim.engine import MAX_TOKENS

    sc = load_scenario(REFERENCE, ["workload.requests=1000000"])
    with pytest.raises(ScenarioError) as err:
        simulate(sc)
    one_line_error(err, "workload.requests", "tokens to simulate")
    assert MAX_TOKENS < 1_000_000 * 256
    finite_metrics(analyze(sc))


def test_runtime_error_huge_latency_with_batching_now_bounded_and_finite():
    """1e12 ms latency with batching ended in the DES's RuntimeError; latencies are at most
    1e9 ms (11.6 days), where both engines give finite metrics (at 1e9 ms the analytical lap
    percentiles raised IndexError in distribution.py: a grid built by arange(v0, v0 + dt, dt)
    with v0 + dt == v0 in floating point was empty)."""
    data = with_(
        SMALL,
        network={"latency_ms": 1e9},
        schedule={"batching": "continuous"},
        workload={"requests": 4, "concurrency": 2, "prompt_tokens": 8, "output_tokens": 12},
    )
    sc = load_scenario(data=data)
    finite_metrics(analyze(sc))
    finite_metrics(simulate(sc))


def test_zero_costs_give_finite_metrics():
    """Zero compute, zero latency, zero drafting: the lap is the serialisation alone."""
    data = with_(
        SMALL,
        model={"compute": {"kind": "linear", "base_ms": 0, "per_token_ms": 0}},
        network={"latency_ms": 0, "bandwidth_mbps": 1e9},
        drafter={"draft_ms": 0, "acceptance": {"alpha": 0.7}},
        payload={"header_bytes": 0},
    )
    sc = load_scenario(data=data)
    finite_metrics(analyze(sc))


def test_loss_rate_at_its_limit_costs_bounded_work():
    """loss_rate 0.99999 ran the analytical engine 24 s / 12 GiB (a loss-count axis of
    log(1e-7)/log(q) terms); at the limit 0.99 that axis has 1,605 terms."""
    from wansim.analytical.distribution import _loss_terms
    from wansim.config.network import MAX_LOSS_RATE

    sc = load_scenario(data=with_(SMALL, network={"loss_rate": MAX_LOSS_RATE}))
    g, p = _loss_terms(sc.resolved_hops()[0])
    assert len(g) == 1605 and p.sum() == pytest.approx(1.0)  # g = 0..1604
    finite_metrics(analyze(sc))


def test_batched_utilisation_evaluates_each_stage_once(monkeypatch):
    """A 1024-stage batched scenario took minutes: per-stage utilisation evaluated all P stage
    models for each stage (O(P^2)); now O(P)."""
    from wansim.analytical import batched

    calls = []
    real = batched.stage_pass_ms
    monkeypatch.setattr(batched, "stage_pass_ms", lambda *args: calls.append(1) or real(*args))
    p = 64
    data = with_(
        SMALL,
        stages=p,
        schedule={"batching": "continuous"},
        workload={"requests": 8, "concurrency": 4, "prompt_tokens": 8, "output_tokens": 12},
    )
    utilization = analyze(load_scenario(data=data)).metrics["stage_utilization"]
    assert len(utilization) == p
    assert 0 < len(calls) <= 8 * p


def test_shifted_mixture_grid_is_bounded_and_keeps_the_quantiles():
    """A shift 1e9 ms on a 0.01 ms grid asked for 16 GiB; the grid is coarsened instead. The
    quantiles of X + D (X uniform on [100, 110], D = 0 or 1e6 ms with probability 1/2) are
    known in closed form: the median at the top of X, the p99 at 1e6 + 100 + 0.98 * 10."""
    from wansim.analytical.distribution import (
        MAX_SHIFTED_POINTS,
        quantiles,
        shifted_mixture,
    )

    dt = 0.01
    values = 100 + dt / 2 + dt * np.arange(1000)  # bin centres of U[100, 110]
    pmf = np.full(1000, 1e-3)
    grid, mass = shifted_mixture(values, pmf, [1e6], [0.5])
    assert len(grid) <= MAX_SHIFTED_POINTS + 1
    assert mass.sum() == pytest.approx(1.0)
    step = grid[1] - grid[0]
    p50, p99 = quantiles(grid, mass, [0.5, 0.99])
    assert p50 == pytest.approx(110, abs=step)
    assert p99 == pytest.approx(1e6 + 100 + 0.98 * 10, abs=step)


def test_identical_hops_share_one_transform_with_the_same_distribution():
    """The lap convolution raises an identical hop's transform to its count: the same pmf as
    multiplying hop by hop (1,024 stages took 19 s, now ~1 s)."""
    from wansim.analytical import distribution as dist

    sc = load_scenario(REFERENCE, ["stages=4"])
    hops = list(sc.resolved_hops())
    sizes = [1e5, 1e5, 1e5, 50.0]
    _, pmf, dt = dist.lap_distribution(hops, sizes, 10.0)
    # by hand: the product over the hops one at a time
    sers = [float(dist.serialise_ms(b, h.bandwidth_mbps)) for h, b in zip(hops, sizes, strict=True)]
    size = dist.GRID_POINTS
    spectrum = np.ones(size + 1, dtype=complex)
    for h, s in zip(hops, sers, strict=True):
        spectrum *= np.fft.rfft(dist._hop_pmf(h, s, dt, size), 2 * size)
    by_hand = np.clip(np.fft.irfft(spectrum, 2 * size)[:size], 0.0, None)
    np.testing.assert_allclose(pmf, by_hand / by_hand.sum(), atol=1e-12)


def test_head_of_line_wait_is_evaluated_once_per_distinct_hop(monkeypatch):
    """Fuzz 17:8724 (1024 stages, 2 concurrent requests, jitter and loss) took 30 s and timed
    out under load: the concurrent model evaluated the resequencing wait for every hop at every
    bisection step although all forward hops are identical; now once per distinct hop, with
    the same numbers."""
    from wansim.analytical import concurrent

    calls, built = [], []

    class Counted(concurrent.Resequencing):
        def __init__(self, values, weights):
            built.append(1)
            super().__init__(values, weights)

        def __call__(self, rate_per_ms):
            calls.append(1)
            return super().__call__(rate_per_ms)

    monkeypatch.setattr(concurrent, "Resequencing", Counted)
    lossy = {"latency_ms": 5, "loss_rate": 0.01, "jitter": {"kind": "lognormal", "std_ms": 10.0}}
    workload = {"requests": 4, "concurrency": 2, "prompt_tokens": 16, "output_tokens": 30}

    def run(stages):
        calls.clear()
        built.clear()
        data = with_(SMALL, stages=stages, network=lossy, workload=workload)
        result = analyze(load_scenario(data=data))
        finite_metrics(result)
        return len(built), len(calls)

    # the count does not grow with the ring: homogeneous hops share one evaluation (the
    # bisection may settle a step sooner or later on another ring)
    (built_256, calls_256), (built_4, calls_4) = run(256), run(4)
    assert built_256 == built_4 > 0
    assert 0 < calls_256 < 1.2 * calls_4


@pytest.mark.parametrize("extra_tensors", [[{"to_stage": 1}], []])
def test_index_error_one_stage_ring_with_extra_tensors_and_several_requests(extra_tensors):
    """Fuzz seed 4545, case 14229: one stage, an extra tensor to S0 over the return hop, 3
    requests in flight. The closed network read the prefill's size on forward hop 0, which a
    one-stage ring does not have (IndexError). Now it answers, with or without the extra
    tensor, near the DES (measured on this 25 ms ring: -5.4% and -5.5% on tokens/s against 3
    DES seeds, the closed-network approximation on 8-token requests; bound 10%)."""
    data = with_(
        SMALL,
        stages=1,
        model={
            "hidden_size": 1024,
            "compute": {"kind": "linear", "base_ms": 1, "per_token_ms": 0.02},
        },
        network={"latency_ms": 25},
        payload={"extra_tensors": extra_tensors},
        workload={"requests": 60, "concurrency": 3, "prompt_tokens": 16, "output_tokens": 8},
    )
    result = analyze(load_scenario(data=data))
    finite_metrics(result)
    des = np.mean(
        [
            simulate(load_scenario(data={**data, "seed": s})).metrics["tokens_per_s"]
            for s in range(3)
        ]
    )
    assert result.metrics["tokens_per_s"] == pytest.approx(des, rel=0.10)


def test_overflow_error_a_lap_grid_finer_than_its_values_resolution():
    """Fuzz seed 4546, case 13571: a stage at 1e-9 GB/s makes the lap ~1e13 ms, where its
    grid's spacing (a lossy 1 ms hop's) is below the float resolution: values[1] - values[0]
    was 0 and the waits' grid size infinite (OverflowError). Now such a grid is one atom at
    its mean, and the answer is finite (the DES: 1.9e-10 tokens/s; the analytical 1.5e-10,
    validated: false)."""
    from wansim.analytical.distribution import with_waits

    values = 8.2e12 + np.arange(4) * 1e-5  # spacing below the resolution: all equal
    pmf = np.full(4, 0.25)
    assert values[1] == values[0]
    out_values, out_pmf = with_waits(values, pmf, [(0.5, 0.0, 2.0)])
    assert np.all(np.isfinite(out_values)) and out_pmf.sum() == pytest.approx(1.0)
    assert np.dot(out_values, out_pmf) == pytest.approx(8.2e12 + 0.5, rel=1e-12)
    data = with_(
        SMALL,
        stages=3,
        model={
            "hidden_size": 1024,
            "stage_compute": [
                {"kind": "roofline"},
                {"kind": "roofline", "mem_bandwidth_gbs": 1e-9},
                {"kind": "roofline"},
            ],
        },
        network={"latency_ms": 5, "loss_rate": 0.02},
        workload={"requests": 3, "concurrency": 2, "prompt_tokens": 1, "output_tokens": 24},
    )
    result = analyze(load_scenario(data=data))
    finite_metrics(result)
    assert 0 < result.metrics["tokens_per_s"] < 1e-6


def test_type_error_a_stage_inherits_a_compute_that_is_not_a_mapping():
    """Fuzz seed 4548 case 6356: ``--set model.compute=1e12 --set
    model.stage_compute[5].points=.nan`` built the stages' entries from model.compute with
    ``**`` (TypeError: 'float' object is not a mapping). Now one line names model.compute."""
    with pytest.raises(ScenarioError) as excinfo:
        load_scenario(
            data={"stages": 6},
            overrides=["model.compute=1e12", "model.stage_compute[5].points=.nan"],
        )
    one_line_error(excinfo, "model.compute", "is not a mapping")


def test_a_long_problem_is_cut_to_fit_one_error_line(run_cli, tmp_path):
    """Fuzz seed 4553 case 18785: a 10,000-character unknown key in an ``moe`` compute model:
    the path (capped at 120) and the value (capped at 80) fit, but the list of the allowed keys
    made the line 418 characters. Now a long path gives way first (both its ends kept), so the
    CLI's line is at most 400 characters and the whole list stays."""
    data = {"model": {"compute": {"kind": "moe", "x" * 10_000: "y" * 10_000}}}
    with pytest.raises(ScenarioError) as excinfo:
        load_scenario(data=data)
    text = str(excinfo.value)
    assert text.startswith("model.compute.xxx") and "unknown key (allowed: kind, " in text
    assert "peak_tflops, overhead_ms), got 'yyy" in text
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    code, _, err = run_cli("validate", scenario)
    assert code == 2 and err.count("\n") == 1 and len(err.rstrip("\n")) <= 400, err


def test_value_error_negative_delay_a_drift_factor_near_zero_under_jitter():
    """Fuzz seed 4555 case 1858: a drift's latency factor of 1e-9 on a 0.5 ms hop with normal
    jitter: a draw clamped at max(0, L + J) = 0 then got L * (factor - 1) ~ -0.5 ms added, a
    delivery before its send (the DES's kernel: negative delay). The drifted propagation is now
    never below 0, in the rule the DES and the emulator share."""
    from wansim.config.network import Drift
    from wansim.links.delivery import HopSender

    data = with_(
        SMALL,
        network={
            "latency_ms": 0.5,
            "jitter": {"kind": "normal", "std_ms": 3.0},
            "drift": {"latency_factor": 1e-9},
        },
        workload={"requests": 6, "concurrency": 3, "prompt_tokens": 16, "output_tokens": 21},
    )
    finite_metrics(simulate(load_scenario(data=data)))
    drift = Drift(latency_factor=1e-9, over_ms=1.0)  # the factor reached after 1 ms
    sender = HopSender(1000.0, 0.0, 0.0, 200.0, 0.5, drift=drift)
    start, free, delivery = sender.send(10.0, 1000.0, 0, 0.0)  # a draw clamped at 0
    assert delivery == free > start == 10.0


def test_value_error_brentq_a_batch_whose_quantile_bounds_coincide():
    """Fuzz seed 4555 case 6251: a 10-million-token prompt in continuous batching: the
    per-request time is an atom of 4.5e7 ms with sd 0, so 12 sd either side rounds to the atom
    itself and the quantile's bracket had no sign change (brentq: ValueError). Now such a
    bracket's quantile is its bound: the atom."""
    from wansim.analytical.serving import sum_quantiles

    one = np.array([1.0])
    q = sum_quantiles(np.array([4.48e7]), one, one, np.array([119.5]), np.array([0.0]), [0.5, 0.99])
    assert list(q) == [4.48e7 + 119.5] * 2
    data = with_(
        SMALL,
        stages=3,
        schedule={"batching": "continuous"},
        workload={
            "requests": 1,
            "concurrency": 2,
            "prompt_tokens": 10_000_000,
            "output_tokens": 16,
        },
    )
    finite_metrics(analyze(load_scenario(data=data)))


@pytest.mark.parametrize(
    "data, shown",
    [
        ({" ": 1}, "' '"),
        ({"network": {"": 2}}, "network.''"),
        ({"network": {" x": 2}}, "network.' x'"),
    ],
)
def test_a_blank_or_padded_unknown_key_is_quoted(run_cli, tmp_path, data, shown):
    """Fuzz seed 4560 (CLI cases 509, 521): a key ' ' made the line 'error:  : unknown key',
    whose field is invisible. Such a key is now shown quoted."""
    with pytest.raises(ScenarioError, match=f"^{re.escape(shown)}: unknown key"):
        load_scenario(data=data)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    code, _, err = run_cli("validate", scenario)
    assert code == 2 and err.startswith(f"error: {shown}: unknown key") and err.count("\n") == 1


def test_value_error_a_shifted_mixture_on_a_grid_finer_than_its_values_resolution():
    """Fuzz seeds 4563-4565 (cases 19981, 7187, 14326): the same unresolved lap grid as case
    13571 of seed 4546, met by the shifted mixture (a batch's convoy shifts) instead of the
    waits: dt 0 made its grid size NaN or infinite. Both now take X as one atom at its mean
    (``one_atom_if_unresolved``)."""
    from wansim.analytical.distribution import one_atom_if_unresolved, shifted_mixture

    values = 8.2e12 + np.arange(4) * 1e-5
    pmf = np.full(4, 0.25)
    atom_values, atom_pmf = one_atom_if_unresolved(values, pmf)
    assert len(atom_values) == 1 and atom_pmf.sum() == pytest.approx(1.0)
    out_values, out_pmf = shifted_mixture(values, pmf, [4.0], [0.25])
    assert np.all(np.isfinite(out_values)) and out_pmf.sum() == pytest.approx(1.0)
    assert np.dot(out_values, out_pmf) == pytest.approx(8.2e12 + 1.0, rel=1e-12)
    data = with_(
        SMALL,
        stages=1,
        model={"hidden_size": 64, "compute": {"kind": "roofline", "mem_bandwidth_gbs": 1e-9}},
        network={"latency_ms": 0, "jitter": {"kind": "empirical", "samples_ms": [0, 1.5, 12]}},
        schedule={"batching": "continuous"},
        workload={"requests": 6, "concurrency": 2, "prompt_tokens": 16, "output_tokens": 27},
    )
    finite_metrics(analyze(load_scenario(data=data)))
