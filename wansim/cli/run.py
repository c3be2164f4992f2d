"""``wansim run`` and ``wansim validate``: one scenario through the DES, the analytical engine
or both; tables, strict JSON and output files."""

from __future__ import annotations

import argparse

from wansim.errors import WansimInputError
from wansim.results import strict_json

ENGINES = ("des", "analytical", "both")


def _run_engine(engine: str, scenario, args):
    if engine == "analytical":
        from wansim.analytical import analyze

        return analyze(scenario)
    from wansim.sim import simulate

    return simulate(scenario, timeline=bool(args.perfetto))


def cmd_run(args: argparse.Namespace) -> int:
    from wansim.config.scenario import load_scenario
    from wansim.results.report import format_table, results_json, write_outputs

    scenario = load_scenario(args.scenario, args.set)
    engines = ["des", "analytical"] if args.engine == "both" else [args.engine]
    if args.perfetto and "des" not in engines:
        raise WansimInputError(
            "--perfetto", "needs the DES engine (--engine des or both)", args.engine
        )
    from wansim.results.output_paths import writable_dir, writable_file

    if args.out:
        writable_dir(args.out, "--out")
    if args.perfetto:
        writable_file(args.perfetto, "--perfetto")
    results = {e: _run_engine(e, scenario, args) for e in engines}
    if args.perfetto:
        from wansim.sim.perfetto import write_perfetto

        write_perfetto(results["des"], args.perfetto)
    if args.out:
        write_outputs(results, args.out)
    if args.json:
        print(strict_json.dumps(results_json(results)))
    else:
        print(format_table(results))
        if args.out:
            print(f"\nwrote {args.out}/")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from wansim.config.scenario import load_scenario

    scenario = load_scenario(args.scenario, args.set)
    print(
        f"{args.scenario}: ok ({scenario.name}, {scenario.stages} stages, policy {scenario.speculation.policy})"
    )
    return 0
