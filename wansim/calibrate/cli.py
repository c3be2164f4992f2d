"""``wansim calibrate`` command line (registered through ``wansim.cli.EXTRA_COMMANDS``).

    wansim calibrate [--in-sample] [--quick] [--stages 2,4] [--latency-ms 5,20] [--k 2,4]
                     [--prompts N] [--tokens N] [--verifier greedy|lossless]
                     [--drafter-kind draft_model|mtp] [--mtp DIR] [--out DIR] [--json]
    wansim calibrate profile --out DIR [--quick]
    wansim calibrate predict --profile DIR [--matrix MATRIX.yaml] [--quick] [--json]

Without a sub-command: the in-sample consistency check (each cell predicted from its own
measurements). ``profile`` / ``predict``: out of sample (``wansim.calibrate.predict``).

Progress goes to stderr; the table (or, with ``--json``, one JSON object
``{"cells": [...], "summary": {...}}``) to stdout. Ctrl-C keeps the finished cells (printed,
and in ``OUT/calibration.json``) and exits 130. Bad input: one line naming the flag, exit 2.
"""

from __future__ import annotations

import argparse
import sys

from wansim.errors import WansimInputError
from wansim.results import strict_json


def _list(flag: str, text: str, kind: type) -> tuple:
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise WansimInputError(flag, f"must be comma-separated {what}", text) from None
    if not values:
        raise WansimInputError(flag, "needs at least one value", text)
    return values


def _int(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise WansimInputError(flag, "must be an integer", text) from None


def _float(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise WansimInputError(flag, "must be a number", text) from None


def settings_from_args(args: argparse.Namespace):
    from wansim.calibrate.run import FULL, QUICK, Settings

    size = QUICK if args.quick else FULL
    verifier = args.verifier
    temperature = (
        _float("--temperature", args.temperature)
        if args.temperature is not None
        else (1.0 if verifier == "lossless" else 0.0)
    )
    kw = {
        "stages": _list("--stages", args.stages, int),
        "latencies_ms": _list("--latency-ms", args.latency_ms, float),
        "ks": _list("--k", args.k, int),
        "prompts": _int("--prompts", args.prompts) if args.prompts else size["prompts"],
        "tokens": _int("--tokens", args.tokens) if args.tokens else size["tokens"],
        "prompt_tokens": _int("--prompt-tokens", args.prompt_tokens),
        "verifier": verifier,
        "temperature": temperature,
        "bandwidth_mbps": _float("--bandwidth-mbps", args.bandwidth_mbps),
        "activation_bits": _int("--bits", args.bits),
        "des_requests": _int("--des-requests", args.des_requests or "2000"),
        "links": args.links or "measured",
        "out": args.out or "out/calibrate",
        "seed": _int("--seed", args.seed),
    }
    if args.target:
        kw["target_dir"] = args.target
    kind = args.drafter_kind or "draft_model"
    kw["drafter_kind"] = kind
    if args.drafter:
        if kind == "mtp":
            raise WansimInputError(
                "--drafter",
                "is the draft model's dir (--drafter-kind draft_model); the MTP head's is --mtp",
                args.drafter,
            )
        kw["drafter_dir"] = args.drafter
    if args.mtp:
        if kind != "mtp":
            raise WansimInputError(
                "--mtp",
                "is only used with --drafter-kind mtp (the head at the last stage)",
                args.mtp,
            )
        kw["mtp_dir"] = args.mtp
    return Settings(**kw)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from wansim.calibrate.run import check_settings, format_table, print_progress, run_calibration

    if not args.reuse:
        settings = settings_from_args(args)
        check_settings(settings)
    from wansim.calibrate.run import CellError, recalibrate
    from wansim.real.errors import PipelineError

    progress = None if args.quiet else print_progress
    if args.reuse:
        result = recalibrate(
            args.reuse,
            out=args.out,
            links=args.links,
            des_requests=_int("--des-requests", args.des_requests) if args.des_requests else None,
            progress=progress,
        )
        print(strict_json.dumps(result) if args.json else format_table(result))
        return 0
    try:
        result = run_calibration(settings, progress)
    except (KeyboardInterrupt, PipelineError, CellError) as err:
        result = getattr(err, "result", None)
        if result is not None and result["cells"]:
            print(strict_json.dumps(result) if args.json else format_table(result), flush=True)
        if isinstance(err, KeyboardInterrupt):
            print("interrupted", file=sys.stderr)
            return 130
        print(f"calibrate failed: {err}", file=sys.stderr)
        return 1
    print(strict_json.dumps(result) if args.json else format_table(result))
    return 0


def register(sub) -> None:
    from wansim.calibrate.predict_cli import register_actions

    p = sub.add_parser(
        "calibrate",
        help="real staged runs vs the DES and the analytical engine (tokens/s, lap p50/p99)",
        description="Run a matrix of real pipeline runs (the tiny pair by default) through "
        "emulated WAN links, predict each cell with both engines from its own measurements "
        "(per-stage compute tables, fitted acceptance profile, measured hop delays) and report "
        "real vs predicted with the relative errors.",
    )
    p.add_argument(
        "--in-sample",
        action="store_true",
        help="the in-sample consistency check (the default without a sub-command): each cell "
        "predicted from its own measurements",
    )
    p.add_argument("--quick", action="store_true", help="8 prompts x 64 tokens (default 16 x 128)")
    p.add_argument("--stages", default="2,4", help="pipeline depths (default 2,4)")
    p.add_argument(
        "--latency-ms", default="5,20", help="one-way latency per hop, ms (default 5,20)"
    )
    p.add_argument("--k", default="2,4", help="drafts per verify pass (default 2,4; 0 = none)")
    p.add_argument("--prompts", default=None, help="prompts per cell")
    p.add_argument("--tokens", default=None, help="new tokens per prompt")
    p.add_argument("--prompt-tokens", default="64", help="prompt length in tokens (default 64)")
    p.add_argument("--verifier", default="greedy", help="greedy | lossless (default greedy)")
    p.add_argument("--temperature", default=None, help="sampling temperature (lossless; default 1)")
    p.add_argument("--bandwidth-mbps", default="1000", help="link bandwidth, Mbit/s (default 1000)")
    p.add_argument("--bits", default="32", help="activation bits on the wire (default 32)")
    p.add_argument(
        "--links",
        default=None,
        help="measured (default): hops resample their measured delays; configured: latency only",
    )
    p.add_argument("--des-requests", default=None, help="requests per DES run (default 2000)")
    p.add_argument("--target", default=None, help="target checkpoint dir (default tiny-target)")
    p.add_argument(
        "--drafter-kind",
        default=None,
        help="draft_model (default): the draft model drafts at stage 0 (placement first_stage); "
        "mtp: the MTP head drafts at the last stage and its drafts ride the verdict back "
        "(placement last_stage)",
    )
    p.add_argument("--drafter", default=None, help="drafter checkpoint dir (default tiny-drafter)")
    p.add_argument(
        "--mtp", default=None, help="MTP head dir (--drafter-kind mtp; default tiny-mtp)"
    )
    p.add_argument("--seed", default="0")
    p.add_argument("--out", default=None, help="output dir (default out/calibrate)")
    p.add_argument(
        "--reuse",
        metavar="DIR",
        default=None,
        help="predict a finished calibration's recorded cells again (no real runs; writes to "
        "--out, default DIR itself)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_calibrate)
    register_actions(p)
