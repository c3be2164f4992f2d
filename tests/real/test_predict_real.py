"""Out of sample in CI: profile a small bundle on 2-stage runs, then predict 4- and 6-stage
cells (other latencies, other prompts; two chains and a draft tree) from their configuration +
the bundle alone, run them twice interleaved, and check the errors against loose bounds.

Bounds (stated here, checked per cell, DES):
- the pipeline model: |error| <= 45% on tokens/s and <= 35% on lap p50. Loose because the
  machine is shared (load 2-16 on 2 cores while this was written: the issue measured 17-46%
  errors when a profile and its cells ran at different loads) and because 2 prompts x 24
  tokens give a noisy tau; the full matrix's numbers are in docs/calibrate.md.
- tight enough to catch a broken model: a deliberately wrong one-stage, one-link model built
  from the same bundle (all layers in one stage, one hop) must miss lap p50 by more than 45%
  and by more than the pipeline model does (a 4-stage 50 ms lap has four 50 ms hops, a
  6-stage 20 ms lap six 20 ms hops: it misses by ~50-70% even at load 25, where the CPU part
  of a lap is 60+ ms), so it fails the 35% bound the pipeline model meets. (A 4-stage 20 ms
  cell was too weak a test at load 25: the one-stage model missed it by only 33%.)
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml

pytestmark = pytest.mark.real

CELLS = [
    {"stages": 4, "latency_ms": 50, "k": 4},
    {"stages": 6, "latency_ms": 20, "k": 2},
    # a draft tree (2K nodes): the bundle's tree width, tree drafting and sibling acceptance
    {"stages": 4, "latency_ms": 50, "k": 2, "policy": "tree"},
]
TOKENS_PER_S_BOUND = 0.45
LAP_P50_BOUND = 0.35
WRONG_MODEL_MISS = 0.45
# the own-prompts acceptance's tau against the real cell's: both decode the same greedy tokens,
# so only the engines' draws and the end of a 24-token request (min(A + 1, remaining)) differ.
# Measured: -3.1%, -0.1%, -0.6% (the bundle's profile, other prompts: -15.6%, -5.6%, -3.2%)
OWN_TAU_BOUND = 0.10


@pytest.fixture(scope="module")
def held_out(tmp_path_factory, tiny_dirs):
    pytest.importorskip("torch")
    from wansim.calibrate.predict import PredictSettings, run_predict
    from wansim.calibrate.profiling import run_profile

    target, drafter = tiny_dirs
    root = tmp_path_factory.mktemp("predict")
    run_profile(
        root / "bundle",
        quick=True,
        target_dir=target,
        drafter_dir=drafter,
        plans=((((0, 1), (1, 6)), 32), (((0, 5), (5, 6)), 32)),
        ks=(2, 4),
        size={
            "prompts": 2,
            "tokens": 24,
            "acceptance_prompts": 8,
            "acceptance_tokens": 32,
            "tree_prompts": 4,
            "tree_tokens": 24,
            "quality_prompts": 2,
            "quality_tokens": 16,
        },
    )
    matrix = root / "matrix.yaml"
    matrix.write_text(yaml.safe_dump({"defaults": {"prompts": 2, "tokens": 24}, "cells": CELLS}))
    settings = PredictSettings(
        profile=str(root / "bundle"),
        matrix=str(matrix),
        target_dir=target,
        drafter_dir=drafter,
        out=str(root / "out"),
        rounds=2,
        des_requests=300,
    )
    return root, run_predict(settings)


def test_held_out_cells_within_loose_bounds(held_out):
    root, result = held_out
    assert result["summary"]["out_of_sample"] is True
    from wansim.calibrate.bundle import load_bundle

    # the quick profile's idle cost: the reference pipeline at 5 and 50 ms links
    bundle = load_bundle(root / "bundle")
    assert len(bundle.idle_points) == 2 and bundle.idle_points[1][0] > 50.0
    assert len(bundle.idle_message[0]) == 2 and set(bundle.idle_roles) == {"drafting", "pass"}
    # the batched jobs on both pipelines (2 and 4 requests a pass): a cost per request beyond
    # the first, >= 0 (non-negative fit), in the engines' fields of a batched cell
    assert bundle.has_batch and bundle.manifest["batch"]["passes"] > 0
    assert bundle.manifest["batch"]["blocks"][-1] == 4
    assert all(v >= 0 for v in bundle.manifest["batch"]["sequence_ms"].values())
    assert (root / "bundle" / "batch_passes.csv").stat().st_size > 100
    json.loads((root / "out" / "predict.json").read_text())  # strict JSON on disk
    assert (root / "out" / "predict_scatter.png").stat().st_size > 1000
    assert (root / "out" / "predict_errors_by_mechanism.png").stat().st_size > 1000
    for cell in result["cells"]:
        print(cell["name"], {k: round(v, 3) for k, v in cell["des"]["error"].items() if v})
        real = cell["real"]
        assert len(real["runs"]) == 2 and [r["round"] for r in real["runs"]] == [0, 1]
        assert all(len(r["load_avg_1min"]) == 2 for r in real["runs"])
        # the host's CPU over each decode: the stages' own work is in it (Linux's /proc)
        assert all(r["host_cpu"]["own_cores"] > 0 for r in real["runs"] if r["host_cpu"])
        assert sys.platform != "linux" or real["host_cpu"]["runs"] == 2
        for r in real["runs"]:  # each hop's relay priority, as the scheduler has it
            assert len(r["relay_priority"]) == cell["stages"]
            assert set(r["relay_priority"]) <= {"realtime", "nice", "normal"}
        assert real["spread"]["tokens_per_s"] is not None
        err = cell["des"]["error"]
        assert abs(err["tokens_per_s"]) <= TOKENS_PER_S_BOUND, (cell["name"], err)
        assert abs(err["lap_ms_p50"]) <= LAP_P50_BOUND, (cell["name"], err)
        assert abs(cell["analytical"]["error"]["lap_ms_p50"]) <= LAP_P50_BOUND
        # the DES's tokens/s over seeded runs of the cell's requests brackets its median
        chance = cell["des"]["sample_band"]
        # (each round decoded its own 2 prompts: 4 over the cell)
        assert chance["requests"] == 4 and chance["p2_5"] <= chance["p50"] <= chance["p97_5"]
        # the prompt sample's band, from the bundle's per-prompt traces
        band = cell["workload_sample"]
        assert band["prompts"] == 4 and band["half_width"] >= 0
        assert 0.0 <= band["real_quantile"] <= 1.0
        # the cells' own prompts decoded in process: greedy, so their tokens are the real
        # run's; tau then differs only by the engines' draws (loose: 2 prompts x 24 tokens)
        own = cell["workload_acceptance"]["des"]["error"]["tau"]
        assert abs(own) <= OWN_TAU_BOUND, (cell["name"], own)


def test_a_one_stage_model_fails_the_same_bounds(held_out):
    """The calibration can tell a pipeline model from a replay: a one-stage, one-link model
    of the same cells from the same bundle misses by far more than the bounds."""
    from wansim.analytical import analyze
    from wansim.calibrate.bundle import load_bundle
    from wansim.calibrate.matrix import Cell
    from wansim.calibrate.predict import Factors, cell_scenario
    from wansim.config.scenario import load_scenario

    root, result = held_out
    bundle = load_bundle(root / "bundle")
    for cell in result["cells"]:
        c = cell["config"]
        f = Factors(**result["summary"]["rounds"][0]["factors"])
        wrong = Cell(1, c["latency_ms"], c["k"], prompts=c["prompts"], tokens=c["tokens"])
        cell_scenario(wrong, bundle, root / "wrong" / cell["name"], f, des_requests=50)
        m = analyze(load_scenario(root / "wrong" / cell["name"] / "scenario.yaml")).metrics
        miss = (m["lap_ms_p50"] - cell["real"]["lap_ms_p50"]) / cell["real"]["lap_ms_p50"]
        assert abs(miss) > WRONG_MODEL_MISS, (cell["name"], miss)
        assert abs(miss) > LAP_P50_BOUND
        assert abs(miss) > abs(cell["des"]["error"]["lap_ms_p50"])
