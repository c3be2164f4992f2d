"""Continuous batching without micro-batches on a tcp ring (:mod:`wansim.analytical.transport`,
``batch_runs_apart``): the batch's groups drift apart, so the analytical engine answers the
requests apart (``validated: false``) with a range over the structures the batch can take
(the requests apart, the lockstep batch, 2, 4, ... micro-batches), every window closed and
open. Checked against the DES on the frame-per-lap ring of
``scenarios/tcp-ring-frame-per-lap.yaml`` (48 requests)."""

from __future__ import annotations

import pytest

from tests.physics.test_tcp_loaded import ring
from wansim.analytical import analyze
from wansim.analytical.engine import point_means
from wansim.analytical.transport import batch_runs_apart, batch_structures, requests_apart
from wansim.config.scenario import load_scenario
from wansim.sim import simulate

BATCH = {"schedule__batching": "continuous"}

# measured (DES tokens/s, its 95% half-width; the range) with the range over the structures;
# over the lockstep batch and the requests apart alone the sync cases marked * lay above it
APART_CASES = {
    "8 users": {"workload__concurrency": 8},  # 25.0 (5.7%) in [2.74, 27.3]*
    "16 users": {"workload__concurrency": 16},  # 21.5 (7.0%) in [1.45, 25.9]* (+27% above)
    "16 users, 100 Mbit/s, 5 ms": {  # 14.2 (21.9%) in [4.53, 15.2]*
        "workload__concurrency": 16,
        "network__bandwidth_mbps": 100,
        "network__latency_ms": 5,
    },
    "8 users, compute-bound": {  # 4.44 (11.2%) in [2.61, 10.3] (groups merge)
        "workload__concurrency": 8,
        "model__compute__base_ms": 40,
        "model__compute__per_token_ms": 0.5,
    },
    "8 users, 8 stages, alpha 0.9": {  # 4.76 (9.3%) in [2.75, 24.2]
        "workload__concurrency": 8,
        "stages": 8,
        "drafter__acceptance__alpha": 0.9,
    },
    "8 users, async window of 2": {  # 25.6 (8.3%) against [1.77, 22.6] (+13.4%)
        "workload__concurrency": 8,
        "schedule__kind": "async",
        "schedule__max_inflight_blocks": 2,
    },
}


@pytest.mark.parametrize("case", list(APART_CASES))
def test_the_des_lies_in_the_range_over_the_batchs_structures(case):
    """The DES's tokens/s and throughput lie in the range, up to the loaded models' own
    error (15%, the concurrent band) and twice the DES's 95% half-width; the point answer is
    the requests apart's, ``validated: false`` with why."""
    sc = load_scenario(data=ring(**BATCH, **APART_CASES[case]))
    ana, des = analyze(sc), simulate(sc).metrics
    lo, hi = des["tokens_per_s_ci95"]
    half = (hi - lo) / 2
    for key, slack in (("tokens_per_s", 2 * half), ("throughput_tokens_per_s", 0.0)):
        low, high = ana.approximation["range"][key]
        rate = des[key]
        assert low < high
        assert low * (1 - 0.15) - slack <= rate <= high * (1 + 0.15) + slack, (key, low, rate, high)
    assert not ana.approximation["validated"]
    assert "requests without batching" in ana.approximation["why"]
    assert "range" in ana.approximation["why"]


def test_the_point_is_the_requests_apart_and_the_range_holds_every_structure():
    """The answer's metrics are those of the same requests without batching; its range holds
    that answer's own window range and every structure's closed and open answers (16 users:
    the lockstep batch and 2, 4, 8, 16 micro-batches)."""
    from wansim.analytical.transport import window_extremes

    sc = load_scenario(data=ring(**BATCH, workload__concurrency=16))
    ana, apart = analyze(sc), analyze(requests_apart(sc))
    assert ana.metrics == apart.metrics
    assert ana.scenario is sc and ana.approximation["regime"].endswith("as requests apart")
    structures = batch_structures(sc)
    assert [s.schedule.micro_batches for s in structures] == [None, 2, 4, 8, 16]
    span = ana.approximation["range"]
    for key in ("tokens_per_s", "throughput_tokens_per_s", "lap_ms_mean"):
        low, high = span[key]
        inner = list(apart.approximation["range"][key])
        for structure in structures:
            inner += [analyze(x).metrics[key] for x in window_extremes(structure)]
        assert low == pytest.approx(min(inner), rel=1e-12)
        assert high == pytest.approx(max(inner), rel=1e-12)


@pytest.mark.parametrize(
    ("users", "groups"), [(2, [None, 2]), (6, [None, 2, 4, 6]), (8, [None, 2, 4, 8])]
)
def test_the_groups_are_powers_of_two_up_to_one_user_each(users, groups):
    sc = load_scenario(data=ring(**BATCH, workload__concurrency=users))
    assert [s.schedule.micro_batches for s in batch_structures(sc)] == groups
    blocks = load_scenario(data=ring(**BATCH, workload__concurrency=users, schedule__kind="async"))
    assert batch_structures(blocks) == [blocks]  # micro-batches are sync only


def test_a_batch_of_one_user_is_the_lone_request_in_both_engines():
    """One user: the batch is the request alone; the DES runs the same run and the analytical
    answer is the lone request's (with its own validation: one frame a lap is walked)."""
    sc = load_scenario(data=ring(**BATCH, workload__concurrency=1))
    alone = requests_apart(sc)
    assert batch_runs_apart(sc) and not batch_runs_apart(alone)
    assert simulate(sc).metrics == simulate(alone).metrics
    ana, ref = analyze(sc), analyze(alone)
    assert ana.metrics == ref.metrics
    assert ana.approximation["validated"] == ref.approximation["validated"]
    assert "range" not in ana.approximation


def test_a_grid_point_is_the_requests_apart():
    """``point_means`` (the grid's point-by-point path) takes the same model as analyze."""
    sc = load_scenario(data=ring(**BATCH, workload__concurrency=8))
    assert point_means(sc) == point_means(requests_apart(sc))
    assert point_means(sc)["tokens_per_s"] == pytest.approx(
        analyze(sc).metrics["tokens_per_s"], rel=1e-12
    )


def test_the_cli_answers_it_with_the_range(tmp_path):
    """``wansim run --engine analytical`` answers (exit 0, strict JSON) where it refused."""
    import json
    import subprocess
    import sys

    import yaml

    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump(ring(**BATCH, workload__concurrency=8)))
    out = subprocess.run(
        [sys.executable, "-m", "wansim", "run", str(path), "--engine", "analytical", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(c))
    assert answer["approximation"]["validated"] is False
    assert set(answer["approximation"]["range"]) == {
        "tokens_per_s",
        "throughput_tokens_per_s",
        "lap_ms_mean",
    }
