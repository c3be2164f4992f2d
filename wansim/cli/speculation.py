"""CLI commands for speculation policies: ``wansim trees best``, ``wansim drafters`` and
``wansim optimize`` (the study itself: :mod:`wansim.studies.optimize`).

Bad input exits 2 with one line ``flag: problem, got value`` (flags are validated here, not by
argparse, so that a bad value never prints a usage block).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from wansim.errors import WansimInputError
from wansim.results import strict_json


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
        print(strict_json.dumps(out))
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
    from wansim.speculation.drafters import catalog_rows

    rows = catalog_rows()
    if args.json:
        print(strict_json.dumps(rows))
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
def cmd_optimize(args: argparse.Namespace) -> int:
    from wansim.studies.constraints import parse_bound
    from wansim.studies.optimize import (
        confirm_des,
        edge_fields,
        extrapolated,
        optimize,
        parse_over,
        scalar,
        trust,
    )

    if not args.over:
        raise WansimInputError("--over", "give at least one FIELD=a..b or FIELD=v1,v2", None)
    overs = [parse_over(o) for o in args.over]
    top = _int_flag("--top", args.top, 1)
    if args.confirm not in ("auto", "des", "none"):
        raise WansimInputError("--confirm", "must be auto, des or none", args.confirm)
    if args.direction not in (None, "max", "min"):
        raise WansimInputError("--direction", "must be max or min", args.direction)
    bounds = [parse_bound("--constraint", text) for text in args.constraint]
    res = optimize(
        args.scenario,
        overs,
        sets=args.set,
        metric=args.metric,
        direction=args.direction,
        constraints=bounds,
    )
    table = res["table"]
    fields = res["fields"]
    metric = res["metric"]
    head = table.head(top)
    configs = [{f: scalar(row[f]) for f in fields} for _, row in head.iterrows()]
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
    flags = []
    if edge := edge_fields(overs, rows[0]["config"]):
        flags.append(f"at the edge of the grid in {', '.join(edge)}: the optimum may lie beyond it")
    if why := extrapolated(args.scenario, args.set, rows[0]["config"]):
        flags.append(f"rests on extrapolated acceptance: {why}")
    if "target_exact" in head and not bool(head.iloc[0]["target_exact"]):
        flags.append(
            "the best point is not target-exact (activations below 16 bits or typical"
            " acceptance): its output is not the trained target's"
        )
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
            if des.get("ci95") is not None:  # a null side is unbounded
                lo, hi = des["ci95"]
                inside = (lo is None or lo <= row[metric]) and (hi is None or row[metric] <= hi)
                row["des"]["analytical_inside_ci95"] = bool(inside)
    out = {
        "scenario": res["scenario"],
        "metric": metric,
        "direction": res["direction"],
        "points": res["points"],
        "evaluated": res["evaluated"],
        "skipped": len(res["skipped"]),
        "skipped_example": res["skipped"][0]["error"] if res["skipped"] else None,
        "constraints": [str(b) for b in bounds],
        "constrained_out": res["constrained_out"],
        "flags": flags,
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
        print(strict_json.dumps(out))
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
            side = ["-inf" if ci[0] is None else f"{ci[0]:.4g}", "inf"] if ci else []
            if ci and ci[1] is not None:
                side[1] = f"{ci[1]:.4g}"
            line += f" | DES {d['value']:.4g}" + (f" [{side[0]}, {side[1]}]" if ci else "")
        print(line)
    for flag in flags:
        print(f"warning: the optimum is {flag}", file=sys.stderr)
    if res["constrained_out"]:
        print(
            f"{res['constrained_out']} points break {', '.join(out['constraints'])}",
            file=sys.stderr,
        )
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
    p.add_argument(
        "--metric",
        default="tokens_per_s",
        help="any reported scalar metric, tails included (tpot_ms_p99, ttft_ms_p99, ...)",
    )
    p.add_argument(
        "--constraint",
        action="append",
        default=[],
        metavar="METRIC<=VALUE",
        help="keep only points meeting it (<= or >=; repeatable)",
    )
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
