"""Command line of the real path: ``python -m wansim.real COMMAND ...``.

    run            one staged run (writes trace, profile, compute table, links, summary)
    link-accuracy  the link emulator's achieved-minus-scheduled delay (p50/p99)
    acceptance     tiny-pair acceptance vs drafter weight noise, or of the MTP head (--mtp DIR)
    wire-bits      activation bits on the wire vs accepted length and output
    wire-quality   compressed activations vs the fp32 target: KL, token agreement, acceptance
    speed          real tokens/s over stages x latency x K

Bad input prints one line ``field: problem, got value`` and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from wansim.data import models_dir
from wansim.real.errors import PipelineError, RealConfigError

TARGET = str(models_dir("tiny-target") or Path("models") / "tiny-target")
DRAFTER = str(models_dir("tiny-drafter") or Path("models") / "tiny-drafter")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--target", default=TARGET, help="local checkpoint dir of the target")
    ap.add_argument("--drafter", default=DRAFTER, help="local checkpoint dir of the drafter")
    ap.add_argument("--workload", default="code", choices=("code", "prose"))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--out", default=None, help="output directory")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wansim.real", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one staged run")
    _common(r)
    r.add_argument("--stages", type=int, default=2)
    r.add_argument("--latency-ms", type=float, default=0.0)
    r.add_argument("--jitter-kind", default="none")
    r.add_argument("--jitter-std-ms", type=float, default=0.0)
    r.add_argument("--bandwidth-mbps", type=float, default=None)
    r.add_argument("--bits", type=int, default=32)
    r.add_argument("--verifier", default="greedy")
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--drafter-noise", type=float, default=0.0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--mtp", default=None, help="draft with this MTP head at the last stage")
    r.add_argument(
        "--tree",
        default=None,
        help="draft a tree per pass: static:2,2,1 | sequoia:BUDGET:DEPTH:P1,P2,.. | "
        "dynamic:BUDGET:DEPTH[:WIDTH] (budget: draft nodes, root excluded; replaces --k)",
    )
    r.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (stages share the GPU)")
    r.add_argument("--schedule", default="sync", help="sync | async (in-pipe speculation)")
    r.add_argument("--max-inflight-blocks", type=int, default=None, help="async window B")
    r.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    r.add_argument(
        "--batching",
        default="none",
        help="none | continuous (the requests in flight share passes: one forward per stage)",
    )
    r.add_argument("--micro-batches", type=int, default=1, help="batches in flight (continuous)")
    r.add_argument("--max-batch-size", type=int, default=None, help="requests per micro-batch")
    r.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=65536,
        help="KV positions one stage may hold over the requests in flight (the memory limit)",
    )
    la = sub.add_parser("link-accuracy", help="measure the link emulator")
    la.add_argument("--latency-ms", type=_floats, default=[0.0, 20.0])
    la.add_argument("--frames", type=int, default=1000)
    la.add_argument("--frame-bytes", type=int, default=64)
    a = sub.add_parser("acceptance", help="acceptance vs drafter noise (in process)")
    _common(a)
    a.add_argument("--noise", type=_floats, default=[0.0, 0.05, 0.1, 0.2, 0.4])
    a.add_argument("--mtp", default=None, help="measure this MTP head instead of the drafter")
    w = sub.add_parser("wire-bits", help="activation bits vs acceptance and output")
    _common(w)
    w.add_argument("--bits", type=_ints, default=[32, 16, 8, 4, 3])
    q = sub.add_parser(
        "wire-quality", help="compressed activations vs the fp32 target: KL, agreement, acceptance"
    )
    _common(q)
    q.add_argument("--bits", type=_ints, default=[32, 16, 8, 4, 3])
    q.add_argument("--stages", type=int, default=2)
    s = sub.add_parser("speed", help="tokens/s over stages x latency x K")
    _common(s)
    s.add_argument("--stages", type=_ints, default=[2, 4])
    s.add_argument("--latency-ms", type=_floats, default=[5.0, 20.0])
    s.add_argument("--ks", type=_ints, default=[0, 4])
    s.add_argument("--mtp", default=None, help="draft with this MTP head at the last stage")
    c = sub.add_parser(
        "corun", help="a stage's pass alone and beside another pipeline's stages (host cores)"
    )
    _common(c)
    c.add_argument("--rounds", type=int, default=2)
    c.add_argument("--latency-ms", type=float, default=0.0, help="both pipelines' links")
    args = ap.parse_args(argv)
    try:
        result = _dispatch(args)
    except RealConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except PipelineError as e:
        print(f"run failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1, default=str))
    if args.__dict__.get("out"):
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"{args.cmd}.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


def _dispatch(args):
    from wansim.real.link import LinkSpec
    from wansim.real.link_accuracy import measure_link_accuracy

    if args.cmd == "link-accuracy":
        return [
            measure_link_accuracy(LinkSpec(latency_ms=lat), args.frames, args.frame_bytes).as_dict()
            for lat in args.latency_ms
        ]
    from wansim.real.prompts import builtin_prompts

    prompts = builtin_prompts(args.workload, args.prompts, args.prompt_tokens)
    if args.cmd == "run":
        from wansim.real.config import DecodeSpec, PipelineSpec, TreeSpec
        from wansim.real.runner import run_real

        tree = TreeSpec.parse(args.tree) if args.tree else None

        link = LinkSpec(
            latency_ms=args.latency_ms,
            jitter_kind=args.jitter_kind,
            jitter_std_ms=args.jitter_std_ms,
            bandwidth_mbps=args.bandwidth_mbps,
        )
        spec = PipelineSpec(
            target_dir=args.target,
            drafter_dir=args.drafter if (args.k or tree) and not args.mtp else None,
            drafter_kind="mtp" if args.mtp else "draft_model",
            mtp_dir=args.mtp,
            stages=args.stages,
            links=(link,),
            activation_bits=args.bits,
            drafter_noise=args.drafter_noise,
            host=args.host,
            device=args.device,
            kv_capacity_tokens=args.kv_capacity_tokens,
        )
        decode = DecodeSpec(
            k=args.k,
            verifier=args.verifier,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            tree=tree,
            schedule=args.schedule,
            max_inflight_blocks=args.max_inflight_blocks
            or (args.stages if args.schedule == "async" else 1),
            concurrency=args.concurrency,
            batching=args.batching,
            micro_batches=args.micro_batches,
            max_batch_size=args.max_batch_size,
        )
        res = run_real(spec, prompts, decode, run_dir=args.out)
        return {
            "summary": res.summary,
            "paths": res.paths,
            "compute_table": res.compute_table.to_dict(orient="records"),
            "links": res.links.to_dict(orient="records"),
        }
    from wansim.real import experiments

    if args.cmd == "acceptance" and args.mtp:
        return experiments.acceptance_mtp(
            args.target, args.mtp, prompts, args.k, args.max_new_tokens
        )
    if args.cmd == "acceptance":
        return experiments.acceptance_by_noise(
            args.target, args.drafter, prompts, args.noise, args.k, args.max_new_tokens
        )
    if args.cmd == "wire-quality":
        from wansim.real.codec import check_bits
        from wansim.real.wire_quality import activation_quality

        for b in args.bits:
            check_bits(b, "--bits")
        return activation_quality(
            args.target,
            args.drafter,
            prompts,
            args.bits,
            stages=args.stages,
            k=args.k,
            max_new_tokens=args.max_new_tokens,
        )
    if args.cmd == "wire-bits":
        return experiments.wire_bits_effect(
            args.target,
            args.drafter,
            prompts,
            args.bits,
            args.k,
            args.max_new_tokens,
            run_dir=args.out,
        )
    if args.cmd == "corun":
        return experiments.corun_cost(
            args.target,
            args.drafter,
            prompts,
            args.k,
            args.max_new_tokens,
            rounds=args.rounds,
            run_dir=args.out,
            latency_ms=args.latency_ms,
        )
    return experiments.speed_matrix(
        args.target,
        args.drafter,
        prompts,
        args.stages,
        args.latency_ms,
        args.ks,
        args.max_new_tokens,
        run_dir=args.out,
        mtp_dir=args.mtp,
    )


if __name__ == "__main__":
    raise SystemExit(main())
