"""``wansim plan``, ``wansim models``, ``wansim hardware`` (registered by wansim.cli)."""

from __future__ import annotations

import argparse
import json
import math

from wansim.results.result import jsonable


def strict_json(obj):
    """Plain JSON values; non-finite floats become null (strict JSON)."""
    obj = jsonable(obj)
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [strict_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def cmd_models(args: argparse.Namespace) -> int:
    from wansim.catalog.models import MODELS

    rows = [m.summary() for m in MODELS.values()]
    if args.json:
        print(json.dumps(allow_nan=False, obj=strict_json({"models": rows})))
        return 0
    print(
        f"{'name':<18} {'params_b':>9} {'active_b':>9} {'layers':>6} {'hidden':>6} {'kv_B/tok':>9}"
    )
    for r in rows:
        print(
            f"{r['name']:<18} {r['params_b']:>9.2f} {r['active_params_b']:>9.2f} {r['layers']:>6}"
            f" {r['hidden_size']:>6} {r['kv_bytes_per_token']:>9.0f}  {r['source']['config'][:60]}..."
        )
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from wansim.catalog.hardware import HARDWARE

    rows = [h.summary() for h in HARDWARE.values()]
    if args.json:
        print(json.dumps(allow_nan=False, obj=strict_json({"hardware": rows})))
        return 0
    print(f"{'name':<14} {'memory_gb':>9} {'GB/s':>6} {'bf16_TF':>8} {'$/h':>5}  source")
    for r in rows:
        print(
            f"{r['name']:<14} {r['memory_gb']:>9g} {r['mem_bandwidth_gbs']:>6g}"
            f" {r['tflops']['bf16']:>8g} {r['usd_per_hour']:>5.2f}  {r['source']['spec'][:60]}"
        )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from wansim.deploy.plan import load_deployment, plan

    dep = load_deployment(args.deployment, args.set)
    result = plan(dep, des=not args.no_des)
    if args.json:
        print(json.dumps(allow_nan=False, obj=strict_json(result)))
        return 0
    ring = result["ring"]
    print(
        f"{result['deployment']}: {result['model']} on {len(ring['order'])} nodes, "
        f"${result['usd_per_hour']:.2f}/h; largest batch {result['largest_batch']},"
        f" admitted {result['admitted_concurrency']} of {result['requested_concurrency']}"
    )
    print(f"ring ({ring['method']}): {' -> '.join(ring['order'])}; lap {ring['lap_ms']:.1f} ms")
    for label, key, gain in (
        ("given order", "lap_ms_given_order", "gain_over_given"),
        ("worst order", "lap_ms_worst_order", "gain_over_worst"),
    ):
        if ring[key] is not None:
            print(
                f"  {label}: {ring[key]:.1f} ms (the chosen ring is {100 * ring[gain]:.1f}% faster)"
            )
    print(f"  coordinator on {ring['coordinator_node']}, drafter on {ring['drafter_node']}")
    for i, p in enumerate(result["plans"], 1):
        what = f"tree {p['tree_budget_nodes']}" if p["policy"] == "tree" else f"k={p['k']}"
        print(
            f"#{i} {what} bits={p['activation_bits']} batching={p['batching']}:"
            f" {p['tokens_per_s']:.1f} tok/s, TPOT p50 {p['tpot_ms_p50']:.1f} /"
            f" p99 {p['tpot_ms_p99']:.1f} ms, throughput {p['throughput_tokens_per_s']:.1f} tok/s,"
            f" ${p['usd_per_m_tokens']}/M tok, egress {p['egress_gb_per_m_tokens']:.2f} GB/M tok"
            f" ({p['engine']})"
        )
    print("stages (best plan):")
    for s in result["plans"][0]["stages"]:
        print(
            f"  {s['node']:<12} {s['hardware']:<12} layers {s['layers'][0]:>2}-{s['layers'][1]:<2}"
            f" {s['pass_ms']:7.2f} ms/pass  {s['memory_gb']:7.1f} GB"
            f" (headroom {s['memory_headroom_gb']:.1f} GB)"
        )
    for f in result["flags"]:
        print(f"flag: {f}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("models", help="the model catalog (with sources)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("hardware", help="the GPU catalog (with sources and prices)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_hardware)
    p = sub.add_parser("plan", help="best plans for a deployment (nodes + model preset)")
    p.add_argument("deployment")
    p.add_argument("--json", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument(
        "--no-des", action="store_true", help="rank and report with the analytical engine only"
    )
    p.set_defaults(func=cmd_plan)
