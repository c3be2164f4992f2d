"""Evaluate the closed forms over a grid of scenarios in one vectorised call.

Numeric fields listed in :data:`VECTOR_FIELDS` may vary per point: their values become numpy
arrays inside an otherwise ordinary scenario, and the same functions that evaluate one scenario
evaluate all points by broadcasting (chunked to bound memory). Every distinct value of every
field is validated through the scenario loader first, so a bad value fails with its field path
before anything is computed. Categorical fields (policy, kinds) are not vectorised: evaluate one
grid per category. TCP, faults, a KV capacity and a shared host are answered one point at a
time by the model ``analyze`` uses (fixed points, an expected value over the run, an admission
queue: :func:`wansim.analytical.coverage.needs_points`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

import numpy as np
import pandas as pd

from wansim.analytical.coverage import check_grid, check_supported, needs_points
from wansim.analytical.engine import GRID_KEYS, mean_metrics, point_means
from wansim.config.raw import split_path
from wansim.config.scenario import Scenario, load_scenario, scenario_to_dict
from wansim.config.validation import parsing_memoised
from wansim.errors import ScenarioError
from wansim.links.nonstationary import network_modulation

VECTOR_FIELDS = (
    "stages",
    "speculation.k",
    "speculation.tree.budget_nodes",
    "network.latency_ms",
    "network.bandwidth_mbps",
    "network.loss_rate",
    "network.retransmit_ms",
    "payload.activation_bits",
    "payload.header_bytes",
    "payload.return_bytes",
    "model.hidden_size",
    "model.compute.base_ms",
    "model.compute.per_token_ms",
    "drafter.draft_ms",
    "drafter.width_ms",
    "drafter.acceptance.alpha",
    "drafter.acceptance.domain_shift",
    "workload.output_tokens",
    "workload.prompt_tokens",
    "workload.concurrency",
    "workload.requests",
    "schedule.max_inflight_blocks",
)
CHUNK = 1 << 18
OPEN_MESH = True


def replace_dotted(obj, dotted: str, value):
    """A copy of nested frozen dataclasses with one field replaced (value may be an array)."""
    parts = split_path(dotted)
    return _replace(obj, parts, value)


def _replace(obj, parts, value):
    head = parts[0]
    if len(parts) == 1:
        return dataclasses.replace(obj, **{head: value})
    return dataclasses.replace(obj, **{head: _replace(getattr(obj, head), parts[1:], value)})


def evaluate_grid(
    base: Scenario,
    grid: Mapping[str, np.ndarray | list],
    *,
    mesh: bool = True,
    validate: bool = True,
) -> pd.DataFrame:
    """Mean metrics for every point. ``mesh=True``: the cartesian product of the value lists;
    ``mesh=False``: the arrays are points already (equal length or broadcastable)."""
    check_supported(base)
    if network_modulation(base.network) is not None:
        raise ScenarioError(
            "network.drift" if base.network.trace_file is None else "network.trace_file",
            "time-varying links are not evaluated in a vectorised grid (run the points with"
            " wansim run, or sweep with --engine des)",
            base.network.trace_file or "drift",
        )
    wl = base.workload
    if wl.lengths.kind != "fixed" or wl.mix:
        field, value = (
            ("workload.lengths.kind", wl.lengths.kind)
            if wl.lengths.kind != "fixed"
            else ("workload.mix", [r.workload for r in wl.mix])
        )
        raise ScenarioError(
            field,
            "the vectorised grid evaluates like requests (fixed lengths, one acceptance row);"
            " wansim run / analyze take expectations over the workload",
            value,
        )
    for key in grid:
        if key not in VECTOR_FIELDS:
            raise ScenarioError(
                key, f"cannot vary in a vectorised grid (allowed: {', '.join(VECTOR_FIELDS)})", None
            )
    if "stages" in grid and base.network.hops:
        raise ScenarioError(
            "stages", "cannot vary when network.hops lists per-hop values", list(grid["stages"])
        )
    arrays = {k: np.asarray(v) for k, v in grid.items()}
    if validate:
        _validate(base, arrays)
    if mesh:
        mesh_arrays = np.meshgrid(*arrays.values(), indexing="ij")
        points = {k: m.ravel() for k, m in zip(arrays, mesh_arrays, strict=True)}
    else:
        shape = np.broadcast_shapes(*(a.shape for a in arrays.values()))
        points = {k: np.broadcast_to(a, shape).flatten() for k, a in arrays.items()}  # new arrays
    n = len(next(iter(points.values()))) if points else 1
    if needs_points(base):
        check_grid(base)
        return _point_by_point(base, points, n)
    if mesh and points and OPEN_MESH:
        return _open_mesh(base, arrays, points, n)
    chunks = []
    for start in range(0, n, CHUNK):
        sl = slice(start, start + CHUNK)
        sc = base
        for key, arr in points.items():
            sc = replace_dotted(sc, key, arr[sl])
        out = mean_metrics(sc)
        size = min(CHUNK, n - start)
        chunks.append({k: np.broadcast_to(out[k], (size,)) for k in GRID_KEYS})
    return _frame({k: np.concatenate([c[k] for c in chunks]) for k in GRID_KEYS}, points, n)


def _point_by_point(base: Scenario, points, n: int) -> pd.DataFrame:
    """TCP, faults, a KV capacity, a shared host (:func:`wansim.analytical.coverage.needs_points`):
    each point by the model ``analyze`` uses (milliseconds a point, not microseconds)."""
    rows = []
    for i in range(n):
        sc = base
        for key, arr in points.items():
            sc = replace_dotted(sc, key, arr[i].item())
        rows.append(point_means(sc))
    metrics = {k: np.array([r[k] for r in rows], dtype=float) for k in GRID_KEYS}
    metrics["target_exact"] = metrics["target_exact"].astype(bool)
    return _frame(metrics, points, n)


def _open_mesh(base: Scenario, arrays, points, n: int) -> pd.DataFrame:
    """A cartesian grid evaluated on an open mesh: axis j's values have shape (1, .., m_j, .., 1),
    so every intermediate is computed only over the axes it depends on (serialisation over k,
    bits and bandwidth; not over latency or stages) and broadcast at the end."""
    dims = len(arrays)
    shape = tuple(len(a) for a in arrays.values())
    sc = base
    for j, (key, arr) in enumerate(arrays.items()):
        sc = replace_dotted(sc, key, arr.reshape([-1 if i == j else 1 for i in range(dims)]))
    out = mean_metrics(sc)
    return _frame({k: np.broadcast_to(out[k], shape) for k in GRID_KEYS}, points, n)


def _frame(metrics: Mapping[str, np.ndarray], points, n: int) -> pd.DataFrame:
    """The result frame: the grid's fields (last first), then the metrics in ``GRID_KEYS``
    order. Each metric is written once into its own new array, and the frame takes those and
    the (new) point arrays without a copy."""
    columns = {key: points[key] for key in reversed(points)}
    for k in GRID_KEYS:
        column = np.empty(n, dtype=metrics[k].dtype)
        np.copyto(column.reshape(metrics[k].shape), metrics[k])
        columns[k] = column
    return pd.DataFrame(columns, copy=False)


def _validate(base: Scenario, arrays: Mapping[str, np.ndarray]) -> None:
    """Validate every distinct value of each field on the base (and all combinations when few)."""
    raw = scenario_to_dict(base)
    distinct = {k: np.unique(a).tolist() for k, a in arrays.items()}
    combos = 1
    for values in distinct.values():
        combos *= len(values)
    with parsing_memoised():  # the sub-configs no value touches are parsed once
        if combos <= 256:
            for combo in itertools.product(*distinct.values()):
                load_scenario(data=raw, overrides=dict(zip(distinct, combo, strict=True)))
            return
        for key, values in distinct.items():
            for v in values:
                load_scenario(data=raw, overrides={key: v})
