"""``wansim`` command line: the parser and ``main`` (bad input exits 2 with one line naming the
field; never a traceback). One module per command group: :mod:`wansim.cli.run` (run,
validate), :mod:`wansim.cli.traces`, :mod:`wansim.cli.speculation` (trees, drafters, optimize),
:mod:`wansim.cli.figures`; sweeps and calibration keep their commands beside their code
(:mod:`wansim.sweep.cli`, :mod:`wansim.calibrate.cli`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from wansim.cli.run import ENGINES, cmd_run, cmd_validate
from wansim.cli.traces import cmd_traces_fit, cmd_traces_import, cmd_traces_show
from wansim.errors import WansimInputError


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
    """``trees``, ``drafters``, ``optimize`` (wansim.cli.speculation)."""
    from wansim.cli.speculation import register

    register(sub)


EXTRA_COMMANDS.append(_speculation_commands)


def _register_sweep(sub) -> None:
    from wansim.sweep.cli import register

    register(sub)


EXTRA_COMMANDS.append(_register_sweep)


def _register_figures(sub) -> None:
    from wansim.cli.figures import register

    register(sub)


EXTRA_COMMANDS.append(_register_figures)


def _register_capacity(sub) -> None:
    """``capacity`` (wansim.cli.capacity)."""
    from wansim.cli.capacity import register

    register(sub)


EXTRA_COMMANDS.append(_register_capacity)


def _register_calibrate(sub) -> None:
    """``calibrate`` (wansim.calibrate.cli; torch is imported only when real runs start)."""
    from wansim.calibrate.cli import register

    register(sub)


EXTRA_COMMANDS.append(_register_calibrate)


def _register_deploy(sub) -> None:
    """``plan``, ``models``, ``hardware`` (wansim.deploy.cli)."""
    from wansim.deploy.cli import register

    register(sub)


EXTRA_COMMANDS.append(_register_deploy)


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
        print(f"error: {WansimInputError(str(err.filename), why)}", file=sys.stderr)  # (one line)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
