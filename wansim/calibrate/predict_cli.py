"""``wansim calibrate profile`` and ``wansim calibrate predict`` (sub-commands of calibrate).

    wansim calibrate profile --out DIR [--quick] [--target DIR] [--drafter DIR] [--mtp DIR|none]
    wansim calibrate predict --profile DIR [--matrix MATRIX.yaml] [--quick] [--json]
                             [--rounds 4] [--same-prompts] [--out DIR]
                             [--des-requests 1000] [--mtp DIR] [--reuse DIR]

Progress on stderr; ``predict`` prints the table (or with ``--json`` the strict JSON object of
``wansim.calibrate.report``) on stdout and writes ``OUT/predict.json``,
``OUT/predict_scatter.png`` and ``OUT/predict_errors_by_mechanism.png``. Bad input (bundle,
matrix, cells, checkpoints): one line, exit 2, before any process starts.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from wansim.errors import WansimInputError


def _say(msg: str) -> None:
    with contextlib.suppress(OSError):
        print(msg, file=sys.stderr, flush=True)


def _int(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise WansimInputError(flag, "must be an integer", text) from None


def _model_dirs(args) -> tuple[str, str]:
    from wansim.calibrate.run import tiny_model

    return args.target or tiny_model("tiny-target"), args.drafter or tiny_model("tiny-drafter")


def _mtp_dir(args) -> str:
    from wansim.calibrate.run import tiny_model

    return args.mtp or tiny_model("tiny-mtp")


def cmd_profile(args: argparse.Namespace) -> int:
    target, drafter = _model_dirs(args)
    for flag, d in (("--target", target), ("--drafter", drafter)):
        if not (Path(d) / "config.json").is_file():
            raise WansimInputError(
                flag, "must be a local checkpoint directory holding config.json", d
            )
    mtp = None if args.mtp == "none" else _mtp_dir(args)
    if mtp is not None:
        from wansim.real.config import check_mtp_dir

        check_mtp_dir(mtp, "--mtp")  # a one-line input error (no torch imported)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise WansimInputError("--out", "must be a directory (or a path to create)", args.out)
    from wansim.calibrate.profiling import run_profile
    from wansim.real.errors import PipelineError

    try:
        man = run_profile(
            out,
            quick=args.quick,
            target_dir=target,
            drafter_dir=drafter,
            mtp_dir=mtp,
            progress=None if args.quiet else _say,
        )
    except PipelineError as err:
        print(f"calibrate profile failed: {err}", file=sys.stderr)
        return 1
    sc = man["stage_cost"]
    per_token = " / ".join(f"{sc['per_token_ms'][r]:.3f}" for r in ("first", "middle", "last"))
    print(
        f"profile bundle {out}: stage fixed ms first {sc['fixed_ms']['first']:.2f} / middle "
        f"{sc['fixed_ms']['middle']:.2f} / last {sc['fixed_ms']['last']:.2f}, "
        f"{sc['per_layer_ms']:.2f} ms per layer, {per_token} ms per token ({sc['middle']} middle); "
        f"drafting {man['drafter']['intercept_ms']:.2f} + {man['drafter']['per_draft_ms']:.2f} K "
        f"ms; per message forward {man['message']['per_message_ms']['forward']:.2f} / return "
        f"{man['message']['per_message_ms']['return']:.2f} ms; acceptance fitted on K "
        f"{','.join(map(str, man['acceptance']['ks']))}"
    )
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from wansim.calibrate.predict import PredictSettings, prepare, run_predict
    from wansim.calibrate.report import dumps, format_table

    target, drafter = _model_dirs(args)
    s = PredictSettings(
        profile=args.profile,
        matrix=args.matrix,
        quick=args.quick,
        target_dir=target,
        drafter_dir=drafter,
        mtp_dir=_mtp_dir(args),
        out=args.out,
        rounds=_int("--rounds", args.rounds),
        des_requests=_int("--des-requests", args.des_requests),
        reuse=args.reuse,
        same_prompts=args.same_prompts,
    )
    prepare(s)  # every input check before any process starts (run_predict repeats it: cheap)
    from wansim.calibrate.predict import RUNS_FILE, PredictStopped

    try:
        result = run_predict(s, None if args.quiet else _say)
    except PredictStopped as err:  # a stage crash or Ctrl-C: the finished cells are kept
        if err.result["cells"]:
            print(dumps(err.result) if args.json else format_table(err.result), flush=True)
        if isinstance(err.__cause__, KeyboardInterrupt):
            print("interrupted", file=sys.stderr)
            return 130
        print(f"calibrate predict failed: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # while predicting: the real runs are on disk already
        kept = Path(s.out) / RUNS_FILE
        if not s.reuse and kept.is_file():
            print(
                f"interrupted; the finished real runs are kept in {kept}: predict them with "
                f"--reuse {s.out}",
                file=sys.stderr,
            )
        else:
            print("interrupted", file=sys.stderr)
        return 130
    print(dumps(result) if args.json else format_table(result))
    return 0


def register_actions(calibrate: argparse.ArgumentParser) -> None:
    sub = calibrate.add_subparsers(dest="action", metavar="{profile,predict}")
    p = sub.add_parser(
        "profile",
        help="measure once what the engines need (stage costs, drafting, per-message cost, "
        "acceptance across K) into a profile bundle",
    )
    p.add_argument("--out", required=True, help="bundle directory to write")
    p.add_argument("--quick", action="store_true", help="3 plans x 3 prompts x 32 tokens")
    p.add_argument("--target", default=None, help="target checkpoint dir (default tiny-target)")
    p.add_argument("--drafter", default=None, help="drafter checkpoint dir (default tiny-drafter)")
    p.add_argument(
        "--mtp", default=None, help="MTP head dir to profile too (default tiny-mtp; 'none': skip)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_profile)
    q = sub.add_parser(
        "predict",
        help="predict held-out real cells from their configuration + a profile bundle, run "
        "them, report real vs predicted with the real run-to-run spread",
    )
    q.add_argument("--profile", required=True, help="profile bundle dir (calibrate profile)")
    q.add_argument("--matrix", default=None, help="matrix YAML (default: the shipped heldout)")
    q.add_argument("--quick", action="store_true", help="the matrix's quick cells, fewer tokens")
    q.add_argument("--rounds", default="4", help="runs per real cell, interleaved (default 4)")
    q.add_argument(
        "--same-prompts",
        action="store_true",
        help="every round replays round 0's prompts (default: each round its own sample; "
        "replayed, the spread holds the timing's noise alone)",
    )
    q.add_argument("--des-requests", default="1000", help="requests per DES run (default 1000)")
    q.add_argument("--out", default="out/predict", help="output dir (default out/predict)")
    q.add_argument("--target", default=None, help="target checkpoint dir (default tiny-target)")
    q.add_argument("--drafter", default=None, help="drafter checkpoint dir (default tiny-drafter)")
    q.add_argument("--mtp", default=None, help="MTP head dir for drafter: mtp cells (tiny-mtp)")
    q.add_argument(
        "--reuse",
        default=None,
        help="a predict output dir: predict its recorded real runs again (no real run)",
    )
    q.add_argument("--json", action="store_true", help="print one strict JSON object")
    q.add_argument("--quiet", action="store_true", help="no progress on stderr")
    q.set_defaults(func=cmd_predict)
