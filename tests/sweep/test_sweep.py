"""Sweeps with the analytical engine: expansion, validation, seeds, backends, resume, storage."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
import yaml

import wansim
from tests.conftest import REFERENCE
from wansim.sweep import load_sweep, plan, run_sweep
from wansim.sweep.executors import SerialExecutor, batch_size_for
from wansim.sweep.progress import Progress
from wansim.sweep.spec import run_seeds

ISSUE_GRID = {"speculation.k": [1, 3, 5, 7], "network.latency_ms": [5, 25, 80]}
# no jitter: the per-point analytical engine is then milliseconds per point (no FFT)
QUICK = {"network.jitter": {"kind": "none"}, "workload.output_tokens": 3000}


def write_sweep(tmp_path, name="s.yaml", **fields) -> str:
    doc = {"base": str(REFERENCE), "engine": "analytical", **fields}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def test_issue_grid_vectorised_cli(run_cli, tmp_path):
    sweep = write_sweep(tmp_path, grid=ISSUE_GRID, set={"workload.output_tokens": 3000}, seeds=2)
    code, out, err = run_cli("sweep", sweep, "--out", tmp_path / "o")
    assert code == 0, err
    assert "24 runs (12 points x 2 seeds" in out and "tokens_per_s" in out
    table = pd.read_parquet(tmp_path / "o" / "results.parquet")
    assert len(table) == 24
    assert list(table.columns[:5]) == [
        "point",
        "replicate",
        "speculation.k",
        "network.latency_ms",
        "seed",
    ]
    assert table[["point", "replicate"]].drop_duplicates().shape[0] == 24
    assert table["seed"].is_unique
    assert list(table["point"]) == sorted(table["point"])
    # grid order: first field slowest
    assert list(table["speculation.k"][::2]) == [1, 1, 1, 3, 3, 3, 5, 5, 5, 7, 7, 7]
    # the numbers are the engine's: check one point against analyze()
    row = table[(table["speculation.k"] == 5) & (table["network.latency_ms"] == 25)].iloc[0]
    sc = wansim.load_scenario(
        REFERENCE,
        {"speculation.k": 5, "network.latency_ms": 25, "workload.output_tokens": 3000},
    )
    ref = wansim.analyze(sc).metrics
    for name in ("tokens_per_s", "tau", "lap_ms_mean", "bytes_per_token"):
        assert row[name] == pytest.approx(ref[name], rel=1e-12)
    # more latency -> slower, at every K
    for _, g in table[table["replicate"] == 0].groupby("speculation.k"):
        assert g.sort_values("network.latency_ms")["tokens_per_s"].is_monotonic_decreasing


def test_vectorised_equals_per_point(tmp_path):
    grid = {
        "speculation.k": [1, 4, 7],
        "network.latency_ms": [5, 80],
        "drafter.acceptance.workload": ["math", "chat"],  # categorical: looped
    }
    vec = run_sweep(write_sweep(tmp_path, "v.yaml", grid=grid, set=QUICK), tmp_path / "v")
    per = run_sweep(
        write_sweep(tmp_path, "p.yaml", grid=grid, set=QUICK, vectorize=False),
        tmp_path / "p",
        workers=1,
    )
    assert per.executor == "serial x1" and vec.executor.startswith("in-process")
    shared = [c for c in vec.table.columns if c in per.table.columns]
    assert {"tokens_per_s", "tau", "lap_ms_mean", "bubble_fraction"} <= set(shared)
    pd.testing.assert_frame_equal(vec.table[shared], per.table[shared], rtol=1e-12)
    # the per-point engine also gives percentiles and per-stage utilisation
    assert {"lap_ms_p99", "stage_utilization_9"} <= set(per.table.columns)
    chat = vec.table[vec.table["drafter.acceptance.workload"] == "chat"]["tau"].to_numpy()
    math = vec.table[vec.table["drafter.acceptance.workload"] == "math"]["tau"].to_numpy()
    assert (chat[1:] < math[1:]).all()  # chat accepts less (k = 1 rows included)


def test_local_pool_and_serial_give_the_same_table(tmp_path):
    sweep = write_sweep(tmp_path, grid=ISSUE_GRID, set=QUICK, seeds=2, vectorize=False)
    serial = run_sweep(sweep, tmp_path / "a", workers=1, progress=False)
    pool = run_sweep(sweep, tmp_path / "b", workers=2, batch_size=3, progress=False)
    assert pool.executor == "local x2"
    pd.testing.assert_frame_equal(serial.table, pool.table)
    assert len(list((tmp_path / "b" / "parts").glob("part-*.parquet"))) == 8  # 24 / 3


def test_dask_backend_equals_local(tmp_path):
    pytest.importorskip("dask.distributed")
    sweep = write_sweep(
        tmp_path,
        grid={"speculation.k": [1, 7], "stages": [4, 10]},
        zip={"network.latency_ms": [5, 80], "payload.activation_bits": [16, 4]},
        set=QUICK,
        seeds=2,
        vectorize=False,
    )
    local = run_sweep(sweep, tmp_path / "l", workers=1, progress=False)
    dask = run_sweep(sweep, tmp_path / "d", backend="dask", workers=2, progress=False)
    assert dask.executor == "dask x2"
    pd.testing.assert_frame_equal(local.table, dask.table)
    assert len(dask.table) == 2 * 2 * 2 * 2


def test_zip_pairs_values_and_hop_paths(tmp_path):
    hops = [{} for _ in range(10)]
    sweep = write_sweep(
        tmp_path,
        grid={"network.hops[3].latency_ms": [5, 200]},
        zip={"speculation.k": [1, 7], "drafter.draft_ms": [1.0, 4.0]},
        set={**QUICK, "network.hops": hops},
    )
    table = run_sweep(sweep, tmp_path / "o", progress=False).table
    assert list(table.columns[2:5]) == [
        "network.hops[3].latency_ms",
        "speculation.k",
        "drafter.draft_ms",
    ]
    assert sorted(zip(table["speculation.k"], table["drafter.draft_ms"], strict=True)) == [
        (1, 1.0),
        (1, 1.0),
        (7, 4.0),
        (7, 4.0),
    ]
    slow = table[table["network.hops[3].latency_ms"] == 200]["lap_ms_mean"].to_numpy()
    fast = table[table["network.hops[3].latency_ms"] == 5]["lap_ms_mean"].to_numpy()
    np.testing.assert_allclose(slow - fast, 195.0)


def test_seeds_depend_on_the_point_only(tmp_path):
    a = plan(load_sweep(write_sweep(tmp_path, "a.yaml", grid=ISSUE_GRID, seeds=3)))
    # same points written in another order, inside a bigger sweep, with a zip
    b = plan(
        load_sweep(
            write_sweep(
                tmp_path,
                "b.yaml",
                grid={"network.latency_ms": [80, 25, 5, 200]},
                zip={"speculation.k": [7, 5, 3, 1]},
                seeds=2,
            )
        )
    )
    c = plan(load_sweep(write_sweep(tmp_path, "c.yaml", grid=ISSUE_GRID, seeds=3, set={"seed": 7})))

    def seeds(p):
        pts, reps = p.run_keys()
        s = run_seeds(p.point_hash[pts], reps)
        return {
            (*(p.overrides(i)[f] for f in ISSUE_GRID), int(r)): int(v)
            for i, r, v in zip(pts, reps, s, strict=True)
        }

    sa, sb, sc = seeds(a), seeds(b), seeds(c)
    assert len(set(sa.values())) == len(sa) == 36
    shared = set(sa) & set(sb)
    assert len(shared) == 12 * 2
    assert all(sa[k] == sb[k] for k in shared)
    assert not set(sa.values()) & set(sc.values())  # the scenario seed salts every run
    assert all(0 <= v < 2**63 for v in sa.values())


class InterruptAfter(SerialExecutor):
    """Serial executor that is 'Ctrl-C'ed after ``n`` batches."""

    def __init__(self, n):
        self.n = n

    def imap(self, fn, tasks):
        for i, task in enumerate(tasks):
            if i == self.n:
                raise KeyboardInterrupt
            yield fn(*task)


def test_interrupt_keeps_finished_work_and_resume_completes(tmp_path):
    sweep = write_sweep(tmp_path, grid=ISSUE_GRID, set=QUICK, seeds=2, vectorize=False)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, tmp_path / "o", executor=InterruptAfter(3), batch_size=4, progress=False)
    assert not (tmp_path / "o" / "results.parquet").exists()
    assert len(list((tmp_path / "o" / "parts").glob("part-*.parquet"))) == 3
    resumed = run_sweep(sweep, tmp_path / "o", resume=True, workers=1, progress=False)
    assert (resumed.reused, resumed.computed) == (12, 12)
    clean = run_sweep(sweep, tmp_path / "clean", workers=2, progress=False)
    pd.testing.assert_frame_equal(resumed.table, clean.table)
    again = run_sweep(sweep, tmp_path / "o", resume=True, progress=False)
    assert (again.reused, again.computed, again.executor) == (24, 0, "nothing to run")
    pd.testing.assert_frame_equal(again.table, clean.table)


def test_resume_after_growing_the_grid_runs_only_new_points(tmp_path):
    small = write_sweep(tmp_path, "s.yaml", grid=ISSUE_GRID, set=QUICK, vectorize=False)
    run_sweep(small, tmp_path / "o", workers=1, progress=False)
    grown = {**ISSUE_GRID, "network.latency_ms": [5, 25, 80, 150]}
    big = write_sweep(tmp_path, "b.yaml", grid=grown, set=QUICK, seeds=2, vectorize=False)
    out = run_sweep(big, tmp_path / "o", resume=True, workers=1, progress=False)
    assert (out.reused, out.computed) == (12, 32 - 12)
    clean = run_sweep(big, tmp_path / "clean", workers=1, progress=False)
    pd.testing.assert_frame_equal(out.table, clean.table)


def test_out_dir_guards(run_cli, tmp_path):
    sweep = write_sweep(tmp_path, grid={"speculation.k": [1, 2]})
    assert run_cli("sweep", sweep, "--out", tmp_path / "o", "--quiet")[0] == 0
    code, _, err = run_cli("sweep", sweep, "--out", tmp_path / "o", "--quiet")
    assert code == 2 and "--out: already holds sweep results" in err
    assert run_cli("sweep", sweep, "--out", tmp_path / "o", "--quiet", "--overwrite")[0] == 0
    other = write_sweep(tmp_path, "x.yaml", grid={"speculation.k": [1, 2]}, set={"stages": 4})
    code, _, err = run_cli("sweep", other, "--out", tmp_path / "o", "--resume", "--quiet")
    assert code == 2 and "--resume:" in err and "another sweep" in err


DIFFERING_HOPS = [{"latency_ms": 10 + i} for i in range(10)]
BAD = [
    ({"grid": ISSUE_GRID, "engin": "des"}, "engin: unknown key (allowed: name, base, engine"),
    ({"engine": "dse"}, "engine: must be one of des | analytical, got 'dse'"),
    ({"base": "nope/missing.yaml"}, "base: file not found, got 'nope/missing.yaml'"),
    ({"grid": {"speculation.k": [0, 3]}}, "grid.speculation.k: must be >= 1, got 0"),
    (
        {"grid": {"network.latncy_ms": [5]}},
        "grid.network.latncy_ms: unknown key (allowed: latency_ms,",
    ),
    ({"grid": {"speculation.k": 7}}, "grid.speculation.k: must be a non-empty list of values"),
    ({"grid": {"speculation.k": [3, 3.0]}}, "grid.speculation.k: repeats a value, got 3"),
    ({"grid": {"speculation..k": [3]}}, "grid.speculation..k: bad field path"),
    ({"grid": {"seed": [1, 2]}}, "grid.seed: seeds are derived per point"),
    (
        {"zip": {"speculation.k": [1, 3], "stages": [2]}},
        "zip: lists must all have the same length",
    ),
    ({"grid": {"speculation.k": [1]}, "set": {"speculation.k": 3}}, "set.speculation.k: is also"),
    ({"seeds": 0}, "seeds: must be an integer >= 1"),
    (
        {"grid": {"speculation.k": [7, 9]}},
        "grid.speculation.k: profile measured positions 1..7",
    ),
    ({"set": {"stages": -1}}, "set.stages: must be >= 1, got -1"),
    # hops that differ cannot follow a new stage count (alike ones are resized: README,
    # "Overrides, sweeps and per-stage lists"; tests/cli/test_input_edges.py)
    (
        {"grid": {"stages": [10, 4]}, "set": {"network.hops": DIFFERING_HOPS}, "vectorize": False},
        "network.hops: needs 4 entries",
    ),
    (
        {"grid": {"stages": [10, 4]}, "set": {"network.hops": DIFFERING_HOPS}},
        "network.hops: needs 4 entries",
    ),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_sweeps_exit_2_with_one_line(run_cli, tmp_path, fields, message):
    sweep = write_sweep(tmp_path, **{"grid": {"speculation.k": [1]}, **fields})
    code, _, err = run_cli("sweep", sweep, "--out", tmp_path / "o")
    assert code == 2, err
    assert err.startswith("error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # nothing ran, nothing written


def test_bad_flags(run_cli, tmp_path):
    sweep = write_sweep(tmp_path, grid={"speculation.k": [1]})
    code, _, err = run_cli("sweep", sweep, "--workers", "0", "--out", tmp_path / "o")
    assert code == 2 and "--workers: must be >= 1, got 0" in err
    code, _, err = run_cli("sweep", tmp_path / "none.yaml")
    assert code == 2 and "sweep: file not found" in err
    (tmp_path / "bad.yaml").write_text("grid: [1, 2\n")
    code, _, err = run_cli("sweep", tmp_path / "bad.yaml")
    assert code == 2 and "not valid YAML" in err


@pytest.mark.parametrize(
    "latencies",
    [
        pytest.param(5, id="80k-points"),
        pytest.param(40, id="1M-points", marks=pytest.mark.slow),
    ],
)
def test_analytical_sweeps_never_touch_a_pool(tmp_path, monkeypatch, latencies):
    def no_pool(*args, **kwargs):
        raise AssertionError("an analytical sweep asked for an executor")

    monkeypatch.setattr("wansim.sweep.runner.make_executor", no_pool)
    grid = {
        "speculation.k": list(range(1, 8)),
        "network.latency_ms": [float(x) for x in range(0, 5 * latencies, 5)],
        "network.bandwidth_mbps": [10.0 * 1.25**i for i in range(40)],
        "payload.activation_bits": [3, 4, 8, 16],
        "stages": list(range(1, 24)),
        "drafter.acceptance.workload": ["math", "chat"],
    }
    out = run_sweep(write_sweep(tmp_path, grid=grid), tmp_path / "o", progress=False)
    assert out.plan.n_points == 7 * latencies * 40 * 4 * 23 * 2
    assert len(out.table) == out.plan.n_points
    assert out.table["tokens_per_s"].notna().all() and (out.table["tokens_per_s"] > 0).all()


def test_batches_and_progress():
    assert batch_size_for(24, 2) == 1 and batch_size_for(1000, 2) == 32
    assert batch_size_for(10**6, 2) == 500 and batch_size_for(1, 8) == 1
    stream = io.StringIO()
    bar = Progress(100, 20, stream=stream)
    for _ in range(8):
        bar.update(10)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 8 and lines[-1].startswith("[" + "#" * 30 + "] 100/100 runs 100%")
    assert "eta" in lines[0] and "30/100" in lines[0]


def test_a_point_the_engine_refuses_fails_the_sweep_up_front(run_cli, tmp_path, monkeypatch):
    import wansim.analytical
    from wansim.errors import ScenarioError

    def refuse_k5(scenario):
        if scenario.speculation.k == 5:
            raise ScenarioError("speculation.k", "not modelled here", scenario.speculation.k)

    monkeypatch.setattr(wansim.analytical, "check_supported", refuse_k5)
    for vectorize in (True, False):
        sweep = write_sweep(tmp_path, grid=ISSUE_GRID, set=QUICK, vectorize=vectorize)
        code, _, err = run_cli("sweep", sweep, "--out", tmp_path / "o")
        assert code == 2 and err == "error: grid.speculation.k: not modelled here, got 5\n"
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("vectorize", [True, False])
def test_base_needs_only_be_valid_where_points_do_not_override(tmp_path, vectorize):
    """A drafter with 3 measured positions on a base with K = 7: the grid's K are all valid."""
    fixed = {
        **QUICK,
        "drafter.acceptance": {"per_position": [0.9, 0.8, 0.7]},
    }
    sweep = write_sweep(
        tmp_path,
        grid={"speculation.k": [1, 2, 3], "payload.activation_bits": [16, 4]},
        set=fixed,
        vectorize=vectorize,
    )
    out = run_sweep(sweep, tmp_path / "o", workers=1, progress=False)
    assert len(out.table) == 6
    tau = out.table.groupby("speculation.k")["tau"].first()
    sc = wansim.load_scenario(REFERENCE, {**fixed, "speculation.k": 3})
    assert tau[3] == pytest.approx(wansim.analyze(sc).metrics["tau"], rel=1e-12)
    assert tau[3] == pytest.approx(1 + 0.9 + 0.9 * 0.8 + 0.9 * 0.8 * 0.7, rel=1e-2)
    bad = write_sweep(tmp_path, "bad.yaml", grid={"speculation.k": [3, 4]}, set=fixed)
    with pytest.raises(wansim.WansimInputError, match=r"^grid\.speculation\.k: .*got 4$"):
        run_sweep(bad, tmp_path / "b", progress=False)


def test_a_crashing_run_stops_the_sweep_and_keeps_finished_work(tmp_path, monkeypatch):
    import wansim.sweep.worker as worker
    from wansim.sweep import SweepRunError

    real = worker.run_one

    def crash_at_k5(engine, scenario):
        if scenario.speculation.k == 5:
            raise ZeroDivisionError("boom")
        return real(engine, scenario)

    monkeypatch.setattr(worker, "run_one", crash_at_k5)
    sweep = write_sweep(tmp_path, grid=ISSUE_GRID, set=QUICK, vectorize=False)
    with pytest.raises(SweepRunError, match=r"speculation\.k=5, network\.latency_ms=5") as info:
        run_sweep(sweep, tmp_path / "o", workers=1, batch_size=2, progress=False)
    assert "ZeroDivisionError: boom" in str(info.value)
    kept = len(list((tmp_path / "o" / "parts").glob("part-*.parquet")))
    # batches interleave the grid: the first holds runs 0 and 6 (k = 5); run 0 is kept
    assert kept == 1
    monkeypatch.setattr(worker, "run_one", real)
    out = run_sweep(sweep, tmp_path / "o", resume=True, workers=1, progress=False)
    assert (out.reused, out.computed) == (1, 11)


def test_ctrl_c_keeps_finished_work(tmp_path):
    """A real ``wansim sweep`` process gets SIGINT mid-run: exit 130, finished batches kept.

    Deterministic: ``WANSIM_HOLD_AFTER=sweep-part:1`` (wansim.support.hold) holds the sweep right after
    its first shard until the interrupt arrives, so it cannot finish first under load."""
    import glob
    import os
    import signal
    import sys
    import time

    from tests.conftest import start_held

    sweep = write_sweep(
        tmp_path,
        engine="des",
        grid={"speculation.k": [3, 5, 7], "network.latency_ms": [5, 10, 20, 40]},
        set={"workload.requests": 1, "workload.output_tokens": 200},
    )
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "wansim", "sweep", sweep, "--out", str(out), "--quiet"]
    cmd += ["--workers", "2", "--batch-size", "1"]
    proc = start_held(cmd, "sweep-part:1")
    try:
        while not glob.glob(str(out / "parts" / "part-*.parquet")):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted: finished runs are kept in" in err and "Traceback" not in err
    kept = len(glob.glob(str(out / "parts" / "part-*.parquet")))
    assert kept == 1 and not (out / "results.parquet").exists()
    done = run_sweep(sweep, out, resume=True, workers=2, progress=False)
    assert (done.reused, done.computed) == (kept, 12 - kept)


def test_a_pool_stopped_early_fails_its_pending_work_without_a_thread_traceback(monkeypatch):
    """Stopping the local pool early (a Ctrl-C, an error) terminates its workers while work is
    still queued; the pool's manager thread then fails every pending future. Had they been
    cancelled first, Python 3.11's manager raises ``InvalidStateError`` on them (a traceback
    after "interrupted": checked by putting the cancel back). Deterministic: one short task
    returns, 20 of 5 s are queued or running, and the manager sees the workers die before the
    pool shuts down."""
    import threading
    import time

    from wansim.sweep.executors import LocalExecutor

    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    executor = LocalExecutor(2)
    try:
        results = executor.imap(time.sleep, [(0.05,)] + [(5.0,)] * 20)
        assert next(results) is None  # the short task
        results.close()  # stop early: the workers are terminated
        time.sleep(0.5)  # the manager thread notices the dead workers
    finally:
        executor.close()
    assert raised == []
