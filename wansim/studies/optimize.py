"""The optimum over a grid of scenario fields: the analytical engine ranks every point
(vectorised where the fields allow), the DES can re-run the best ones (``confirm_des``).

``wansim optimize`` (wansim.cli.speculation) is this module's command line.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from wansim.errors import WansimInputError
from wansim.user_yaml import load_yaml_text

LOWER_IS_BETTER = (
    "lap_ms_mean",
    "lap_ms_p50",
    "lap_ms_p99",
    "tpot_ms_mean",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "ttft_ms_mean",
    "bubble_fraction",
    "bytes_per_token",
    "wasted_token_fraction",
)

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
) -> dict:
    """Evaluate the grid with the analytical engine; returns the ranked table and skips.

    Numeric fields the vectorised grid accepts (``analytical.grid.VECTOR_FIELDS``) are evaluated
    in one call per combination of the other fields. A value that makes the scenario invalid
    (e.g. K beyond the measured positions) is skipped and reported, not fatal.
    """
    import numpy as np
    import pandas as pd

    from wansim.analytical import check_supported, evaluate_grid
    from wansim.analytical.grid import VECTOR_FIELDS
    from wansim.metrics import METRICS
    from wansim.scenario import (
        PER_STAGE_PATHS,
        has_per_stage_lists,
        load_scenario,
        scenario_to_dict,
    )

    names = [f for f, _ in overs]
    if len(set(names)) != len(names):
        raise WansimInputError("--over", "names a field twice", names)
    if metric not in METRICS or metric in ("stage_utilization", "tokens_per_s_ci95"):
        raise WansimInputError("--metric", "not a scalar metric name", metric)
    if direction is None:
        direction = "min" if metric in LOWER_IS_BETTER else "max"
    sets = list(sets or [])
    base = load_scenario(path, sets)
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
    if metric not in table:
        raise WansimInputError("--metric", "the analytical grid does not give it", metric)
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
    from wansim.scenario import load_scenario

    sc = load_scenario(path, sets + [f"{k}={_yaml(v)}" for k, v in config.items()])
    return approximation(sc).to_json()


def confirm_des(path: str, sets: list[str], configs: list[dict], metric: str) -> list[dict]:
    """Re-run configurations with the DES; each entry gets the DES metric and its interval."""
    import wansim
    from wansim.scenario import load_scenario

    out = []
    for cfg in configs:
        sc = load_scenario(path, sets + [f"{k}={_yaml(v)}" for k, v in cfg.items()])
        res = wansim.simulate(sc)
        entry = {"value": float(res.metrics[metric])}
        if f"{metric}_ci95" in res.metrics:
            ci = res.metrics[f"{metric}_ci95"]
            entry["ci95"] = None if ci is None else [float(ci[0]), float(ci[1])]
            if ci is None:  # undefined (too few laps): say why, compare nothing
                entry["ci95_undefined"] = res.undefined().get(f"{metric}_ci95")
        out.append(entry)
    return out
