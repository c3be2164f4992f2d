"""``wansim calibrate profile``: dedicated short real runs, fitted once into a profile bundle.

What runs (pipelines of the target, the draft model at stage 0, every hop an emulated link of
``LATENCY_MS`` at 1000 Mbit/s, greedy, one request at a time): one pipeline per layer split x
activation bits in :data:`FULL_PLANS` (2 stages of 1+5, 3+3, 5+1 layers at fp32 and 3+3 at 8
bits, and 3 stages of 2+1+3 at fp32), all up at once, decoding the same prompts at every K of
``KS`` (2, 4, 7), one prompt at a time at every K on every pipeline (orders rotating), so that
load drift does not align with a split or a K; at every K the first fp32 pipeline also decodes a
static tree of 2K nodes, and with ``mtp_dir`` a 3+3 pipeline drafts with the MTP head at the
last stage; after every prompt the 1+5 and 5+1 fp32 pipelines decode one batched job (2, then 4
requests a pass: the cost of a batched pass per request beyond the first, :func:`fit_batch`).
The prompts are drawn with :data:`PROFILE_SEED`, not the held-out cells' seed, so no cell's
acceptance sample is in the bundle.

Fits (:mod:`wansim.calibrate.profile_fits`, pure functions tested on synthetic data; the
acceptance profiles: :mod:`wansim.calibrate.profile_acceptance`; the bundle's model in
:mod:`wansim.calibrate.bundle`): a stage's measured service time per pass (frame in -> frame
out, :func:`wansim.calibrate.measure.decompose`), less the codec cost measured directly (the
stages' own ``codec_ms``), is fitted by non-negative least squares on a fixed cost and a cost
per token for each role (first | middle | last), layers and layers x tokens per pass (chains K +
1, trees 2K + 1); the middle role from the 3-stage plan (a profile without one, ``--quick``,
derives it: the last stage without its verification plus stage 0's encode, both measured per
pass as ``verify_ms`` and ``codec_ms``, and the first stage's cost per token). Drafting: linear
in K and in the tree's extra nodes (``width_ms``); the MTP head's drafting linear in K, and its
pipeline's first/last fixed costs. Per-message cost: each hop's achieved - scheduled delay per
frame, by hop role. Wire quality: :func:`wansim.real.wire_quality.activation_quality` at every
profiled width. The acceptance profiles (chain, static tree, MTP head): fitted from the traces
of all profiled K pooled (per-position rates are the maximum-likelihood estimates across block
sizes, :mod:`wansim.acceptance.trace`), decoded in process
(:func:`wansim.real.speculative.speculative_decode`, the staged pipeline's algorithm, greedy
output equal to it; CI checks that) on more prompts than the timed runs: acceptance is a
property of the pair and the workload, not of the timing, and a few prompts' tau varies by
10-40% between prompt sets.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from wansim.calibrate.bundle import config_sha256, write_bundle
from wansim.calibrate.profile_acceptance import (
    acceptance_trace,
    fitted_profile_text,
    mtp_acceptance_trace,
    per_k_profile_text,
    quality_table,
    tree_acceptance_trace,
    tree_branching,
)
from wansim.calibrate.profile_fits import (
    batched_pass_rows,
    fit_batch,
    fit_drafter,
    fit_messages,
    fit_mtp_fixed,
    fit_stage_cost,
    hop_error_rows,
    stage_pass_rows,
)

PROFILE_SEED = 1000
LATENCY_MS = 5.0
BANDWIDTH_MBPS = 1000.0
KS = (2, 4, 7)
PROMPT_TOKENS = 64
# (layer split of the 6-layer target, activation bits); the 3-stage plan measures the middle
# role (a 1-layer relay stage, as in the 4- and 6-stage rings) instead of deriving it
FULL_PLANS = (
    (((0, 1), (1, 6)), 32),
    (((0, 3), (3, 6)), 32),
    (((0, 5), (5, 6)), 32),
    (((0, 3), (3, 6)), 8),
    (((0, 2), (2, 3), (3, 6)), 32),
)
QUICK_PLANS = (
    (((0, 1), (1, 6)), 32),
    (((0, 5), (5, 6)), 32),
    (((0, 3), (3, 6)), 8),
)
SIZES = {
    "full": {
        "prompts": 4,
        "tokens": 48,
        "acceptance_prompts": 128,
        "acceptance_tokens": 64,
        "tree_prompts": 64,
        "tree_tokens": 48,
        "quality_prompts": 8,
        "quality_tokens": 32,
    },
    "quick": {
        "prompts": 3,
        "tokens": 32,
        "acceptance_prompts": 16,
        "acceptance_tokens": 48,
        "tree_prompts": 8,
        "tree_tokens": 32,
        "quality_prompts": 4,
        "quality_tokens": 32,
    },
}
QUALITY_K = 4  # the drafts per pass at which the wire-quality acceptance ratios are measured
# batched jobs (several requests' blocks in one pass, DecodeSpec(batching="continuous")) on
# the 1+5 and 5+1 pipelines, a batch size per prompt in turn: the cost per sequence beyond the
# first (``batch`` in the bundle)
BATCH_BLOCKS = (2, 4)
BATCH_SPLITS = (((0, 1), (1, 6)), ((0, 5), (5, 6)))
REFERENCE_SPLIT = ((0, 3), (3, 6))  # the acceptance traces and the short re-profile


# ----------------------------------------------------------------------------- the real runs
def open_pipeline(
    target_dir: str,
    drafter_dir: str,
    splits,
    bits: int,
    run_dir: Path,
    latency_ms: float = LATENCY_MS,
    mtp_dir: str | None = None,
):
    """A started profiling pipeline, one stage per split (close it when done); with
    ``mtp_dir`` the MTP head drafts at the last stage instead of the draft model at stage 0."""
    from wansim.real.config import PipelineSpec
    from wansim.real.link import LinkSpec
    from wansim.real.runner import Pipeline

    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=None if mtp_dir else drafter_dir,
        drafter_kind="mtp" if mtp_dir else "draft_model",
        mtp_dir=mtp_dir,
        stages=len(splits),
        layer_splits=tuple(splits),
        links=(LinkSpec(latency_ms=latency_ms, bandwidth_mbps=BANDWIDTH_MBPS),),
        activation_bits=bits,
    )
    return Pipeline(spec, run_dir).start()


def measure_job(
    pipe, splits, bits: int, k: int, prompts, tokens: int, tree: bool = False, name: str = ""
) -> dict:
    """One job on a profiling pipeline: per-stage rows, hop errors, drafting times (a chain of
    K, or with ``tree`` the static tree of :func:`tree_branching`)."""
    from wansim.calibrate.measure import decompose
    from wansim.real.config import DecodeSpec, TreeSpec
    from wansim.real.recording import read_raw

    branching = tree_branching(k) if tree else ()
    spec = TreeSpec("static", branching=branching) if tree else None
    res = pipe.generate(
        prompts,
        DecodeSpec(k=k, max_new_tokens=tokens, tree=spec),
        name=f"{'tree' if tree else 'k'}{k}{name}",
    )
    raw = read_raw(pipe.run_dir / "raw", len(splits))
    passes = decompose(res.steps, raw, len(splits))
    job = int(res.steps["job"].iloc[0]) if "job" in res.steps.columns else None
    v = passes[passes["kind"] == "verify"]
    nodes = 2 * k if tree else k
    return {
        "stage": stage_pass_rows(passes, raw, splits, bits, job, nodes if tree else 0),
        "hops": hop_error_rows(passes, len(splits)).assign(bits=bits),
        "draft": pd.DataFrame({"k": v["k"], "nodes": nodes, "draft_ms": v["draft_ms"]}),
    }


def measure_batched_job(
    pipe, splits, bits: int, k: int, prompts, tokens: int, name: str = ""
) -> pd.DataFrame:
    """One batched job: every prompt of ``prompts`` in one batch (continuous batching), its
    passes as :func:`batched_pass_rows`."""
    from wansim.calibrate.measure import decompose
    from wansim.real.config import DecodeSpec
    from wansim.real.recording import read_raw

    spec = DecodeSpec(k=k, max_new_tokens=tokens, concurrency=len(prompts), batching="continuous")
    res = pipe.generate(prompts, spec, name=f"batch{len(prompts)}-k{k}{name}")
    raw = read_raw(pipe.run_dir / "raw", len(splits))
    return batched_pass_rows(decompose(res.steps, raw, len(splits)), splits, bits)


def run_idle_sweep(
    target_dir: str, drafter_dir: str, run_dir: Path, prompts, tokens: int, latencies_ms
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The reference pipeline at every latency of ``latencies_ms`` (all up at once, after an
    unmeasured warm-up job each), prompt by prompt with the latency order rotating: the
    per-pass rows of :func:`wansim.calibrate.idle_profile.idle_pass_rows` and the per-message
    rows of :func:`wansim.calibrate.idle_profile.idle_message_rows`."""
    from wansim.calibrate.idle_profile import K, idle_message_rows, idle_pass_rows
    from wansim.calibrate.measure import decompose
    from wansim.real.config import DecodeSpec
    from wansim.real.recording import read_raw

    pipes = []
    frames, messages = [], []
    try:
        for lat in latencies_ms:
            pipes.append(
                open_pipeline(
                    target_dir,
                    drafter_dir,
                    REFERENCE_SPLIT,
                    32,
                    run_dir / f"idle{lat:g}ms",
                    latency_ms=lat,
                )
            )
        for pipe in pipes:
            pipe.generate(prompts[:1], DecodeSpec(k=K, max_new_tokens=8), name="warmup")
        for c in range(len(prompts)):
            for x in range(len(pipes)):
                j = (c + x) % len(pipes)
                res = pipes[j].generate(
                    prompts[c : c + 1], DecodeSpec(k=K, max_new_tokens=tokens), name=f"idle-p{c}"
                )
                raw = read_raw(pipes[j].run_dir / "raw", 2)
                job = int(res.steps["job"].iloc[0])
                st1 = raw["stage1"]
                frames.append(
                    idle_pass_rows(res.steps, st1[st1["job"] == job], latencies_ms[j]).assign(
                        prompt_index=c
                    )
                )
                passes = decompose(res.steps, raw, 2)
                messages.append(idle_message_rows(passes, latencies_ms[j]).assign(prompt_index=c))
    finally:
        for pipe in pipes:
            pipe.close()
    return pd.concat(frames, ignore_index=True), pd.concat(messages, ignore_index=True)


def _concat(jobs: list[dict], load) -> dict:
    out = {key: pd.concat([j[key] for j in jobs], ignore_index=True) for key in jobs[0]}
    out["load"] = load
    return out


def run_plan(
    target_dir: str, drafter_dir: str, splits, bits: int, ks, prompts, tokens: int, run_dir: Path
) -> dict:
    """One 2-stage pipeline decoding ``prompts`` at every K (the short re-profile), after one
    unmeasured warm-up job (a fresh pipeline's first passes are slower)."""
    load0 = os.getloadavg()[0]
    pipe = open_pipeline(target_dir, drafter_dir, splits, bits, run_dir)
    try:
        measure_job(pipe, splits, bits, ks[0], prompts[:1], 8)
        jobs = [measure_job(pipe, splits, bits, k, prompts, tokens) for k in ks]
    finally:
        pipe.close()
    return _concat(jobs, (round(load0, 2), round(os.getloadavg()[0], 2)))


def run_profile(
    out: str | Path,
    *,
    quick: bool,
    target_dir: str,
    drafter_dir: str,
    mtp_dir: str | None = None,
    progress: Callable[[str], None] | None = None,
    plans=None,
    ks: tuple[int, ...] = KS,
    size: dict | None = None,
    idle_latencies_ms: tuple[float, ...] | None = None,
) -> dict:
    """Run the profile and write the bundle to ``out``; returns the manifest written.
    ``mtp_dir``: also profile that MTP head (a 2-stage pipeline, :data:`REFERENCE_SPLIT`,
    drafting at the last stage: its drafting time per K and its acceptance).
    ``plans``, ``ks``, ``size``, ``idle_latencies_ms``: smaller profiles for tests (default:
    :data:`FULL_PLANS` or :data:`QUICK_PLANS`, :data:`KS`, :data:`SIZES`, the latencies of
    :mod:`wansim.calibrate.idle_profile`; ``()``: no idle cost)."""
    from wansim.calibrate.idle_profile import (
        LATENCIES_MS,
        QUICK_LATENCIES_MS,
        fit_idle_cost,
        fit_message_idle_cost,
    )
    from wansim.real.prompts import builtin_prompts

    say = progress or (lambda _m: None)
    size = size or SIZES["quick" if quick else "full"]
    plans = plans or (QUICK_PLANS if quick else FULL_PLANS)
    ks = tuple(ks)
    out = Path(out)
    prompts = builtin_prompts("code", size["prompts"], PROMPT_TOKENS, seed=PROFILE_SEED)
    t0 = time.perf_counter()
    # every plan's pipeline stays up and the jobs alternate between them (prompt by prompt,
    # K and plan orders rotating): load drift hits every layer split, bit width and K alike,
    # so it does not masquerade as a cost per layer or per token
    say(
        f"profile: {len(plans)} pipelines (layers "
        + ", ".join("+".join(str(hi - lo) for lo, hi in s_) + f" {b}-bit" for s_, b in plans)
        + f"), K {','.join(map(str, ks))}, {size['prompts']} prompts x {size['tokens']} tokens "
        "(the first start imports torch)"
    )
    load0 = os.getloadavg()[0]
    pipes = []
    jobs: list[list[dict]] = [[] for _ in plans]
    tree_plan = next(j for j, (_, b) in enumerate(plans) if b == 32)
    batch_plans = [j for j, (s_, b) in enumerate(plans) if b == 32 and tuple(s_) in BATCH_SPLITS]
    batch_jobs: list[pd.DataFrame] = []
    mtp_draft: list[pd.DataFrame] = []
    mtp_stage: list[pd.DataFrame] = []
    try:
        for j, (splits, bits) in enumerate(plans):
            pipes.append(
                open_pipeline(target_dir, drafter_dir, splits, bits, out / "runs" / f"plan{j}")
            )
        if mtp_dir:
            mtp_pipe = open_pipeline(
                target_dir, drafter_dir, REFERENCE_SPLIT, 32, out / "runs" / "mtp", mtp_dir=mtp_dir
            )
            pipes.append(mtp_pipe)
            measure_job(mtp_pipe, REFERENCE_SPLIT, 32, ks[0], prompts[:1], 8)
        for j, (splits, bits) in enumerate(plans):  # unmeasured warm-up jobs
            measure_job(pipes[j], splits, bits, ks[0], prompts[:1], 8)
        # one prompt at a time, every K and every pipeline on it before the next prompt (the
        # K order and the pipeline order rotating): a load burst lasting a few seconds hits
        # every K, split, bit width, the tree and the head alike instead of lining up with one
        # K (a run that did all of K=7 last fitted 100+ ms passes for K=7 under a burst)
        for c in range(len(prompts)):
            chunk = prompts[c : c + 1]
            for i in range(len(ks)):
                k = ks[(c + i) % len(ks)]
                for j in [(c + i + x) % len(plans) for x in range(len(plans))]:
                    splits, bits = plans[j]
                    jobs[j].append(
                        measure_job(pipes[j], splits, bits, k, chunk, size["tokens"], name=f"-p{c}")
                    )
                # the tree width: the same K as a static tree of 2K nodes (first fp32 plan)
                splits, bits = plans[tree_plan]
                jobs[tree_plan].append(
                    measure_job(
                        pipes[tree_plan],
                        splits,
                        bits,
                        k,
                        chunk,
                        size["tokens"],
                        tree=True,
                        name=f"-p{c}",
                    )
                )
                if mtp_dir:  # the MTP head's drafting at this K (the last stage's draft_ms)
                    job = measure_job(
                        mtp_pipe, REFERENCE_SPLIT, 32, k, chunk, size["tokens"], name=f"-p{c}"
                    )
                    mtp_draft.append(job["draft"][["k", "draft_ms"]])
                    mtp_stage.append(job["stage"].assign(drafter_kind="mtp"))
            # a batched job on the 1+5 and 5+1 pipelines: 2 or 4 requests (in turn), a K in turn
            blocks = BATCH_BLOCKS[c % len(BATCH_BLOCKS)]
            batch = [prompts[(c + x) % len(prompts)] for x in range(blocks)]
            for j in batch_plans:
                splits, bits = plans[j]
                rows = measure_batched_job(
                    pipes[j], splits, bits, ks[c % len(ks)], batch, size["tokens"], f"-p{c}"
                )
                batch_jobs.append(rows.assign(job=len(batch_jobs)))
            say(
                f"  prompt {c + 1}/{len(prompts)} done at every K on every pipeline, + trees"
                f"{' + the MTP head' if mtp_dir else ''}"
                f"{f' + a batch of {blocks}' if batch_plans else ''}"
                f" ({time.perf_counter() - t0:.0f} s)"
            )
    finally:
        for pipe in pipes:
            pipe.close()
    if idle_latencies_ms is None:
        idle_latencies_ms = QUICK_LATENCIES_MS if quick else LATENCIES_MS
    idle_rows, idle_messages, idle_fit = None, None, None
    if idle_latencies_ms:
        say(
            "idle cost: the 3+3 pipeline at "
            + ", ".join(f"{x:g}" for x in idle_latencies_ms)
            + f" ms links, K=4, {len(prompts)} prompts x {size['tokens']} tokens"
        )
        idle_rows, idle_messages = run_idle_sweep(
            target_dir, drafter_dir, out / "runs", prompts, size["tokens"], idle_latencies_ms
        )
        idle_fit = fit_idle_cost(idle_rows, LATENCY_MS)
        idle_fit["message"] = fit_message_idle_cost(idle_messages, LATENCY_MS)
    load = (round(load0, 2), round(os.getloadavg()[0], 2))
    results = []
    for (splits, bits), js in zip(plans, jobs, strict=True):
        r = _concat(js, load)
        r["splits"], r["bits"] = splits, bits
        results.append(r)
    stage = pd.concat([r["stage"] for r in results], ignore_index=True)
    stage = stage.assign(drafter_kind="draft_model")
    hops = pd.concat([r["hops"] for r in results], ignore_index=True)
    draft = pd.concat([r["draft"] for r in results], ignore_index=True)
    say(
        f"acceptance: {size['acceptance_prompts']} prompts x {size['acceptance_tokens']} tokens "
        f"at K {','.join(map(str, ks))}, in process"
    )
    acc_prompts = builtin_prompts(
        "code", size["acceptance_prompts"], PROMPT_TOKENS, seed=PROFILE_SEED
    )
    trace = acceptance_trace(target_dir, drafter_dir, acc_prompts, ks, size["acceptance_tokens"])
    say(
        f"tree acceptance: {size['tree_prompts']} prompts x {size['tree_tokens']} tokens, "
        f"static trees of 2K nodes at K {','.join(map(str, ks))}, in process"
    )
    tree_trace = tree_acceptance_trace(
        target_dir, drafter_dir, acc_prompts[: size["tree_prompts"]], ks, size["tree_tokens"]
    )
    # the profiled widths, and 8 bits always (a table needs a width; in process, cheap)
    quant = sorted({8} | {int(b) for _, b in plans if int(b) != 32}, reverse=True)
    say(
        f"wire quality: {size['quality_prompts']} prompts x {size['quality_tokens']} tokens at "
        f"{', '.join(map(str, [32, *quant]))} bits, K={QUALITY_K}, in process"
    )
    from wansim.real.wire_quality import activation_quality

    quality_rows = activation_quality(
        target_dir,
        drafter_dir,
        acc_prompts[: size["quality_prompts"]],
        bits=(32, *quant),
        stages=2,
        k=QUALITY_K,
        max_new_tokens=size["quality_tokens"],
    )
    quality = quality_table(
        quality_rows,
        target=f"{Path(target_dir).name} with {Path(drafter_dir).name}, 2 stages",
        provenance=(
            f"wansim calibrate profile: wansim.real.wire_quality.activation_quality on "
            f"{size['quality_prompts']} prompts x {size['quality_tokens']} tokens, K = "
            f"{QUALITY_K}, against the fp32 target"
        ),
    )
    import yaml

    def profile_yaml(frame: pd.DataFrame, what: str) -> str:
        return fitted_profile_text(
            frame,
            Path(drafter_dir).name,
            Path(target_dir).name,
            f"wansim calibrate profile: {what}",
        )

    profile_text = profile_yaml(trace, "chain traces")
    mtp_files, mtp_trace = None, None
    if mtp_dir:
        say(
            f"MTP head acceptance: {size['tree_prompts']} prompts x {size['tree_tokens']} tokens "
            f"at K {','.join(map(str, ks))}, in process"
        )
        mtp_trace = mtp_acceptance_trace(
            target_dir, mtp_dir, acc_prompts[: size["tree_prompts"]], ks, size["tree_tokens"]
        )
        mtp_rows = pd.concat(mtp_draft, ignore_index=True)
        mtp_stage_rows = pd.concat(mtp_stage, ignore_index=True)
        mtp_files = (mtp_rows, profile_yaml(mtp_trace, "MTP-head traces"))
    tree_text = profile_yaml(tree_trace, "static-tree traces (2 candidates at depth 1)")
    import json

    tcfg = json.loads((Path(target_dir) / "config.json").read_text())
    loads = [x for r in results for x in r["load"]]
    manifest = {
        "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": {
            "target": Path(target_dir).name,
            "target_config_sha256": config_sha256(target_dir),
            "layers": int(tcfg["num_hidden_layers"]),
            "hidden_size": int(tcfg["hidden_size"]),
            "vocab_size": int(tcfg["vocab_size"]),
            "drafter": Path(drafter_dir).name,
            "drafter_kind": "draft_model",
            "drafter_config_sha256": config_sha256(drafter_dir),
        },
        "profiled": {
            "stages": max(len(s_) for s_, _ in plans),
            "plans": [
                {
                    "layer_split": [list(s) for s in r["splits"]],
                    "bits": r["bits"],
                    "load_avg_1min": list(r["load"]),
                }
                for r in results
            ],
            "ks": list(ks),
            "latency_ms": LATENCY_MS,
            "bandwidth_mbps": BANDWIDTH_MBPS,
            "prompts": size["prompts"],
            "tokens": size["tokens"],
            "prompt_tokens": PROMPT_TOKENS,
            "prompt_seed": PROFILE_SEED,
            "verifier": "greedy",
            "quick": bool(quick),
            "load_avg_1min": {"min": min(loads), "max": max(loads)},
            "seconds": round(time.perf_counter() - t0, 1),
            # the cores every stage process shares (the predictions' model.host_cores)
            "host_cores": len(os.sched_getaffinity(0)),
        },
        "stage_cost": fit_stage_cost(stage),  # the draft model's pipelines only
        "drafter": fit_drafter(draft),
        "message": fit_messages(hops),
        "acceptance": {
            "ks": list(ks),
            "max_k": max(ks),
            "steps": len(trace),
            "prompts": size["acceptance_prompts"],
            "tokens": size["acceptance_tokens"],
            "tau_by_k": {int(k): float((g["accepted"] + 1).mean()) for k, g in trace.groupby("k")},
        },
        "tree": {
            "shape": "static: 2 candidates at depth 1, then one child per node to depth K",
            "nodes_by_k": {int(k): 2 * int(k) for k in ks},
            "plan": [list(s_) for s_ in plans[tree_plan][0]],
            "steps": len(tree_trace),
            "prompts": size["tree_prompts"],
            "tokens": size["tree_tokens"],
            "tau_by_k": {
                int(k): float((g["accepted"] + 1).mean()) for k, g in tree_trace.groupby("k")
            },
        },
        "activation_quality": {
            "k": QUALITY_K,
            "prompts": size["quality_prompts"],
            "tokens": size["quality_tokens"],
            "bits": quality["bits"],
        },
        "dimensions": {
            "tokens_per_pass": sorted(int(n) for n in stage["n_tokens"].unique()),
            "drafter": "chain K drafts and static trees of 2K nodes (width_ms per extra node)",
            "concurrency": "not profiled: the engines queue the profiled per-pass and "
            "per-message costs of several requests (the real path keeps one KV cache per "
            "request and serves passes one at a time)",
            "batch": f"profiled: batched passes of {', '.join(map(str, BATCH_BLOCKS))} "
            "requests on the 1+5 and 5+1 pipelines (batch)"
            if batch_jobs
            else "not profiled (no 1+5 or 5+1 fp32 plan)",
            "mtp": "profiled: the MTP head's drafting per K and acceptance (mtp)"
            if mtp_dir
            else "not profiled (profile with --mtp)",
        },
    }
    if idle_fit is not None:
        manifest["idle_cost"] = idle_fit
    batch_rows = pd.concat(batch_jobs, ignore_index=True) if batch_jobs else None
    if batch_rows is not None:
        manifest["batch"] = fit_batch(batch_rows, manifest["stage_cost"], manifest["drafter"])
    if mtp_dir:
        import hashlib

        manifest["mtp"] = {
            "name": Path(mtp_dir).name,
            "mtp_config_sha256": hashlib.sha256(
                (Path(mtp_dir) / "mtp_config.json").read_bytes()
            ).hexdigest(),
            "plan": [list(s_) for s_ in REFERENCE_SPLIT],
            "drafter": fit_drafter(mtp_files[0]),
            "fixed_ms": fit_mtp_fixed(mtp_stage_rows, manifest["stage_cost"]),
            "steps": len(mtp_trace),
            "tau_by_k": {
                int(k): float((g["accepted"] + 1).mean()) for k, g in mtp_trace.groupby("k")
            },
        }
    per_k = {}  # each profiled K's own fit (Bundle.profile_at)
    for kind, frame in (("chain", trace), ("tree", tree_trace), ("mtp", mtp_trace)):
        if frame is None:
            continue
        for k in ks:
            name = f"acceptance_profile_{kind}_k{k}.yaml"
            per_k[name] = per_k_profile_text(
                frame,
                kind,
                k,
                Path(drafter_dir).name,
                Path(target_dir).name,
                f"wansim calibrate profile: {kind} traces",
            )
            manifest["acceptance"].setdefault("per_k", {}).setdefault(kind, {})[int(k)] = name
    write_bundle(
        out,
        manifest,
        {
            "stage_passes": pd.concat([stage, *mtp_stage], ignore_index=True),
            "drafter": draft,
            "emulator_error": hops,
        },
        profile_text,
        tree_text=tree_text,
        quality_text=yaml.safe_dump(quality, sort_keys=False),
        mtp=mtp_files,
        traces=pd.concat(
            [
                t.assign(drafter=kind)
                for kind, t in (("chain", trace), ("tree", tree_trace), ("mtp", mtp_trace))
                if t is not None
            ],
            ignore_index=True,
        ),
        per_k=per_k,
        idle_rows=idle_rows,
        idle_messages=idle_messages,
        batch_rows=batch_rows,
    )
    say(f"profile written to {out} in {time.perf_counter() - t0:.0f} s")
    return manifest
