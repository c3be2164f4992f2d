"""Run a sweep: validate every point, skip what the store already has, run the rest, write the
table.

Per-point engines (the DES, or the analytical engine with ``vectorize: false``) send batches of
runs to an executor and write a shard per finished batch. Vectorised analytical sweeps never
touch a pool: one ``evaluate_grid`` call per category (the distinct values of the fields the
closed forms cannot take as arrays), in this process, a shard per category.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pandas as pd

from wansim.config.overrides import has_per_stage_lists
from wansim.errors import WansimInputError
from wansim.support.hold import checkpoint
from wansim.sweep.executors import (
    Executor,
    SweepRunError,
    batch_size_for,
    check_options,
    make_executor,
)
from wansim.sweep.progress import Progress
from wansim.sweep.spec import (
    Plan,
    Sweep,
    category_groups,
    group_base_overrides,
    hash_column,
    load_sweep,
    plan,
    run_seeds,
    split_fields,
)
from wansim.sweep.store import ResultStore
from wansim.sweep.worker import run_batch


@dataclasses.dataclass
class SweepOutcome:
    plan: Plan
    table: pd.DataFrame
    out_dir: Path
    computed: int
    reused: int
    elapsed_s: float
    executor: str

    def summary(self) -> str:
        p = self.plan
        return (
            f"{p.sweep.name}: {p.n_runs} runs ({p.n_points} points x {p.sweep.seeds} seeds,"
            f" {p.sweep.engine}), {self.computed} computed, {self.reused} reused,"
            f" {self.elapsed_s:.1f} s on {self.executor} -> {self.out_dir / 'results.parquet'}"
        )


def engine_check(engine: str):
    """The per-point check that a scenario is one the engine runs (raises input errors)."""
    if engine == "analytical":
        from wansim.analytical import check_supported

        return check_supported
    try:
        import wansim.sim as sim
    except ImportError:
        sim = None
    if sim is None or not hasattr(sim, "simulate"):
        raise WansimInputError("engine", "the DES (wansim.sim) is not available here", engine)
    return getattr(sim, "check_supported", None)


def run_sweep(
    sweep: Sweep | str | Path,
    out_dir: str | Path,
    *,
    backend: str = "local",
    workers: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    batch_size: int | None = None,
    progress: bool = True,
    executor: Executor | None = None,
) -> SweepOutcome:
    t0 = time.perf_counter()
    if not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep)
    check_options(backend, workers, scheduler)
    if batch_size is not None and batch_size < 1:
        raise WansimInputError("--batch-size", "must be >= 1", batch_size)
    the_plan = plan(sweep, check_engine=engine_check(sweep.engine))
    store = ResultStore(out_dir)
    store.open(the_plan, resume=resume, overwrite=overwrite)
    done = store.completed(the_plan)
    done_mask = np.zeros((the_plan.n_points, sweep.seeds), dtype=bool)
    done_mask[done["point"].to_numpy(np.int64), done["replicate"].to_numpy(np.int64)] = True
    reused = int(done_mask.sum())
    bar = Progress(the_plan.n_runs, reused, enabled=progress)
    described = "in-process (vectorised)"
    try:
        if sweep.engine == "analytical" and sweep.vectorize:
            _run_vectorised(the_plan, store, done_mask, bar)
        else:
            todo = np.flatnonzero(~done_mask.ravel())
            if len(todo):
                own = executor is None
                ex = executor or make_executor(backend, workers, scheduler)
                described = ex.describe()
                try:
                    _run_pointwise(the_plan, store, todo, ex, batch_size, bar)
                finally:
                    if own:
                        ex.close()
            else:
                described = "nothing to run"
    finally:
        bar.close()
    table = store.consolidate(the_plan)
    return SweepOutcome(
        plan=the_plan,
        table=table,
        out_dir=Path(out_dir),
        computed=the_plan.n_runs - reused,
        reused=reused,
        elapsed_s=time.perf_counter() - t0,
        executor=described,
    )


def _shard(plan: Plan, points: np.ndarray, reps: np.ndarray, metrics: pd.DataFrame):
    frame = pd.DataFrame(
        {
            "point_hash": hash_column(plan.point_hash[points]),
            "replicate": reps.astype(np.int64),
            "seed": run_seeds(plan.point_hash[points], reps),
        }
    )
    return pd.concat([frame, metrics.reset_index(drop=True)], axis=1)


def _run_pointwise(plan, store, todo, executor, batch_size, bar) -> None:
    seeds = plan.sweep.seeds
    size = batch_size or batch_size_for(len(todo), executor.workers)
    points, reps = todo // seeds, todo % seeds
    run_seed = run_seeds(plan.point_hash[points], reps)
    # batch b takes runs b, b + n, b + 2n, ...: every batch is a cross-section of the grid, so
    # batches cost about the same whatever the grid order (no long batch left for the end)
    n_tasks = -(-len(todo) // size)
    tasks = []
    for b in range(n_tasks):
        runs = [
            (int(todo[j]), dataclasses.replace(plan.scenarios[points[j]], seed=int(run_seed[j])))
            for j in range(b, len(todo), n_tasks)
        ]
        tasks.append((plan.sweep.engine, runs))
    for batch in executor.imap(run_batch, tasks):
        ok = [(rid, m) for rid, m, err in batch if err is None]
        if ok:
            ids = np.array([rid for rid, _ in ok], dtype=np.int64)
            metrics = pd.DataFrame([m for _, m in ok])
            store.write_part(_shard(plan, ids // seeds, ids % seeds, metrics))
            bar.update(len(ok))
            checkpoint("sweep-part", store.parts_written)
        failed = [(rid, err) for rid, _, err in batch if err is not None]
        if failed:
            rid, (kind, text) = failed[0]
            where = plan.describe(rid // seeds)
            if kind == "input":
                raise WansimInputError(f"point {where}", text)
            raise SweepRunError(f"run failed at point {where}, replicate {rid % seeds}:\n{text}")


def _run_vectorised(plan, store, done_mask, bar) -> None:
    from wansim.analytical import evaluate_grid
    from wansim.config.scenario import load_scenario

    sweep = plan.sweep
    vec, cat = split_fields(plan.fields, plan.values, has_per_stage_lists(plan.base_raw))
    for group in category_groups(cat, plan.values, plan.index):
        missing = ~done_mask[group.points]
        if not missing.any():
            continue
        over = group_base_overrides(plan.values, plan.index, group, vec, cat)
        base = load_scenario(data=plan.base_raw, overrides=over, base_dir=sweep.base_path.parent)
        arrays = {
            f: np.asarray(plan.values[f], dtype=float)[plan.index[f][group.points]] for f in vec
        }
        arrays = {
            f: a.astype(np.int64) if _integral(plan.values[f]) else a for f, a in arrays.items()
        }
        frame = evaluate_grid(base, arrays, mesh=False, validate=False)
        frame = frame.drop(columns=[f for f in vec if f in frame.columns])
        pos, rep = np.nonzero(missing)
        metrics = frame.iloc[pos].reset_index(drop=True)
        store.write_part(_shard(plan, group.points[pos], rep, metrics))
        bar.update(len(pos))
        checkpoint("sweep-part", store.parts_written)


def _integral(values: list) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)
