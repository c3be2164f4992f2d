"""``wansim capacity SCENARIO --slo METRIC<=VALUE [...] [--json]``: the highest load the
configuration sustains under the SLO (the search: :mod:`wansim.studies.capacity`)."""

from __future__ import annotations

import argparse

from wansim.errors import WansimInputError
from wansim.results import strict_json


def cmd_capacity(args: argparse.Namespace) -> int:
    from wansim.studies.capacity import capacity
    from wansim.studies.constraints import parse_bound

    if not args.slo:
        raise WansimInputError("--slo", "give at least one METRIC<=VALUE (e.g. tpot_ms_p99<=60)")
    bounds = [parse_bound("--slo", text) for text in args.slo]
    try:
        top = int(args.max_concurrency)
    except ValueError:
        raise WansimInputError(
            "--max-concurrency", "must be an integer", args.max_concurrency
        ) from None
    if not 1 <= top <= 65_536:
        raise WansimInputError("--max-concurrency", "must be in 1..65536", top)
    out = capacity(args.scenario, bounds, sets=args.set, engine=args.engine, max_concurrency=top)
    if args.json:
        print(strict_json.dumps(out))
        return 0
    key = "max_concurrency" if "max_concurrency" in out else "max_request_rate_per_s"
    found = out[key]
    print(f"{out['scenario']}: SLO {', '.join(out['slo'])}")
    print(f"search: {out['searched']}, {out['method']}, {len(out['evaluations'])} runs")
    if found is None:
        print(f"{key}: none ({out['reason']})")
        return 0
    print(
        f"{key}: {found:.4g}"
        + (f" (analytical: {out['analytical']})" if "analytical" in out else "")
    )
    if "at_search_limit" in out:
        print(f"note: {out['at_search_limit']}")
    at = out["at"]
    for b in out["slo"]:
        name = b.split("<")[0].split(">")[0]
        print(f"  {name} = {at[name]:.4g}")
    print(f"  throughput_tokens_per_s = {at['throughput_tokens_per_s']:.4g}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity",
        help="the highest concurrency (closed arrivals) or request rate (open) meeting an SLO",
    )
    p.add_argument("scenario")
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC<=VALUE",
        help="a bound on any reported metric (<= or >=), repeatable: tpot_ms_p99<=60",
    )
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument(
        "--engine",
        default="auto",
        metavar="auto|analytical|des",
        help="auto (default): analytical search confirmed by the DES where the analytical"
        " engine models the scenario, else the DES",
    )
    p.add_argument("--max-concurrency", default="1024", metavar="N")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_capacity)
