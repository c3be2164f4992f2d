"""Sweep files: parsing, expansion into points, validation, and deterministic seeds.

A sweep file (the contract of issue 7)::

    base: scenarios/v4pro-dspark-10stage-wan.yaml   # relative to this file, then the cwd
    engine: des            # des | analytical
    grid:                  # cartesian product over dotted scenario fields (file order, last fastest)
      speculation.k: [1, 3, 5, 7]
      network.latency_ms: [5, 25, 80]
    zip: {}                # fields that vary together (equal-length lists): one more grid axis
    set: {workload.output_tokens: 3000}   # fixed overrides on the base
    seeds: 2               # replications per point
    vectorize: true        # analytical only: one evaluate_grid call per category (default)

Points are the cartesian product of the grid lists times the zipped rows. Identity and seeds:
every swept (field, value) pair gets a 64-bit hash of its canonical text (numbers as floats, so
``25`` and ``25.0`` are the same point); a point's hash mixes the sum of its pairs' hashes with
the scenario's own ``seed`` (after ``set``), so it does not depend on the order the fields are
written in or on the rest of the sweep. Replication r of a point runs with seed
``mix(point_hash + (r + 1) * golden) mod 2**63``. Same point + replication -> same seed -> same
metrics, whatever the backend, worker count, batch split or resume history.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from wansim.config.overrides import PER_STAGE_PATHS, apply_overrides, has_per_stage_lists
from wansim.config.raw import resolve_file, split_path
from wansim.config.scenario import Scenario, load_scenario, read_scenario_raw
from wansim.data import is_file
from wansim.errors import _UNSET, WansimInputError

ENGINES = ("des", "analytical")
KEYS = ("name", "base", "engine", "grid", "zip", "set", "seeds", "vectorize")
MASK63 = (1 << 63) - 1
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class SweepError(WansimInputError):
    """A sweep file (or one of its points) is wrong."""


# ----------------------------------------------------------------------------- hashing
def canonical(value: Any) -> str:
    """Canonical text of a YAML value: numbers as floats, mappings with sorted keys."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        return repr(float(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = sorted((str(k), canonical(v)) for k, v in value.items())
        return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in items) + "}"
    raise SweepError("sweep", "values must be YAML scalars, lists or mappings", str(value))


def pair_hash(field: str, value: Any) -> np.uint64:
    digest = hashlib.sha256(f"{field}={canonical(value)}".encode()).digest()
    return np.uint64(int.from_bytes(digest[:8], "little"))


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised over uint64 (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def run_seeds(point_hashes: np.ndarray, replicates: np.ndarray) -> np.ndarray:
    """Seed of replication r of each point (int64, in [0, 2**63))."""
    with np.errstate(over="ignore"):
        x = (
            np.asarray(point_hashes, dtype=np.uint64)
            + (np.asarray(replicates, dtype=np.uint64) + np.uint64(1)) * GOLDEN
        )
    return (mix64(x) & np.uint64(MASK63)).astype(np.int64)


def hash_column(h: np.ndarray) -> np.ndarray:
    """uint64 hashes as int64 (a parquet-friendly key with the same bits)."""
    return np.asarray(h, dtype=np.uint64).view(np.int64)


# ----------------------------------------------------------------------------- the spec
@dataclasses.dataclass
class Sweep:
    """A parsed sweep file (not yet expanded)."""

    path: Path | None
    name: str
    base_path: Path
    engine: str
    grid: dict[str, list]
    zip: dict[str, list]
    set: dict[str, Any]
    seeds: int
    vectorize: bool

    @property
    def fields(self) -> list[str]:
        return [*self.grid, *self.zip]

    def section_of(self, field: str) -> str:
        for section in ("grid", "zip", "set"):
            if field in getattr(self, section):
                return section
        return ""


def load_sweep(path: str | Path) -> Sweep:
    """Parse and check a sweep file's shape (values are checked later, by :func:`plan`)."""
    from wansim.config.raw import read_yaml_mapping

    path = Path(path)
    raw = read_yaml_mapping(path, "sweep")
    return parse_sweep(raw or {}, path.resolve().parent, path)


def parse_sweep(raw: Mapping, base_dir: Path, path: Path | None = None) -> Sweep:
    for key in raw:
        if key not in KEYS:
            raise SweepError(str(key), f"unknown key (allowed: {', '.join(KEYS)})", raw[key])
    if "base" not in raw:
        raise SweepError("base", "missing: the scenario file the sweep starts from")
    base = raw["base"]
    if not isinstance(base, str):
        raise SweepError("base", "must be a path to a scenario file", base)
    base_path = resolve_file(base, base_dir)
    if base_path is None or not is_file(base_path):
        raise SweepError("base", "file not found", base)
    engine = raw.get("engine", "des")
    if engine not in ENGINES:
        raise SweepError("engine", f"must be one of {' | '.join(ENGINES)}", engine)
    grid = _field_lists(raw.get("grid"), "grid")
    zipped = _field_lists(raw.get("zip"), "zip")
    if zipped:
        lengths = {k: len(v) for k, v in zipped.items()}
        if len(set(lengths.values())) > 1:
            raise SweepError("zip", "lists must all have the same length", lengths)
        rows = [canonical(list(r)) for r in zip(*zipped.values(), strict=True)]
        dup = _first_duplicate(rows)
        if dup is not None:
            raise SweepError("zip", "repeats a row", list(zip(*zipped.values(), strict=True))[dup])
    fixed = raw.get("set") or {}
    if not isinstance(fixed, Mapping):
        raise SweepError("set", "must be a mapping of field: value", fixed)
    fixed = {str(k): v for k, v in fixed.items()}
    seen: dict[str, str] = {}
    for section, fields in (("grid", grid), ("zip", zipped), ("set", fixed)):
        for field in fields:
            _check_path(f"{section}.{field}", field)
            if field in seen:
                raise SweepError(f"{section}.{field}", f"is also given in {seen[field]}")
            seen[field] = section
            if split_path(field) == ["seed"] and section != "set":
                raise SweepError(
                    f"{section}.seed",
                    "seeds are derived per point: use seeds: N for replications "
                    "(set: {seed: S} salts them)",
                )
    seeds = raw.get("seeds", 1)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise SweepError("seeds", "must be an integer >= 1 (replications per point)", seeds)
    vectorize = raw.get("vectorize", True)
    if not isinstance(vectorize, bool):
        raise SweepError("vectorize", "must be true or false", vectorize)
    name = raw.get("name", path.stem if path is not None else "sweep")
    if not isinstance(name, str):
        raise SweepError("name", "must be a string", name)
    return Sweep(
        path=path,
        name=name,
        base_path=base_path,
        engine=engine,
        grid=grid,
        zip=zipped,
        set=fixed,
        seeds=seeds,
        vectorize=vectorize,
    )


def _check_path(where: str, field: str) -> None:
    try:
        split_path(field)
    except WansimInputError:
        raise SweepError(where, "bad field path (use a.b.c or a.b[3].c)") from None


def _field_lists(value: Any, section: str) -> dict[str, list]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SweepError(section, "must be a mapping of field: [values]", value)
    out = {}
    for field, values in value.items():
        where = f"{section}.{field}"
        if not isinstance(values, list) or not values:
            raise SweepError(where, "must be a non-empty list of values", values)
        dup = _first_duplicate([canonical(v) for v in values])
        if dup is not None:
            raise SweepError(where, "repeats a value", values[dup])
        out[str(field)] = values
    return out


def _first_duplicate(keys: list[str]) -> int | None:
    seen = set()
    for i, k in enumerate(keys):
        if k in seen:
            return i
        seen.add(k)
    return None


# ----------------------------------------------------------------------------- points
@dataclasses.dataclass
class Plan:
    """A sweep expanded into points, every point validated.

    ``index[f][i]`` is the position in ``values[f]`` of field f's value at point i.
    ``scenarios`` holds the validated scenario of every point (per-point engines) or is None
    (vectorised analytical sweeps, which validate values per field instead).
    """

    sweep: Sweep
    base: Scenario | None  # None when only the points (not the base after set) are valid
    base_raw: dict
    fields: list[str]
    values: dict[str, list]
    index: dict[str, np.ndarray]
    point_hash: np.ndarray  # uint64 per point
    scenarios: list[Scenario] | None
    fingerprint: str

    @property
    def n_points(self) -> int:
        return len(self.point_hash)

    @property
    def n_runs(self) -> int:
        return self.n_points * self.sweep.seeds

    def overrides(self, i: int) -> dict[str, Any]:
        return {f: self.values[f][int(self.index[f][i])] for f in self.fields}

    def describe(self, i: int) -> str:
        return ", ".join(f"{f}={_short(v)}" for f, v in self.overrides(i).items())

    def run_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """(point index, replicate) of every run, point-major."""
        s = self.sweep.seeds
        runs = np.arange(self.n_runs)
        return runs // s, runs % s

    def field_columns(self, points: np.ndarray) -> dict[str, np.ndarray]:
        """The swept fields' values at the given points, as table columns."""
        return {f: table_column(self.values[f])[self.index[f][points]] for f in self.fields}


def _short(value: Any) -> str:
    return canonical(value) if not isinstance(value, (int, float, str)) else str(value)


def table_column(values: list) -> np.ndarray:
    """A list of YAML values as an array fit for a table: numbers, bools or strings natively,
    anything else (lists, mappings, null, mixed kinds) as canonical text."""
    if all(isinstance(v, bool) for v in values):
        return np.array(values, dtype=bool)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.int64)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=float)
    if all(isinstance(v, str) for v in values):
        return np.array(values, dtype=object)
    return np.array([v if isinstance(v, str) else canonical(v) for v in values], dtype=object)


def plan(sweep: Sweep, *, check_engine=None) -> Plan:
    """Expand the sweep and validate every point (or, vectorised, every value) up front.

    ``check_engine(scenario)`` raises a :class:`WansimInputError` for a point the engine
    cannot run. Any bad value fails the whole sweep here, naming the field path.
    """
    base_dir = sweep.base_path.parent
    raw = read_scenario_raw(sweep.base_path)
    try:
        raw = apply_overrides(raw, sweep.set)
    except WansimInputError as err:
        raise _locate(err, sweep, None) from None
    base = None
    try:
        base = load_scenario(data=raw, base_dir=base_dir)
    except WansimInputError as err:
        # the base after set may be invalid only in what every point overrides (e.g. a K
        # beyond one drafter's data, swept over valid values): the points are checked below
        if not any(_covers(f, err.path or "") for f in sweep.fields):
            raise _locate(err, sweep, None) from None
    seed = base.seed if base is not None else raw.get("seed", 0)

    fields = sweep.fields
    values = {**sweep.grid, **sweep.zip}
    shape = [len(v) for v in sweep.grid.values()]
    zip_len = len(next(iter(sweep.zip.values()))) if sweep.zip else None
    if zip_len is not None:
        shape.append(zip_len)
    n = math.prod(shape) if shape else 1
    flat = np.unravel_index(np.arange(n), shape) if shape else ()
    index: dict[str, np.ndarray] = {}
    for axis, field in enumerate(sweep.grid):
        index[field] = flat[axis].astype(np.int64)
    for field in sweep.zip:
        index[field] = flat[-1].astype(np.int64)

    salt = pair_hash("seed", seed)
    total = np.full(n, salt, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for field in fields:
            hashes = np.array([pair_hash(field, v) for v in values[field]], dtype=np.uint64)
            total += hashes[index[field]]
    point_hash = mix64(total)
    ordered = np.sort(point_hash)
    if (ordered[1:] == ordered[:-1]).any():  # a 64-bit collision: astronomically unlikely
        raise SweepError("grid", "two points hash alike; reorder or perturb a value", n)

    vectorised = sweep.engine == "analytical" and sweep.vectorize
    scenarios = None
    if vectorised:
        _validate_vectorised(sweep, raw, base_dir, values, index, fields, check_engine)
    else:
        scenarios = []
        probe = Plan(sweep, base, raw, fields, values, index, point_hash, None, "")
        for i in range(n):
            over = probe.overrides(i)
            try:
                sc = load_scenario(data=raw, overrides=over, base_dir=base_dir)
                if check_engine is not None:
                    check_engine(sc)
            except WansimInputError as err:
                raise _locate(err, sweep, over) from None
            scenarios.append(sc)
    fingerprint = sweep_fingerprint(sweep, raw)
    return Plan(sweep, base, raw, fields, values, index, point_hash, scenarios, fingerprint)


def _validate_vectorised(sweep, raw, base_dir, values, index, fields, check_engine) -> None:
    """Per category (distinct values of the non-vectorisable fields): the category's first
    point, then every combination of the vectorised fields' values when there are at most 256,
    else every value of each field with the other fields at the first point's values."""
    vec, cat = split_fields(fields, values, has_per_stage_lists(raw))
    for group in category_groups(cat, values, index):
        first = group_base_overrides(values, index, group, vec, cat)
        distinct = {
            f: np.flatnonzero(np.bincount(index[f][group.points], minlength=len(values[f])))
            for f in vec
        }
        combos = math.prod(len(v) for v in distinct.values()) if distinct else 1
        if combos <= 256:
            trials = [
                {**first, **dict(zip(vec, c, strict=True))}
                for c in itertools.product(*([values[f][j] for j in distinct[f]] for f in vec))
            ]
        else:
            trials = [first] + [{**first, f: values[f][j]} for f in vec for j in distinct[f]]
        for t in trials:
            try:
                sc = load_scenario(data=raw, overrides=t, base_dir=base_dir)
                if check_engine is not None:
                    check_engine(sc)
            except WansimInputError as err:
                raise _locate(err, sweep, t) from None
        # the grid evaluator's own guards (fields it cannot vary on this base), on one point
        # made of each field's largest value
        from wansim.analytical import evaluate_grid

        group_base = load_scenario(data=raw, overrides=first, base_dir=base_dir)
        probe = {f: np.asarray([max(values[f][j] for j in distinct[f])]) for f in vec}
        try:
            evaluate_grid(group_base, probe, mesh=False, validate=False)
        except WansimInputError as err:
            raise _locate(err, sweep, first) from None


def group_base_overrides(values, index, group, vec, cat) -> dict[str, Any]:
    """The overrides of a category's first point (the base its vectorised fields vary on)."""
    p0 = int(group.points[0])
    return {f: values[f][int(index[f][p0])] for f in [*cat, *vec]}


def split_fields(
    fields: list[str], values: dict, per_stage_lists: bool = False
) -> tuple[list[str], list[str]]:
    """(fields the closed forms take as arrays, category fields looped over): a field is
    vectorised when ``evaluate_grid`` accepts it and all its values are numbers (``stages`` is a
    category when the base or the sweep gives per-stage hops or compute: each count is its own
    scenario)."""
    from wansim.analytical.grid import VECTOR_FIELDS

    def numeric(vs: list) -> bool:
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vs)

    per_stage_lists = per_stage_lists or any(f.startswith(PER_STAGE_PATHS) for f in fields)
    vec = [
        f
        for f in fields
        if f in VECTOR_FIELDS and numeric(values[f]) and not (f == "stages" and per_stage_lists)
    ]
    return vec, [f for f in fields if f not in vec]


@dataclasses.dataclass
class Group:
    key: tuple[int, ...]  # value index of each category field
    points: np.ndarray  # point indices in this category


def category_groups(cat: list[str], values: dict, index: dict) -> list[Group]:
    """Points grouped by the values of the category fields (one group when there are none)."""
    n = len(next(iter(index.values()))) if index else 1
    if not cat:
        return [Group((), np.arange(n))]
    codes = np.stack([index[f] for f in cat], axis=1)
    keys, inverse = np.unique(codes, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(keys) + 1))
    return [
        Group(tuple(int(x) for x in keys[g]), np.sort(order[bounds[g] : bounds[g + 1]]))
        for g in range(len(keys))
    ]


def _locate(err: WansimInputError, sweep: Sweep, point: Mapping | None) -> SweepError:
    """Name where a bad value came from: ``grid.<field>`` / ``zip.`` / ``set.``, or the point."""
    path = err.path or ""
    value = err.value
    for field in sorted(sweep.fields + list(sweep.set), key=len, reverse=True):
        if _covers(field, path):
            section = sweep.section_of(field)
            if point is not None and field in point and value is _UNSET:
                value = point[field]
            return SweepError(f"{section}.{path}", err.problem, value)
    where = ""
    if point:
        where = " (at point " + ", ".join(f"{k}={_short(v)}" for k, v in point.items()) + ")"
    elif sweep.set:
        where = " (with set)"
    return SweepError(path, err.problem + where, value)


def sweep_fingerprint(sweep: Sweep, base_raw: Mapping) -> str:
    """What every point's meaning depends on: the engine, the mode, the base file and the base
    mapping after ``set`` (the grid, zip and seeds may grow between resumed runs: points are
    keyed by their hash)."""
    data = {
        "engine": sweep.engine,
        "vectorize": sweep.engine == "analytical" and sweep.vectorize,
        "base_path": str(sweep.base_path),
        "base": base_raw,
    }
    return hashlib.sha256(canonical(data).encode()).hexdigest()[:16]


def _covers(field: str, path: str) -> bool:
    return path == field or path.startswith((field + ".", field + "["))
