"""The optimum over a grid of scenario fields: the analytical engine ranks every point
(vectorised where the fields allow), the DES can re-run the best ones (``confirm_des``).

``wansim optimize`` (wansim.cli.speculation) is this module's command line.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from wansim.config.user_yaml import load_yaml_text
from wansim.errors import WansimInputError

LOWER_IS_BETTER = (
    "lap_ms_mean",
    "lap_ms_p50",
    "lap_ms_p99",
    "tpot_ms_mean",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "ttft_ms_mean",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "e2e_ms_p50",
    "e2e_ms_p99",
    "queue_ms_mean",
    "queue_ms_p99",
    "bubble_fraction",
    "bytes_per_token",
    "wasted_token_fraction",
    "failed_requests",
)
# metrics outside the vectorised grid (tails, serving metrics) cost one analytical run per point
MAX_POINT_RUNS = 2000

_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")


def parse_over(text: str) -> tuple[str, list[Any]]:
    """'speculation.k=1..16' -> ('speculation.k', [1..16]); 'a.b=4,8,16' -> list of scalars."""
    if "=" not in text:
        raise WansimInputError("--over", "expected FIELD=a..b or FIELD=v1,v2,...", text)
    field, _, spec = text.partition("=")
    field = field.strip()
    if not field:
        raise WansimInputError("--over", "names no field", text)
    m = _RANGE.match(spec)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if hi < lo:
            raise WansimInputError(f"--over {field}", "range a..b needs a <= b", spec)
        if hi - lo > 100_000:
            raise WansimInputError(f"--over {field}", "range has more than 100000 values", spec)
        return field, list(range(lo, hi + 1))
    values = []
    for item in spec.split(","):
        if not item.strip():
            raise WansimInputError(f"--over {field}", "empty value in the list", spec)
        try:
            values.append(load_yaml_text(item, f"--over {field}"))
        except WansimInputError as err:
            raise WansimInputError(f"--over {field}", f"value: {err.problem}", item) from None
    return field, values


def optimize(
    path: str,
    overs: list[tuple[str, list[Any]]],
    *,
    sets: list[str] | None = None,
    metric: str = "tokens_per_s",
    direction: str | None = None,
    constraints: list | None = None,
) -> dict:
    """Evaluate the grid with the analytical engine; returns the ranked table and skips.

    Numeric fields the vectorised grid accepts (``analytical.grid.VECTOR_FIELDS``) are evaluated
    in one call per combination of the other fields. A value that makes the scenario invalid
    (e.g. K beyond the measured positions) is skipped and reported, not fatal. Any reported
    scalar metric may be the objective or bounded by ``constraints``
    (:class:`wansim.studies.constraints.Bound`, points that break one are dropped); those the
    grid does not give (tails such as ``tpot_ms_p99``, the serving metrics) come from one
    analytical run per point (at most ``MAX_POINT_RUNS`` points).
    """
    import numpy as np
    import pandas as pd

    from wansim.analytical import check_supported, evaluate_grid
    from wansim.analytical.grid import VECTOR_FIELDS
    from wansim.config.overrides import PER_STAGE_PATHS, has_per_stage_lists
    from wansim.config.scenario import load_scenario, scenario_to_dict
    from wansim.studies.constraints import BOUNDABLE

    names = [f for f, _ in overs]
    if len(set(names)) != len(names):
        raise WansimInputError("--over", "names a field twice", names)
    if metric not in BOUNDABLE and metric != "tpot_ms_mean":
        raise WansimInputError(
            "--metric", f"not a scalar metric (known: {', '.join(BOUNDABLE)})", metric
        )
    constraints = list(constraints or [])
    if direction is None:
        direction = "min" if metric in LOWER_IS_BETTER else "max"
    sets = list(sets or [])
    base = load_scenario(path, sets)
    from wansim.results.metric_names import FAULT_METRICS

    for name in (metric, *(b.metric for b in constraints)):
        if name in FAULT_METRICS and not base.faults.events:
            raise WansimInputError(
                "--metric" if name == metric else "--constraint",
                "is reported with faults only (the scenario has no faults.events)",
                name,
            )
    per_stage = has_per_stage_lists(scenario_to_dict(base)) or any(
        f.startswith(PER_STAGE_PATHS) for f, _ in overs
    )
    vec = [
        (f, v)
        for f, v in overs
        if f in VECTOR_FIELDS
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
        and not (f == "stages" and per_stage)
    ]
    other = [(f, v) for f, v in overs if (f, v) not in vec]
    skipped: list[dict] = []
    frames = []
    points = math.prod(len(v) for _, v in overs) if overs else 1
    for combo in itertools.product(*(v for _, v in other)):
        fixed = dict(zip((f for f, _ in other), combo, strict=True))
        try:
            sc = load_scenario(path, sets + [f"{k}={_yaml(v)}" for k, v in fixed.items()])
            check_supported(sc)
            unseen_quality(sc)
        except WansimInputError as err:
            skipped.append({"point": fixed, "error": str(err)})
            continue
        raw = scenario_to_dict(sc)
        grid = {}
        for field, values in vec:
            keep = []
            for v in dict.fromkeys(values):
                try:
                    unseen_quality(load_scenario(data=raw, overrides={field: v}))
                    keep.append(v)
                except WansimInputError as err:
                    skipped.append({"point": {**fixed, field: v}, "error": str(err)})
            grid[field] = keep
        if any(len(v) == 0 for v in grid.values()):
            continue
        try:
            frame = evaluate_grid(sc, grid) if grid else evaluate_grid(sc, {})
        except WansimInputError as err:
            skipped.append({"point": fixed, "error": str(err)})
            continue
        for key, value in fixed.items():
            frame.insert(0, key, [value] * len(frame))
        frames.append(frame)
    if not frames:
        first = skipped[0]["error"] if skipped else "no points"
        raise WansimInputError("--over", f"no feasible point ({first})", [f for f, _ in overs])
    table = pd.concat(frames, ignore_index=True)
    needed = [m for m in dict.fromkeys([metric, *(b.metric for b in constraints)])]
    missing = [m for m in needed if m not in table]
    if missing:
        table = _per_point(path, sets, names, table, missing)
    kept = np.ones(len(table), dtype=bool)
    for bound in constraints:
        kept &= np.array([bound.holds({bound.metric: v}) for v in table[bound.metric]])
    constrained_out = int((~kept).sum())
    table = table[kept]
    if table.empty:
        raise WansimInputError(
            "--constraint",
            f"no evaluated point meets {', '.join(str(b) for b in constraints)}",
            f"{constrained_out} points",
        )
    table = table.sort_values(metric, ascending=direction == "min", kind="stable")
    table = table.reset_index(drop=True)
    return {
        "scenario": base.name,
        "metric": metric,
        "direction": direction,
        "fields": names,
        "points": points,
        "evaluated": len(table),
        "skipped": skipped,
        "constrained_out": constrained_out,
        "table": table,
        "base": base,
        "values": np.asarray(table[metric]),
    }


def unseen_quality(sc) -> None:
    """Refuse a point whose activation width has a quality cost the scenario's acceptance does
    not give (:mod:`wansim.acceptance.activation_quality`): the optimum must not be a width
    that only looks free because its cost is unseen."""
    from wansim.speculation import bit_quality

    if sc.speculation.policy != "none" and not bit_quality(sc).visible:
        raise WansimInputError(
            "payload.activation_bits",
            "its quality cost is not measured for this acceptance (give"
            " drafter.acceptance.activation_quality, a table per bit width)",
            sc.payload.activation_bits,
        )


def _per_point(path, sets, names, table, missing):
    """Add the ``missing`` metrics to every row by one analytical run per point."""
    import wansim
    from wansim.config.scenario import load_scenario

    if len(table) > MAX_POINT_RUNS:
        raise WansimInputError(
            "--metric",
            f"{', '.join(missing)} needs one analytical run per point; the grid has"
            f" {len(table)} (at most {MAX_POINT_RUNS}: narrow --over)",
            len(table),
        )
    columns: dict[str, list] = {m: [] for m in missing}
    for _, row in table.iterrows():
        sc = load_scenario(path, sets + [f"{f}={_yaml(scalar(row[f]))}" for f in names])
        metrics = wansim.analyze(sc).metrics
        for m in missing:
            value = metrics.get(m)
            columns[m].append(float("nan") if value is None else float(value))
    table = table.copy()
    for m, values in columns.items():
        table[m] = values
    return table


def edge_fields(overs: list[tuple[str, list[Any]]], config: dict) -> list[str]:
    """Numeric --over fields (3 or more values) whose optimum is the smallest or largest value
    searched: the optimum may lie beyond the grid."""
    out = []
    for field, values in overs:
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(set(nums)) < 3 or len(nums) != len(values):
            continue
        if config.get(field) in (min(nums), max(nums)):
            out.append(field)
    return out


def extrapolated(path: str, sets: list[str], config: dict) -> str | None:
    """Why the configuration's acceptance is extrapolated (K or tree depth beyond the positions
    the profile measured, the last rate held), or None."""
    from wansim.config.scenario import acceptance_depth, load_scenario

    sc = load_scenario(path, sets + [f"{k}={_yaml(v)}" for k, v in config.items()])
    need, measured = acceptance_depth(sc)
    if measured is None or need <= measured:
        return None
    return (
        f"needs acceptance at {need} positions; the acceptance measured {measured}"
        " (the last rate is held beyond)"
    )


def _yaml(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def scalar(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return value


def trust(path: str, sets: list[str], config: dict) -> dict:
    """The analytical engine's approximation for one configuration (regime, validated,
    error band: :mod:`wansim.analytical.regime`)."""
    from wansim.analytical.regime import approximation
    from wansim.config.scenario import load_scenario

    sc = load_scenario(path, sets + [f"{k}={_yaml(v)}" for k, v in config.items()])
    return approximation(sc).to_json()


def confirm_des(path: str, sets: list[str], configs: list[dict], metric: str) -> list[dict]:
    """Re-run configurations with the DES; each entry gets the DES metric and its interval."""
    import wansim
    from wansim.config.scenario import load_scenario

    out = []
    for cfg in configs:
        sc = load_scenario(path, sets + [f"{k}={_yaml(v)}" for k, v in cfg.items()])
        res = wansim.simulate(sc)
        entry = {"value": float(res.metrics[metric])}
        if f"{metric}_ci95" in res.metrics:
            ci = res.metrics[f"{metric}_ci95"]
            entry["ci95"] = None if ci is None else [None if v is None else float(v) for v in ci]
            if ci is None or None in ci:  # undefined or a side unbounded: say why
                entry["ci95_undefined"] = res.undefined().get(f"{metric}_ci95")
        out.append(entry)
    return out
