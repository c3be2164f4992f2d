"""``wansim`` command line. Bad input exits 2 with one line naming the field; never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from wansim import strict_json
from wansim.errors import WansimInputError

ENGINES = ("des", "analytical", "both")


def _run_engine(engine: str, scenario, args):
    if engine == "analytical":
        from wansim.analytical import analyze

        return analyze(scenario)
    from wansim.sim import simulate

    return simulate(scenario, timeline=bool(args.perfetto))


def cmd_run(args: argparse.Namespace) -> int:
    from wansim.report import format_table, results_json, write_outputs
    from wansim.scenario import load_scenario

    scenario = load_scenario(args.scenario, args.set)
    engines = ["des", "analytical"] if args.engine == "both" else [args.engine]
    if args.perfetto and "des" not in engines:
        raise WansimInputError(
            "--perfetto", "needs the DES engine (--engine des or both)", args.engine
        )
    from wansim.output_paths import writable_dir, writable_file

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
    from wansim.scenario import load_scenario

    scenario = load_scenario(args.scenario, args.set)
    print(
        f"{args.scenario}: ok ({scenario.name}, {scenario.stages} stages, policy {scenario.speculation.policy})"
    )
    return 0


def cmd_traces_show(args: argparse.Namespace) -> int:
    import numpy as np

    from wansim.acceptance.closed_form import implied_tau
    from wansim.acceptance.profile import load_profile

    prof = load_profile(args.profile)
    h = prof.header
    print(
        f"{args.profile}: {h.drafter} on {h.target}, K={h.k}, T={h.temperature:g}, {h.verifier}, source: {h.source}"
    )
    names = list(prof.workloads)
    kmax = max(len(w.per_position) for w in prof.workloads.values())
    print("tau(K) (implied at shorter blocks)")
    print("K    " + "".join(f"{n:>10}" for n in names))
    for k in range(1, kmax + 1):
        cells = []
        for n in names:
            p = np.asarray(prof.workloads[n].per_position)
            cells.append(f"{implied_tau(p)[k - 1]:>10.3f}" if k <= len(p) else f"{'-':>10}")
        print(f"{k:<5}" + "".join(cells))
    print("dispersion " + "".join(f"{prof.workloads[n].dispersion:>10.2f}" for n in names))
    return 0


def cmd_traces_fit(args: argparse.Namespace) -> int:
    from wansim.acceptance.profile import write_profile
    from wansim.acceptance.trace import fit_profile, read_trace

    frame, meta = read_trace(args.trace)
    # the rule the trace was measured under (the real path's traces say so in their metadata)
    verifier = meta.get("verifier", "lossless")
    if verifier not in ("lossless", "greedy", "typical"):
        raise WansimInputError(
            f"{args.trace}: verifier", "must be lossless | greedy | typical", verifier
        )
    try:
        temperature = float(meta.get("temperature", 1.0))
    except ValueError:
        raise WansimInputError(
            f"{args.trace}: temperature", "must be a number", meta["temperature"]
        ) from None
    profile = fit_profile(
        frame,
        drafter=meta.get("drafter", "unknown"),
        target=meta.get("target", "unknown"),
        temperature=temperature,
        verifier=verifier,
        provenance=f"fitted from the trace {args.trace}",
        source="measured",
    )
    write_profile(
        profile, args.out, f"Fitted by `wansim traces fit` from {args.trace} ({len(frame)} steps)."
    )
    _print_profile_summary(profile, args.out)
    return 0


def cmd_traces_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from wansim.acceptance import importers
    from wansim.acceptance.profile import write_profile

    if args.source == "vllm":
        path = Path(args.file)
        if not path.is_file():
            raise WansimInputError("FILE", "file not found", args.file)
        profile = importers.profile_from_vllm(
            path.read_text(), workload=args.workload, model=args.model, where=args.file
        )
    else:
        if args.k is None:
            raise WansimInputError(
                "--k", "required for sglang (the run's --speculative-num-steps)", None
            )
        profile = importers.profile_from_sglang(args.file, args.k, workload=args.workload)
    write_profile(
        profile, args.out, f"Imported by `wansim traces import {args.source}` from {args.file}."
    )
    _print_profile_summary(profile, args.out)
    return 0


def _print_profile_summary(profile, out) -> None:
    for name, wl in profile.workloads.items():
        print(
            f"{out}: {name}: K={len(wl.per_position)} tau={wl.tau:.3f} dispersion={wl.dispersion:.2f}"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wansim",
        description="Speculative decoding over WAN pipeline-parallel inference: simulate, analyse, calibrate.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a scenario with the DES, the analytical engine or both")
    p.add_argument("scenario")
    p.add_argument("--engine", choices=ENGINES, default="analytical")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="DIR", help="write metrics.json, table.txt and plots here")
    p.add_argument(
        "--perfetto", metavar="FILE", help="write a Chrome/Perfetto trace of the DES run"
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="check a scenario file")
    p.add_argument("scenario")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("traces", help="acceptance profiles and traces")
    tsub = p.add_subparsers(dest="traces_command", required=True)
    t = tsub.add_parser("show", help="tau(K) per workload of a profile")
    t.add_argument("profile")
    t.set_defaults(func=cmd_traces_show)
    t = tsub.add_parser("fit", help="fit a profile from a per-step trace (CSV)")
    t.add_argument("trace")
    t.add_argument("--out", required=True, metavar="PROFILE.yaml")
    t.set_defaults(func=cmd_traces_fit)
    t = tsub.add_parser("import", help="profile from a serving engine's spec-decode metrics")
    t.add_argument(
        "source",
        choices=("vllm", "sglang"),
        help="vllm: saved /metrics text; sglang: JSON lines of accept_lengths",
    )
    t.add_argument("file")
    t.add_argument("--out", required=True, metavar="PROFILE.yaml")
    t.add_argument("--k", type=int, help="draft depth (sglang)")
    t.add_argument("--workload", default="default")
    t.add_argument("--model", help="vllm: keep one model_name")
    t.set_defaults(func=cmd_traces_import)

    for register in EXTRA_COMMANDS:
        register(sub)
    return parser


# Later modules add subcommands here: each is a function (subparsers) -> None.
EXTRA_COMMANDS: list[Callable] = []


def _speculation_commands(sub) -> None:
    """``trees``, ``drafters``, ``optimize`` (wansim.speculation_cli; imported when parsing)."""
    from wansim.speculation_cli import register

    register(sub)


EXTRA_COMMANDS.append(_speculation_commands)


def _register_sweep(sub) -> None:
    from wansim.sweep.cli import register

    register(sub)


EXTRA_COMMANDS.append(_register_sweep)


def cmd_figures(args: argparse.Namespace) -> int:
    from wansim.report import figure_caption, figure_scripts, run_figures

    if args.list:
        for name, script in figure_scripts().items():
            print(f"{name}: {figure_caption(script).splitlines()[0]}")
        return 0
    failed = 0
    for name, ok, seconds, tail in run_figures(args.names, out=args.out, fast=args.fast):
        print(f"{name}: {'ok' if ok else 'FAILED'} ({seconds:.1f} s)")
        if not ok:
            failed += 1
            print("  " + tail.replace("\n", "\n  "), file=sys.stderr)
    return 1 if failed else 0


def _register_figures(sub) -> None:
    p = sub.add_parser("figures", help="regenerate paper_figures/ (PNG + PDF)")
    p.add_argument("names", nargs="*", help="figures to make (default: all; see --list)")
    p.add_argument("--out", metavar="DIR", help="output folder (default paper_figures/out)")
    p.add_argument("--fast", action="store_true", help="coarse grids, short DES runs")
    p.add_argument("--list", action="store_true", help="list the figures and their questions")
    p.set_defaults(func=cmd_figures)


EXTRA_COMMANDS.append(_register_figures)


def _register_calibrate(sub) -> None:
    """``calibrate`` (wansim.calibrate.cli; torch is imported only when real runs start)."""
    from wansim.calibrate.cli import register

    register(sub)


EXTRA_COMMANDS.append(_register_calibrate)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except WansimInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as err:  # an output that became unwritable mid-run (checked before it)
        if err.filename is None:
            raise
        why = (err.strerror or type(err).__name__).lower()
        print(f"error: {err.filename}: {why}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
