"""Where a sweep's results live, written as they finish so that nothing finished is lost.

Layout of ``--out DIR``::

    DIR/sweep.json       what the results belong to (fingerprint of engine + base after set)
    DIR/parts/part-*.parquet
                         one shard per finished batch: point_hash, replicate, seed, metrics.
                         Written to a temporary name and renamed (atomic on POSIX), so a
                         SIGKILL leaves only whole shards behind (and maybe a tmp-* file,
                         ignored and cleaned up).
    DIR/results.parquet  the consolidated table, written once every run is in: one row per
                         point and replicate, sorted by point then replicate.

Runs are keyed by (point hash, replicate), not by position, so ``--resume`` recomputes exactly
the missing runs even after the grid has grown or ``seeds`` has been raised; a shard row counts
only if its seed is the one the current code derives for that run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from wansim.errors import WansimInputError
from wansim.results import strict_json
from wansim.results.metric_names import ORDER
from wansim.sweep.spec import Plan, canonical, hash_column, run_seeds

KEY = ["point_hash", "replicate"]
RESULTS = "results.parquet"
META = "sweep.json"


class ResultStore:
    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        self.parts = self.dir / "parts"
        self._count = 0
        self._frames: list[pd.DataFrame] | None = None

    # ------------------------------------------------------------------ opening
    def open(self, plan: Plan, *, resume: bool, overwrite: bool) -> None:
        meta_path = self.dir / META
        has_data = meta_path.exists() or (self.dir / RESULTS).exists() or self._part_files()
        if has_data and overwrite:
            shutil.rmtree(self.parts, ignore_errors=True)
            self._frames = None
            for name in (META, RESULTS):
                (self.dir / name).unlink(missing_ok=True)
        elif has_data and not resume:
            raise WansimInputError(
                "--out",
                "already holds sweep results: pass --resume to continue them or --overwrite to"
                " start again",
                str(self.dir),
            )
        elif has_data:
            old = self._read_meta()
            if old.get("fingerprint") != plan.fingerprint:
                raise WansimInputError(
                    "--resume",
                    f"{self.dir} holds results of another sweep (engine or base scenario after"
                    " set differ): use another --out or --overwrite",
                    str(self.dir),
                )
        self.parts.mkdir(parents=True, exist_ok=True)
        for tmp in self.parts.glob("tmp-*"):
            tmp.unlink(missing_ok=True)
        sweep = plan.sweep
        meta = {
            "format": "wansim-sweep/1",
            "fingerprint": plan.fingerprint,
            "name": sweep.name,
            "sweep_file": str(sweep.path) if sweep.path else None,
            "base": str(sweep.base_path),
            "engine": sweep.engine,
            "grid": sweep.grid,
            "zip": sweep.zip,
            "set": sweep.set,
            "seeds": sweep.seeds,
            "points": plan.n_points,
            "runs": plan.n_runs,
        }
        tmp = self.dir / f"tmp-{META}"
        tmp.write_text(strict_json.dumps(meta, indent=2, default=canonical) + "\n")
        os.replace(tmp, meta_path)

    def _read_meta(self) -> dict:
        try:
            return json.loads((self.dir / META).read_text())
        except (OSError, ValueError):
            return {}

    def _part_files(self) -> list[Path]:
        return sorted(self.parts.glob("part-*.parquet")) if self.parts.is_dir() else []

    # ------------------------------------------------------------------ shards
    def write_part(self, frame: pd.DataFrame) -> Path:
        """Write one shard atomically (tmp file, then rename)."""
        self._count += 1
        name = f"part-{time.time_ns():020d}-{os.getpid()}-{self._count:06d}.parquet"
        tmp = self.parts / f"tmp-{name}"
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, self.parts / name)
        # not kept in memory (the parent stays flat over a long sweep): read back when needed
        self._frames = None
        return self.parts / name

    @property
    def parts_written(self) -> int:
        """Shards this store object wrote (in this process)."""
        return self._count

    def read_parts(self) -> pd.DataFrame:
        """Every shard on disk (read once, and again after a shard is written)."""
        if self._frames is None:
            self._frames = []
            for path in self._part_files():
                try:
                    self._frames.append(pd.read_parquet(path))
                except Exception as err:  # damaged outside our control: recompute its runs
                    print(f"warning: ignoring unreadable {path} ({err})", file=sys.stderr)
        frames = [f for f in self._frames if len(f)]
        if not frames:
            return pd.DataFrame(
                {c: np.array([], dtype=np.int64) for c in ("point_hash", "replicate", "seed")}
            )
        if len(frames) == 1:
            return frames[0]
        return pd.concat(frames, ignore_index=True, sort=False)

    def completed(self, plan: Plan) -> pd.DataFrame:
        """Finished runs of this plan: shard rows mapped to (point, replicate), seeds checked,
        deduplicated, sorted by point then replicate."""
        parts = self.read_parts()
        point = pd.Index(hash_column(plan.point_hash)).get_indexer(
            parts["point_hash"].to_numpy(np.int64)
        )
        rep = parts["replicate"].to_numpy(np.int64)
        ok = (point >= 0) & (rep >= 0) & (rep < plan.sweep.seeds)
        safe = np.where(ok, point, 0)
        expected = run_seeds(plan.point_hash[safe], np.where(ok, rep, 0))
        ok &= parts["seed"].to_numpy(np.int64) == expected
        rows = np.flatnonzero(ok)
        code = point[rows] * plan.sweep.seeds + rep[rows]
        order = np.argsort(code, kind="stable")
        code = code[order]
        first = np.ones(len(code), dtype=bool)
        first[1:] = code[1:] != code[:-1]
        rows = rows[order[first]]
        out = parts.iloc[rows].reset_index(drop=True)
        out.insert(0, "point", point[rows])
        return out

    # ------------------------------------------------------------------ final table
    def consolidate(self, plan: Plan) -> pd.DataFrame:
        """results.parquet from the shards (every run must be in); returns the table."""
        done = self.completed(plan)
        if len(done) != plan.n_runs:
            raise RuntimeError(f"{plan.n_runs - len(done)} runs missing")  # caller checks first
        table = build_table(plan, done)
        tmp = self.dir / f"tmp-{RESULTS}"
        table.to_parquet(tmp, index=False)
        os.replace(tmp, self.dir / RESULTS)
        return table


def build_table(plan: Plan, done: pd.DataFrame) -> pd.DataFrame:
    """point, replicate, the swept fields (by dotted path), seed, then every metric."""
    points = done["point"].to_numpy(np.int64)
    columns: dict[str, object] = {
        "point": points,
        "replicate": done["replicate"].to_numpy(np.int64),
    }
    columns.update(plan.field_columns(points))
    columns["seed"] = done["seed"].to_numpy(np.int64)
    metric_cols = sorted(
        (c for c in done.columns if c not in ("point", *KEY, "seed")), key=metric_sort_key
    )
    for c in metric_cols:
        columns[c] = _normalise(done[c])
    return pd.DataFrame(columns)


_SUFFIX = re.compile(r"^(.*?)_(\d+|low|high)$")


def metric_sort_key(name: str) -> tuple:
    """Known metrics in METRICS order (list metrics by element), then the rest by name."""
    base, suffix = name, -1
    m = _SUFFIX.match(name)
    if m and m.group(1) in ORDER:
        base = m.group(1)
        s = m.group(2)
        suffix = {"low": 0, "high": 1}.get(s, int(s) if s.isdigit() else 0)
    rank = ORDER.index(base) if base in ORDER else len(ORDER)
    return (rank, base if rank == len(ORDER) else "", suffix)


def _normalise(col: pd.Series) -> np.ndarray:
    """Numbers and booleans as float64 (NaN where a run lacks the metric), text as text: the
    same dtype whichever shards the rows came from."""
    values = col.to_numpy()
    if values.dtype.kind in "biuf":
        return values.astype(float)
    non_null = [v for v in values if v is not None and not (isinstance(v, float) and v != v)]
    if all(isinstance(v, (bool, int, float, np.number, np.bool_)) for v in non_null):
        return np.array([np.nan if v is None else float(v) for v in values], dtype=float)
    return values.astype(object)
