"""CLI commands for speculation policies: ``wansim trees best``, ``wansim drafters`` and
``wansim optimize`` (registered through ``wansim.cli.EXTRA_COMMANDS``).

Bad input exits 2 with one line ``flag: problem, got value`` (flags are validated here, not by
argparse, so that a bad value never prints a usage block).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
from typing import Any

from wansim.errors import WansimInputError

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


# ----------------------------------------------------------------------------- helpers
def _int_flag(flag: str, text: str | None, low: int, high: int | None = None) -> int:
    try:
        value = int(str(text))
    except ValueError:
        raise WansimInputError(flag, "must be an integer", text) from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise WansimInputError(flag, f"must be {bound}", value)
    return value


def _require(flag: str, value: Any) -> Any:
    if value is None:
        raise WansimInputError(flag, "is required")
    return value


# ----------------------------------------------------------------------------- trees best
def cmd_trees_best(args: argparse.Namespace) -> int:
    """The optimal (or greedy) tree for a depth-independent positional acceptance vector."""
    from wansim.acceptance import trees as tr
    from wansim.speculation import MAX_TREE_NODES

    acceptance = tr.parse_acceptance_vector(_require("--acceptance", args.acceptance))
    if args.kind not in ("sequoia", "dynamic"):
        raise WansimInputError("--kind", "must be sequoia or dynamic", args.kind)
    budget = _int_flag(
        "--budget-nodes", _require("--budget-nodes", args.budget_nodes), 1, MAX_TREE_NODES
    )
    depth = budget
    if args.max_depth is not None:
        depth = min(budget, _int_flag("--max-depth", args.max_depth, 1))
    rates = tr.positional_rates(acceptance, depth)
    if args.kind == "dynamic":
        tree = tr.greedy_tree(rates, budget)
        value = float(tr.expected_tokens(tree, rates))
    else:
        tree, value = tr.optimal_tree(rates, budget)
    out = {
        "expected_tokens": value,
        "nodes": tree.nodes,
        "depth": tree.max_depth,
        "branching": tree.branching(),
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"{args.kind} tree for P = {', '.join(f'{p:g}' for p in acceptance)}, budget {budget}"
        f" nodes{'' if args.max_depth is None else f', depth <= {depth}'}"
    )
    print(f"expected tokens per pass (root counted): {value:.6g}")
    print(f"nodes {tree.nodes}, depth {tree.max_depth}, nodes per depth {list(tree.level_widths)}")
    print(f"branching (children per node, breadth-first, root first): {out['branching']}")
    return 0


# ----------------------------------------------------------------------------- drafters
def cmd_drafters(args: argparse.Namespace) -> int:
    from wansim.drafters import catalog_rows

    rows = catalog_rows()
    if args.json:
        print(json.dumps(rows))
        return 0
    cols = ["preset", "kind", "placement", "drafting", "draft_ms", "width_ms", "acceptance"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in cols))
    print("\nwhere each figure comes from:")
    for r in rows:
        print(f"- {r['preset']}: {r['family']}")
        for what, src in r["sources"].items():
            print(f"    {what}: {src}")
    print("\nuse: drafter: {preset: NAME, ...}  (explicit keys override the preset's)")
    return 0


# ----------------------------------------------------------------------------- optimize
_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")


def parse_over(text: str) -> tuple[str, list[Any]]:
    """'speculation.k=1..16' -> ('speculation.k', [1..16]); 'a.b=4,8,16' -> list of scalars."""
    import yaml

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
            values.append(yaml.safe_load(item))
        except yaml.YAMLError:
            raise WansimInputError(f"--over {field}", "value is not valid YAML", item) from None
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
    from wansim.scenario import load_scenario, scenario_to_dict

    names = [f for f, _ in overs]
    if len(set(names)) != len(names):
        raise WansimInputError("--over", "names a field twice", names)
    if metric not in METRICS or metric in ("stage_utilization", "tokens_per_s_ci95"):
        raise WansimInputError("--metric", "not a scalar metric name", metric)
    if direction is None:
        direction = "min" if metric in LOWER_IS_BETTER else "max"
    sets = list(sets or [])
    base = load_scenario(path, sets)
    vec = [
        (f, v)
        for f, v in overs
        if f in VECTOR_FIELDS
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
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
        except WansimInputError as err:
            skipped.append({"point": fixed, "error": str(err)})
            continue
        raw = scenario_to_dict(sc)
        grid = {}
        for field, values in vec:
            keep = []
            for v in dict.fromkeys(values):
                try:
                    load_scenario(data=raw, overrides={field: v})
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


def _yaml(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _plain(value: Any) -> Any:
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
        ci = res.metrics.get(f"{metric}_ci95")
        if ci is not None:
            entry["ci95"] = [float(ci[0]), float(ci[1])]
        out.append(entry)
    return out


def cmd_optimize(args: argparse.Namespace) -> int:
    if not args.over:
        raise WansimInputError("--over", "give at least one FIELD=a..b or FIELD=v1,v2", None)
    overs = [parse_over(o) for o in args.over]
    top = _int_flag("--top", args.top, 1)
    if args.confirm not in ("auto", "des", "none"):
        raise WansimInputError("--confirm", "must be auto, des or none", args.confirm)
    if args.direction not in (None, "max", "min"):
        raise WansimInputError("--direction", "must be max or min", args.direction)
    res = optimize(
        args.scenario, overs, sets=args.set, metric=args.metric, direction=args.direction
    )
    table = res["table"]
    fields = res["fields"]
    metric = res["metric"]
    head = table.head(top)
    configs = [{f: _plain(row[f]) for f in fields} for _, row in head.iterrows()]
    rows = [
        {
            "config": cfg,
            metric: float(row[metric]),
            "tau": float(row["tau"]),
            "tokens_per_s": float(row["tokens_per_s"]),
            "lap_ms_mean": float(row["lap_ms_mean"]),
        }
        for cfg, (_, row) in zip(configs, head.iterrows(), strict=True)
    ]
    for row in rows:
        row["approximation"] = trust(args.scenario, args.set, row["config"])
    # auto: the DES re-checks every top configuration the analytical engine cannot vouch for
    recheck = [
        i
        for i, row in enumerate(rows)
        if args.confirm == "des"
        or (args.confirm == "auto" and not row["approximation"]["validated"])
    ]
    if recheck:
        found = confirm_des(args.scenario, args.set, [configs[i] for i in recheck], metric)
        for i, des in zip(recheck, found, strict=True):
            row = rows[i]
            row["des"] = des
            if des.get("ci95") is not None and None not in des["ci95"]:
                lo, hi = des["ci95"]
                row["des"]["analytical_inside_ci95"] = bool(lo <= row[metric] <= hi)
    out = {
        "scenario": res["scenario"],
        "metric": metric,
        "direction": res["direction"],
        "points": res["points"],
        "evaluated": res["evaluated"],
        "skipped": len(res["skipped"]),
        "best": rows[0],
        "top": rows,
        "confirm": args.confirm,
    }
    if args.confirm == "des":  # every top row re-run: the DES's own ranking of them
        des_best = (
            max(range(len(rows)), key=lambda i: rows[i]["des"]["value"])
            if (res["direction"] == "max")
            else min(range(len(rows)), key=lambda i: rows[i]["des"]["value"])
        )
        out["des_best_rank"] = des_best + 1
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"{res['scenario']}: {res['evaluated']} of {res['points']} points evaluated"
        f" (analytical), best {metric} ({res['direction']}):"
    )
    for i, row in enumerate(rows, 1):
        cfg = ", ".join(f"{k}={v}" for k, v in row["config"].items())
        line = f"{i:>3}. {cfg}: {metric} {row[metric]:.4g}, tau {row['tau']:.3f}"
        if "des" in row:
            d = row["des"]
            ci = d.get("ci95")
            line += f" | DES {d['value']:.4g}" + (f" [{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "")
        print(line)
    if res["skipped"]:
        print(
            f"skipped {len(res['skipped'])} infeasible points, e.g. {res['skipped'][0]['error']}",
            file=sys.stderr,
        )
    return 0


# ----------------------------------------------------------------------------- registration
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trees", help="draft trees: optimal trees for a positional acceptance")
    tsub = p.add_subparsers(dest="trees_command", required=True)
    t = tsub.add_parser(
        "best",
        help="the best tree of N nodes for P_1, P_2, ... (rank-r acceptance given ranks < r"
        " rejected)",
        description="Sequoia's dynamic programme over a depth-independent positional acceptance"
        " vector. --json prints {expected_tokens (root counted), nodes, depth, branching}; "
        "branching lists the children of every node in breadth-first order, root first,"
        " siblings by rank, which rebuilds the tree.",
    )
    t.add_argument("--acceptance", metavar="P1,P2,...")
    t.add_argument("--budget-nodes", metavar="N")
    t.add_argument("--max-depth", metavar="D")
    t.add_argument("--kind", default="sequoia", metavar="sequoia|dynamic")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_trees_best)

    p = sub.add_parser("drafters", help="the drafter presets (drafter: {preset: NAME})")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_drafters)

    p = sub.add_parser(
        "optimize",
        help="best configuration over a grid of fields (analytical), optionally confirmed by"
        " the DES",
    )
    p.add_argument("scenario")
    p.add_argument("--over", action="append", default=[], metavar="FIELD=a..b|v1,v2,...")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--metric", default="tokens_per_s")
    p.add_argument("--direction", default=None, metavar="max|min")
    p.add_argument("--top", default="3", metavar="T")
    p.add_argument(
        "--confirm",
        default="auto",
        metavar="auto|des|none",
        help="auto (default): re-run with the DES every top configuration whose analytical"
        " result is not validated; des: all of them; none: never",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_optimize)
