"""The agreement hunt: random valid scenarios across every mechanism, both engines compared.

Each point draws a scenario from a seeded generator (:func:`draw_scenario`): pipeline depth,
per-hop links, every jitter kind, loss, drafter placement and overlap, chains, trees and no
speculation, sync and async schedules, concurrency with and without continuous batching, short
and long outputs - and the WAN physics of issue 13 on top (:func:`wan_physics`: per-message
costs, payload per hop, compute noise and stragglers, drift, faults, TCP, the
flush_on_full_acceptance protocol and the per-round hybrid). Both engines run it; a point is *out of band* when

    |analytical - DES| > band * DES + 2 * (the DES's 95% half-width)

on tokens/s, with ``band`` the analytical result's own ``approximation.error_band`` (so an
unvalidated point carries the band measured over the unvalidated points). *Silent* errors are
out-of-band points whose result said ``validated: true``: the target is none. A short DES run's
half-width can hide one; ``--deepen`` runs the DES again, deeper, where a validated point's
error lies beyond its band but inside that noise (:func:`deepened`).

    python -m wansim.studies.agreement_hunt [--points N] [--seed S] [--workers W] [--out CSV]
    python -m wansim.studies.agreement_hunt --deepen CSV --out CSV

``tests/agreement/test_agreement_hunt.py`` runs a slice in the default suite and a few hundred points
in the slow run; ``docs/approximations.md`` is rendered from the table this writes.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

JITTER_KINDS = ("none", "normal", "lognormal", "pareto", "empirical")


def draw_scenario(seed: int) -> dict:
    """One random valid scenario (a plain mapping for ``load_scenario(data=...)``): the base
    draw with issue 13's mechanisms on top (:func:`wan_physics`)."""
    return batch_costs(wan_physics(base_scenario(seed), seed), seed)


def base_scenario(seed: int, serving: bool = True) -> dict:
    """The base draw of ``seed`` (what the hunt drew before issue 13's mechanisms; the
    regression tests that name a hunt seed of that time rebuild it with this).

    Sizes are kept small enough for the DES to run it in about a second: at most ~12k decoded
    tokens, at most 10 stages. ``serving=False``: without the serving mechanisms
    (:func:`_serving`), the draw hunts made for ``seed`` before they joined."""
    rng = np.random.default_rng(seed)

    def pick(*xs, p=None):
        return xs[int(rng.choice(len(xs), p=p))]

    stages = int(pick(1, 2, 3, 4, 6, 8, 10, p=[0.06, 0.14, 0.14, 0.2, 0.16, 0.15, 0.15]))
    jitter_kind = pick(*JITTER_KINDS, p=[0.3, 0.15, 0.3, 0.1, 0.15])
    std = float(pick(0.5, 2.0, 5.0, 15.0, 30.0, p=[0.25, 0.3, 0.25, 0.12, 0.08]))
    jitter: dict = {"kind": jitter_kind}
    if jitter_kind in ("normal", "lognormal", "pareto"):
        jitter["std_ms"] = std
    elif jitter_kind == "empirical":
        jitter["samples_ms"] = [float(x) for x in rng.exponential(std, size=16).round(3)]
    network: dict = {
        "latency_ms": float(pick(0.5, 5.0, 25.0, 60.0)),
        "bandwidth_mbps": float(pick(100.0, 1000.0, 10000.0, 100000.0, p=[0.2, 0.35, 0.25, 0.2])),
        "jitter": jitter,
        "loss_rate": float(pick(0.0, 0.001, 0.01, 0.04, p=[0.55, 0.15, 0.2, 0.1])),
    }
    if rng.random() < 0.2:  # per-hop links
        network["hops"] = [
            {
                "latency_ms": float(rng.choice([1.0, 10.0, 40.0])),
                "bandwidth_mbps": float(rng.choice([300.0, 3000.0, 30000.0])),
            }
            for _ in range(stages)
        ]
    policy = pick("none", "chain", "tree", p=[0.15, 0.65, 0.2])
    schedule_kind = "sync"
    overlap = False
    placement = pick("first_stage", "last_stage")
    batching = "none"
    concurrency = int(pick(1, 2, 4, 8, 16, p=[0.35, 0.2, 0.2, 0.15, 0.1]))
    window = 1
    if policy == "chain":
        if rng.random() < 0.35:
            schedule_kind, placement = "async", "first_stage"
            window = int(rng.integers(2, max(3, 2 * stages + 1)))
        overlap = bool(rng.random() < 0.3)
    if concurrency > 1 and schedule_kind == "sync" and not overlap and rng.random() < 0.35:
        batching = "continuous"
    k = int(rng.integers(1, 8))
    acceptance: dict
    if policy == "tree" or rng.random() < 0.3:  # trees need the profile's sibling rates
        acceptance = {
            "profile": "traces/reference/dspark-v4pro.yaml",
            "workload": str(pick("math", "chat")),
        }
        k = min(k, 7)
    else:
        acceptance = {
            "alpha": float(pick(0.3, 0.6, 0.8, 0.95, 0.999)),
            "dispersion": float(pick(0.0, 0.2)),
            "extrapolate": True,
        }
    speculation: dict = {"policy": policy, "k": k}
    if policy == "tree":
        speculation["tree"] = {"kind": "sequoia", "budget_nodes": int(pick(4, 8, 16, 32))}
    output = int(pick(4, 9, 32, 128, 256, p=[0.08, 0.08, 0.24, 0.4, 0.2]))
    requests = int(max(4 * concurrency, 16 if output > 32 else 48))
    requests = int(min(requests, max(4 * concurrency, 12_000 // output)))
    data = {
        "name": f"hunt-{seed}",
        "seed": int(seed),
        "stages": stages,
        "model": {
            "hidden_size": int(pick(1024, 4096, 7168)),
            "compute": {
                "kind": "linear",
                "base_ms": float(pick(1.0, 3.0, 6.0, 12.0)),
                "per_token_ms": float(pick(0.005, 0.02, 0.05)),
            },
        },
        "network": network,
        "drafter": {
            # a drafter at S0 drafts from token ids (the placement rule); engines never read kind
            "kind": "draft_model" if placement == "first_stage" else "dspark",
            "placement": placement,
            "draft_ms": float(pick(0.5, 4.0, 15.0, 60.0, p=[0.25, 0.4, 0.25, 0.1])),
            "overlap": overlap,
            "acceptance": acceptance,
        },
        "speculation": speculation,
        "schedule": {"kind": schedule_kind, "max_inflight_blocks": window, "batching": batching},
        "workload": {
            "requests": requests,
            "concurrency": concurrency,
            "prompt_tokens": int(pick(16, 128, 512)),
            "output_tokens": output,
        },
    }
    return _serving(data, seed) if serving else data


TRACE = "traces/requests/synthetic-chat-code.csv"  # the shipped trace (300 rows)
TRACE_MEAN_OUTPUT = 210  # its mean output length (tokens), for the DES's size cap


def _serving(data: dict, seed: int) -> dict:
    """The serving mechanisms (micro-batches with chunked prefill and a batch cap, length
    distributions and trace workloads, KV capacity), drawn from a stream of their own
    (``(seed, 15)``) so every draw of :func:`draw_scenario` before them is the one earlier
    hunts made for the same seed. Lengths that vary are drawn for the sync schedule only: the
    block schedule solved per length node takes minutes a point (the hunt's budget is about a
    second)."""
    rng = np.random.default_rng([seed, 15])
    wl, sched = data["workload"], data["schedule"]
    many = wl["concurrency"] > 1
    blocks = sched["kind"] == "async" or data["drafter"]["overlap"]
    draw_micro, draw_lengths, draw_kv = rng.random(3)
    if many and not blocks and draw_micro < 0.25:
        sched["batching"] = "continuous"
        sched["micro_batches"] = int(rng.integers(2, 9))
        if rng.random() < 0.7:
            sched["prefill_chunk_tokens"] = int(rng.choice([64, 128, 256, 512]))
        if rng.random() < 0.3:
            sched["max_batch_size"] = int(rng.integers(1, 5))
    kind = "fixed"
    if draw_lengths < 0.25 and not blocks:  # the block schedule per length node: minutes
        kind = str(rng.choice(["lognormal", "empirical", "trace"]))
        lengths: dict = {"kind": kind}
        if kind == "lognormal":
            lengths["prompt_cv"] = float(rng.choice([0.0, 0.5, 1.0]))
            lengths["output_cv"] = float(rng.choice([0.3, 0.6, 1.0]))
            lengths["max_prompt_tokens"] = 8 * wl["prompt_tokens"]
            lengths["max_output_tokens"] = 8 * wl["output_tokens"]
        else:
            wl["trace"] = TRACE
            cap = max(2 * wl["concurrency"], 12_000 // TRACE_MEAN_OUTPUT)
            wl["requests"] = int(min(wl["requests"], cap, 300))
        wl["lengths"] = lengths
    if many and draw_kv < 0.2:
        if kind == "fixed":
            need = wl["prompt_tokens"] + wl["output_tokens"]
        elif kind == "lognormal":
            need = wl["lengths"]["max_prompt_tokens"] + wl["lengths"]["max_output_tokens"]
        else:  # the trace's largest prompt + output (every row must fit)
            from wansim.data import shipped
            from wansim.serving.workload import read_trace

            trace = read_trace(str(shipped(TRACE)))  # (from any folder: the shipped copy)
            need = int((trace.prompt_tokens + trace.output_tokens).max())
        slots = int(rng.integers(1, wl["concurrency"]))  # fewer than the users
        wl["kv_capacity_tokens"] = int(
            max(need, slots * (wl["prompt_tokens"] + wl["output_tokens"]))
        )
    return data


def stage_failure(rng: np.random.Generator, stages: int) -> dict:
    """A stage failure at a fixed time, drawn from ``rng`` in this order: the recovery, the
    detection time, the stage, the time."""
    recovery = str(rng.choice(["failover", "fail"]))
    detection_s = float(rng.choice([0.05, 0.5]))
    stage = int(rng.integers(0, stages))
    at_s = float(rng.choice([0.2, 1.0]))
    return {
        "recovery": recovery,
        "detection_s": detection_s,
        "events": [{"stage": stage, "at_s": at_s}],
    }


def wan_physics(data: dict, seed: int) -> dict:
    """Issue 13's mechanisms on a drawn scenario, from a stream of their own (seed, 13): the
    base draws of every seed stay what they were. Each is added where both engines model it
    (the analytical engine refused the rest when the table was drawn: tcp with loss beyond
    one request or with continuous batching other than one micro-batch, answered since with
    a window range and not drawn, so that every seed keeps its scenario;
    faults with the per-round hybrid, refused when the table was drawn, are
    answered since, with like requests and with requests that differ:
    tests/physics/test_faults_hybrid.py). The hybrid is drawn with one
    request only: its
    concurrent form (answered, ``validated: false``) came after the hunt's table."""
    rng = np.random.default_rng([int(seed), 13])
    net, sched, wl = data["network"], data["schedule"], data["workload"]
    spec, drafter = data["speculation"], data["drafter"]
    stages = int(data["stages"])
    one = wl["concurrency"] == 1 and sched["kind"] == "sync" and not drafter["overlap"]
    lossless = net["loss_rate"] == 0.0 and not net.get("hops")
    if rng.random() < 0.2:  # per-message software costs, per-pass overhead
        net["per_message_ms"] = float(rng.choice([0.5, 3.0, 8.0]))
        net["codec_ms_per_mb"] = float(rng.choice([0.0, 2.0]))
        data["model"]["overhead_ms"] = float(rng.choice([0.0, 1.0, 4.0]))
    if rng.random() < 0.15 and stages > 1:  # auxiliary hidden states accumulating on the ring
        data["payload"] = {
            "return_token_bytes": 4,
            "extra_tensors": [
                {"stage": int(i), "values_per_token": int(data["model"]["hidden_size"])}
                for i in sorted(set(rng.integers(0, stages - 1, size=2).tolist()))
            ],
        }
    if rng.random() < 0.15:  # compute noise, intermittent stragglers
        data["model"]["noise"] = {
            "kind": str(rng.choice(["lognormal", "gamma"])),
            "cv": float(rng.choice([0.1, 0.3])),
        }
        if rng.random() < 0.5:
            data["model"]["straggler"] = {
                "fraction": float(rng.choice([0.05, 0.2])),
                "factor": float(rng.choice([1.5, 3.0])),
                "episode_ms": float(rng.choice([0.0, 200.0])),
            }
    drift = rng.random() < 0.1
    if drift:  # the ring slows by ~1.3x over the run's first seconds
        net["drift"] = {"latency_factor": 1.3, "bandwidth_factor": 0.77, "over_ms": 5000.0}
    if one and not drift and rng.random() < 0.2:  # a stage fails, a spare takes over
        data["faults"] = stage_failure(rng, stages)
    elif (
        (one and lossless and not drift and rng.random() < 0.25)
        or (
            # several requests or an async window on a tcp ring: a stream of its own, so the
            # draws above stay what they were
            lossless
            and not (drift or one)
            and sched["batching"] == "none"
            and np.random.default_rng([int(seed), 13, 2]).random() < 0.2
        )
        or (
            # one request on a lossy tcp ring (the windows its losses leave): a stream of its own
            one
            and not drift
            and not lossless
            and not net.get("hops")
            and "faults" not in data
            and np.random.default_rng([int(seed), 13, 4]).random() < 0.3
        )
    ):
        net["transport"] = "tcp"
    # failures beside several requests or a drifting ring: a stream of its own (seed, 13, 3)
    more = np.random.default_rng([int(seed), 13, 3])
    like = wl.get("lengths", {}).get("kind", "fixed") == "fixed" and not wl.get("mix")
    sync_ring = (
        sched["kind"] == "sync" and not drafter["overlap"] and not sched.get("micro_batches")
    )
    if "faults" not in data and sync_ring and like and (drift or not one) and more.random() < 0.2:
        data["faults"] = stage_failure(more, stages)
    if sched["kind"] == "async":
        if spec["k"] >= 2 and rng.random() < 0.3:
            sched["async_protocol"] = "flush_on_full_acceptance"
        if wl["concurrency"] == 1 and not drafter["overlap"] and rng.random() < 0.6:
            sched["hybrid_confident_fraction"] = float(rng.choice([0.2, 0.5, 0.8]))
            spec["tree"] = {"kind": "sequoia", "budget_nodes": int(rng.choice([4, 8, 16]))}
            acc = drafter["acceptance"]
            if "profile" not in acc:  # the tree rounds need sibling rates
                acc["sibling_logit_offsets"] = [1.0, 2.0]
    # failures on the block schedule (async, an overlapped drafter; the per-round hybrid's have
    # a stream of their own below): a stream of its own (seed, 13, 5)
    blocks = sched["kind"] == "async" or drafter["overlap"]
    if (
        "faults" not in data
        and blocks
        and not sched.get("micro_batches")
        and "hybrid_confident_fraction" not in sched
    ):
        on_blocks = np.random.default_rng([int(seed), 13, 5])
        if on_blocks.random() < 0.3:
            data["faults"] = stage_failure(on_blocks, stages)
    # failures on micro-batched rings and with the per-round hybrid (refused by one engine or
    # both when the table was drawn): streams of their own (seed, 13, 6) and (seed, 13, 7)
    if "faults" not in data and sched.get("micro_batches"):
        micro = np.random.default_rng([int(seed), 13, 6])
        if micro.random() < 0.4:
            data["faults"] = stage_failure(micro, stages)
    if "faults" not in data and "hybrid_confident_fraction" in sched:
        hybrid = np.random.default_rng([int(seed), 13, 7])
        if hybrid.random() < 0.4:
            data["faults"] = stage_failure(hybrid, stages)
    return data


def batch_costs(data: dict, seed: int) -> dict:
    """A batched pass's cost per sequence beyond the first (``model.sequence_ms``,
    ``drafter.sequence_ms``) where several requests share passes (continuous batching), from
    a stream of its own (seed, 18): the other draws of every seed stay what they were."""
    rng = np.random.default_rng([int(seed), 18])
    batched = data["schedule"]["batching"] == "continuous"
    if batched and data["workload"]["concurrency"] > 1 and rng.random() < 0.5:
        data["model"]["sequence_ms"] = float(rng.choice([0.5, 2.0]))
        data["drafter"]["sequence_ms"] = float(rng.choice([0.2, 1.0]))
    return data


def mechanisms(data: dict) -> str:
    """The mechanisms a drawn scenario exercises, joined by '+' (for grouping the table)."""
    tags = []
    s, w, n, d = data["schedule"], data["workload"], data["network"], data["drafter"]
    if s["kind"] == "async":
        tags.append("async")
    if d["overlap"]:
        tags.append("overlap")
    if w["concurrency"] > 1:
        tags.append("batching" if s["batching"] == "continuous" else "concurrent")
    if data["speculation"]["policy"] != "chain":
        tags.append(data["speculation"]["policy"])
    if n["loss_rate"] > 0:
        tags.append("loss")
    if n.get("hops"):
        tags.append("hops")
    if s.get("micro_batches"):
        tags.append("micro-batches")
    if w.get("lengths"):
        tags.append(f"lengths-{w['lengths']['kind']}")
    if w.get("kv_capacity_tokens"):
        tags.append("kv")
    model = data["model"]
    if n.get("per_message_ms"):
        tags.append("per-message")
    if data.get("payload", {}).get("extra_tensors"):
        tags.append("payload-hops")
    if model.get("noise"):
        tags.append("noise")
    if model.get("straggler"):
        tags.append("stragglers")
    if n.get("drift"):
        tags.append("drift")
    if data.get("faults"):
        tags.append("faults")
    if n.get("transport") == "tcp":
        tags.append("tcp")
    if s.get("async_protocol") == "flush_on_full_acceptance":
        tags.append("flush")
    if s.get("hybrid_confident_fraction") is not None:
        tags.append("hybrid")
    if model.get("sequence_ms"):
        tags.append("sequence-cost")
    return "+".join(tags) or "sync"


def evaluate(seed: int, data: dict | None = None) -> dict:
    """Both engines on the scenario drawn from ``seed`` (or on ``data``, a variant of it):
    metrics, errors, the verdict."""
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario
    from wansim.errors import WansimInputError
    from wansim.sim import simulate

    data = draw_scenario(seed) if data is None else data
    row: dict = {"seed": seed, "mechanisms": mechanisms(data)}
    try:
        sc = load_scenario(data=data)
        ana = analyze(sc)
    except WansimInputError as err:  # a combination the analytical engine refuses
        return {**row, "refused": str(err)}
    except Exception as err:
        return {**row, "refused": f"analytical crashed: {type(err).__name__}: {err}"}
    start = time.perf_counter()
    sim = simulate(sc)
    des = sim.metrics
    row["des_s"] = time.perf_counter() - start
    low, high = des["tokens_per_s_ci95"]
    half = (high - low) / 2 if low is not None and high is not None else 0.0
    half = half if np.isfinite(half) else 0.0
    d = des["tokens_per_s"]
    seen = {m: des[m] for m in COMPARED}
    seen["max_utilization"] = max(des["stage_utilization"])
    row.update(_compared(ana, seen, half / d))
    row["des_ttft_half_rel"] = ttft_half_rel(sim.details["record"], sc)
    return row


COMPARED = ("tokens_per_s", "throughput_tokens_per_s", "lap_ms_mean", "lap_ms_p99", "ttft_ms_mean")


def _compared(ana, des: dict, half_rel: float) -> dict:
    """A row's analytical columns and errors against the DES's values ``des`` (the metrics of
    ``COMPARED`` and ``max_utilization``) and its tokens/s 95% half-width, relative."""
    appr = ana.approximation
    band = appr["error_band"]["tokens_per_s"]
    a, d = ana.metrics["tokens_per_s"], des["tokens_per_s"]
    row = {
        "refused": "",
        "regime": appr["regime"],
        "validated": appr["validated"],
        "band": band,
        "des tokens_per_s": d,
        "ana tokens_per_s": a,
        "err tokens_per_s": (a - d) / d,
        "des_half_rel": half_rel,
        "out_of_band": abs(a - d) > band * d + 2 * half_rel * d,
        "why": appr.get("why", ""),
        "des max_utilization": des["max_utilization"],
        "ana max_utilization": max(ana.metrics["stage_utilization"]),
    }
    for m in COMPARED[1:]:
        row[f"des {m}"] = des[m]
        row[f"ana {m}"] = ana.metrics[m]
        row[f"err {m}"] = (ana.metrics[m] - des[m]) / des[m] if des[m] else 0.0
    return row


def reanswered(table, progress=None):
    """The table (an earlier run's CSV) with every point answered again by the analytical
    engine as it is now, the DES's columns kept (the DES has not changed): what a change to the
    analytical engine does to the hunt, in minutes instead of the DES's hours. A point whose
    draw has changed since the table (its mechanisms differ: a later stream of draws, e.g.
    :func:`batch_costs`) is another scenario now, and is run by both engines again
    (:func:`evaluate`)."""
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario

    rows = []
    for i, row in enumerate(table.to_dict("records")):
        data = draw_scenario(int(row["seed"]))
        if mechanisms(data) != row["mechanisms"]:
            row = {k: v for k, v in evaluate(int(row["seed"]), data).items() if k in row}
        elif row["refused"] == "":
            ana = analyze(load_scenario(data=data))
            des = {m: row[f"des {m}"] for m in (*COMPARED, "max_utilization")}
            row = {**row, **_compared(ana, des, row["des_half_rel"])}
        rows.append(row)
        if progress is not None:
            progress(i + 1, len(table))
    return type(table)(rows, columns=table.columns)


DEEP_REQUESTS = 4  # a deepened point's DES runs: this many times the drawn requests ...
DEEP_SEEDS = 2  # ... on this many fresh seeds
DEEP_SEED = 7000  # the first of them


def deepen_candidates(ran):
    """Validated points whose error lies beyond their own band but was not counted silent
    (inside the band plus twice the DES's half-width), on tokens/s or the mean TTFT: where a
    short DES run's noise can mask a silent error (hunt seeds 1796 and 256: -17% against
    an 8% band behind a 5.3% half-width, +10% against 10% behind 7.7%)."""
    validated = ran["validated"].astype(bool)
    tokens = (ran["err tokens_per_s"].abs() > ran["band"]) & ~ran["out_of_band"].astype(bool)
    bands = ran.apply(ttft_band, axis=1) if len(ran) else ran["band"]
    ttft = (ran["err ttft_ms_mean"].abs() > bands) & ~ttft_beyond(ran)
    return validated & (tokens | ttft)


def deepened(table, progress=None):
    """The table with the DES run again, deeper, on :func:`deepen_candidates`: ``DEEP_SEEDS``
    fresh seeds of ``DEEP_REQUESTS`` x the drawn requests, pooled (means averaged, 95%
    half-widths combined as sqrt(sum h^2) / seeds), against the analytical answer as it is
    now. Adds ``deep ...`` columns (empty elsewhere): the pooled DES values, errors and
    half-widths, and ``deep silent`` / ``deep ttft_silent`` (validated now and beyond the band
    plus twice the pooled half-width)."""
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario
    from wansim.sim import simulate

    table = table.copy()
    ran = table[table["refused"] == ""]
    todo = ran.index[deepen_candidates(ran)] if len(ran) else []
    for i, idx in enumerate(todo):
        row = table.loc[idx]
        data = draw_scenario(int(row["seed"]))
        ana = analyze(load_scenario(data=data))
        tokens, tokens_half, ttft, ttft_half = [], [], [], []
        for s in range(DEEP_SEEDS):
            deep = copy.deepcopy(data)
            deep["seed"] = DEEP_SEED + s
            deep["workload"]["requests"] = int(data["workload"]["requests"]) * DEEP_REQUESTS
            sc = load_scenario(data=deep)
            res = simulate(sc)
            m = res.metrics
            low, high = m["tokens_per_s_ci95"]
            tokens.append(m["tokens_per_s"])
            tokens_half.append((high - low) / 2 if low is not None and high is not None else 0.0)
            ttft.append(m["ttft_ms_mean"])
            ttft_half.append(ttft_half_rel(res.details["record"], sc) * m["ttft_ms_mean"])
        d, t = float(np.mean(tokens)), float(np.mean(ttft))
        half = float(np.sqrt(np.sum(np.square(tokens_half)))) / DEEP_SEEDS / d
        t_half = float(np.sqrt(np.sum(np.square(ttft_half)))) / DEEP_SEEDS / t if t else 0.0
        appr = ana.approximation
        err = (ana.metrics["tokens_per_s"] - d) / d
        t_err = (ana.metrics["ttft_ms_mean"] - t) / t if t else 0.0
        now = {**row.to_dict(), "validated": appr["validated"], "regime": appr["regime"]}
        table.loc[idx, "deep des tokens_per_s"] = d
        table.loc[idx, "deep err tokens_per_s"] = err
        table.loc[idx, "deep des_half_rel"] = half
        table.loc[idx, "deep des ttft_ms_mean"] = t
        table.loc[idx, "deep err ttft_ms_mean"] = t_err
        table.loc[idx, "deep des_ttft_half_rel"] = t_half
        band = appr["error_band"]["tokens_per_s"]
        table.loc[idx, "deep silent"] = bool(appr["validated"] and abs(err) > band + 2 * half)
        table.loc[idx, "deep ttft_silent"] = bool(
            appr["validated"] and abs(t_err) > ttft_band(now) + 2 * t_half
        )
        if progress is not None:
            progress(i + 1, len(todo))
    return table


def ttft_half_rel(record, scenario) -> float:
    """The DES's 95% half-width on its mean TTFT, relative: 1.96 s / sqrt(n) over the measured
    requests (taken as independent). Retransmissions are rare and long (an RTO of 200 ms on a
    prefill of tens of ms), so a run may see none or few of them and its sample spread then
    understates the mean's noise: the half-width is at least 1.96 RTO sqrt(p (1 - p) / n),
    p = max(k, 3) / n with k the requests whose prefill was retransmitted (3: the rule of
    three's 95% bound when none was)."""
    from wansim.sim.metrics import measured_mask

    mask = measured_mask(record)
    ttft = (record.first_token_ms - record.arrival_ms)[mask]
    n = len(ttft)
    if n < 2 or ttft.mean() <= 0:
        return 0.0
    half = 1.96 * ttft.std(ddof=1) / np.sqrt(n)
    links = list(scenario.resolved_hops()) if scenario.network.hops else [scenario.network]
    lossy = [float(link.retransmit_ms) for link in links if float(link.loss_rate) > 0]
    if lossy:
        rto = min(lossy)
        hit = int((ttft > ttft.min() + 0.5 * rto).sum())
        p = min(max(hit, 3) / n, 1.0)
        half = max(half, 1.96 * rto * np.sqrt(p * (1 - p) / n))
    return float(half / ttft.mean())


def run(seeds, workers: int | None = None, progress=None):
    """The table over ``seeds`` (``progress(row)`` after each point, e.g. to save partial
    results)."""
    import pandas as pd

    seeds = list(seeds)
    rows = []
    if workers == 1:
        results = map(evaluate, seeds)
    else:
        pool = ProcessPoolExecutor(max_workers=workers)
        results = pool.map(evaluate, seeds, chunksize=1)
    for row in results:
        rows.append(row)
        if progress:
            progress(row)
    if workers != 1:
        pool.shutdown()
    return pd.DataFrame(rows)


def documented_band(regime: str) -> float:
    """The documented tokens/s band of a regime (docs/approximations.md); a combination no
    grid measured takes the widest band among its parts; an expectation over workload nodes
    (varied lengths) at least the varied-lengths band."""
    from wansim.analytical.regime import REGIMES, VARIED_LENGTHS_BAND

    if regime in REGIMES:
        return REGIMES[regime].error_band["tokens_per_s"]
    band = max(b.error_band["tokens_per_s"] for n, b in REGIMES.items() if n in regime)
    if "expectation over" in regime:
        band = max(band, VARIED_LENGTHS_BAND["tokens_per_s"])
    return band


def beyond_documented(ran):
    """Per point that ran: |error| on tokens/s beyond its regime's documented band plus twice
    the DES's 95% half-width (the hunt's target: under 2% of the points)."""
    band = ran["regime"].map(documented_band)
    return ran["err tokens_per_s"].abs() > band + 2 * ran["des_half_rel"]


def ttft_beyond(ran):
    """Per point that ran: |error| on the mean TTFT beyond its regime's TTFT band plus twice
    the DES's half-width on it (unvalidated points: the unvalidated band)."""
    half = ran.get("des_ttft_half_rel", 0.0)
    if len(ran) and "des ttft_ms_mean" in ran:
        floor = ran["seed"].map(jitter_floor_ms) / ran["des ttft_ms_mean"]
        half = np.maximum(half, floor)
    bands = ran.apply(ttft_band, axis=1) if len(ran) else ran["regime"]
    return ran["err ttft_ms_mean"].abs() > bands + 2 * half


def ttft_band(row) -> float:
    """A row's band on the mean TTFT: its regime's (unvalidated points: the unvalidated band;
    an expectation over workload nodes: the wider of its regime's and the varied-lengths
    band, :func:`wansim.analytical.regime.varied_approximation`)."""
    from wansim.analytical.regime import REGIMES, UNVALIDATED_BAND, VARIED_LENGTHS_BAND

    if not row["validated"]:
        return UNVALIDATED_BAND["ttft_ms_mean"]
    if row["regime"] in REGIMES:
        return REGIMES[row["regime"]].error_band["ttft_ms_mean"]
    own = max(b.error_band["ttft_ms_mean"] for n, b in REGIMES.items() if n in row["regime"])
    if "expectation over" in row["regime"]:
        own = max(own, VARIED_LENGTHS_BAND["ttft_ms_mean"])
    return own


def jitter_floor_ms(seed: int) -> float:
    """A floor under the DES's 95% half-width on the mean TTFT from the jitter the scenario
    states: 1.96 sqrt(sum of the prefill's hops' jitter variances / n), n the measured
    requests. Heavy-tailed jitter (pareto) rarely shows its variance in a few requests, so
    their sample spread understates the mean's noise (hunt seed 94: 16 requests, pareto 5 ms:
    a sample half-width of 0.5% against 2.1% from the stated std)."""
    from wansim.config.scenario import load_scenario
    from wansim.sim.metrics import warmup_requests

    sc = load_scenario(data=draw_scenario(int(seed)))
    wl = sc.workload
    n = wl.requests - warmup_requests(min(wl.concurrency, wl.requests), wl.requests)
    hops = list(sc.resolved_hops())[: int(sc.stages) - 1]
    var = sum(float(h.jitter.std_ms) ** 2 for h in hops if h.jitter.kind != "none")
    return float(1.96 * np.sqrt(var / max(n, 1)))


def summary(table) -> dict:
    """Share out of band (the result's own band, and the documented band of its regime),
    silent errors on tokens/s and TTFT, the worst errors (by |error| on tokens/s)."""
    ran = table[table["refused"] == ""]
    beyond = beyond_documented(ran)
    out = ran[ran["out_of_band"].astype(bool)]
    silent = out[out["validated"].astype(bool)]
    ttft_silent = ran[ttft_beyond(ran) & ran["validated"].astype(bool)]
    worst = ran.reindex(ran["err tokens_per_s"].abs().sort_values(ascending=False).index)
    result = {
        "points": len(table),
        "ran": len(ran),
        "refused": int(len(table) - len(ran)),
        "out_of_band": len(out),
        "out_of_band_share": float(len(out) / max(len(ran), 1)),
        "silent": len(silent),
        "ttft_silent": len(ttft_silent),
        "validated": int(ran["validated"].astype(bool).sum()),
        "beyond_documented": int(beyond.sum()),
        "beyond_documented_share": float(beyond.sum() / max(len(ran), 1)),
        "worst": [
            (int(r["seed"]), r["mechanisms"], float(r["err tokens_per_s"]))
            for _, r in worst.head(10).iterrows()
        ],
    }
    if "deep silent" in ran:  # (deepened)
        deep = ran["deep silent"].notna()
        result["deepened"] = int(deep.sum())
        result["deep_silent"] = int(ran.loc[deep, "deep silent"].astype(bool).sum())
        result["deep_ttft_silent"] = int(ran.loc[deep, "deep ttft_silent"].astype(bool).sum())
    return result


def markdown(table, before=None) -> str:
    """The hunt's section of ``docs/approximations.md``: the verdict, per regime, the worst
    points named (seed, mechanisms) with why each lies outside its measured domain."""
    from wansim.analytical.regime import approximation
    from wansim.config.scenario import load_scenario

    s = summary(table)
    ran = table[table["refused"] == ""].copy()
    ran["abs"] = ran["err tokens_per_s"].abs()
    ran["regime"] = ran["regime"].str.replace(
        r"over \d+ workload nodes", "over workload nodes", regex=True
    )
    ran["beyond"] = beyond_documented(ran)
    lines = [
        "## The agreement hunt: random scenarios across every mechanism",
        "",
        f"`python -m wansim.studies.agreement_hunt --points {s['points']}`: {s['ran']} random valid"
        " scenarios (`wansim.studies.agreement_hunt.draw_scenario`: 1-10 stages, per-hop links, every"
        " jitter kind, 0-4% loss, placement, overlap, chains, trees and no speculation, sync and"
        " async, 1-16 requests with and without continuous batching, 2-8 micro-batches with"
        " chunked prefill and batch caps, lognormal, empirical and trace lengths (the shipped"
        " trace), KV capacity below the users' need, 4-256 output tokens), both engines."
        f" {drawn_in(table)} A point is *beyond its band* when |analytical - DES| exceeds the"
        " documented band of its regime (the table above) plus twice the DES's 95% half-width.",
        "",
        f"- validated (inside a measured regime): {s['validated']} of {s['ran']};",
        f"- beyond the documented band: {int(ran['beyond'].sum())}"
        f" ({100 * ran['beyond'].mean():.1f}%), of them validated:"
        f" {int((ran['beyond'] & ran['validated'].astype(bool)).sum())};",
        f"- silent errors (beyond the result's own band while validated): {s['silent']} on"
        f" tokens/s, {s['ttft_silent']} on the mean TTFT (its band plus twice the DES's"
        " half-width on it, `ttft_half_rel`);",
        f"- refused (a combination the analytical engine does not model) or crashed:"
        f" {s['refused']}, of them crashed: {crashed(table)}.",
        "",
    ]
    if before is not None:
        lines += [before, ""]
    lines += [
        "| regime | points | validated | median abs error | worst abs error |",
        "|---|---|---|---|---|",
    ]
    for regime, sub in ran.groupby("regime"):
        lines.append(
            f"| {regime} | {len(sub)} | {int(sub['validated'].astype(bool).sum())} |"
            f" {100 * sub['abs'].median():.1f}% | {100 * sub['abs'].max():.1f}% |"
        )
    lines += [
        "",
        "The worst points (tokens/s), each with why the engine does not vouch for it:",
        "",
        "| seed | mechanisms | DES tok/s | analytical | error | DES half-width | why not validated |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, r in ran.sort_values("abs", ascending=False).head(10).iterrows():
        # the reason the run recorded (the table may predate later mechanisms in the draw)
        why = r.get("why") if isinstance(r.get("why"), str) else None
        if why is None:
            why = approximation(load_scenario(data=draw_scenario(int(r["seed"])))).why
        lines.append(
            f"| {int(r['seed'])} | {r['mechanisms']} | {r['des tokens_per_s']:.2f} |"
            f" {r['ana tokens_per_s']:.2f} | {100 * r['err tokens_per_s']:+.1f}% |"
            f" {100 * r['des_half_rel']:.1f}% | {why or 'validated'} |"
        )
    lines += ["", "Why these points are off:", ""]
    lines += [f"- *{head}*: {text}" for head, text in EXPLAINED.items()]
    lines += [
        "",
        "Rebuild a point: `wansim.studies.agreement_hunt.draw_scenario(seed)` gives its scenario.",
        "",
    ]
    return "\n".join(lines)


WAN_TAGS = {
    "per-message": "per-message costs",
    "payload-hops": "payload per hop",
    "noise": "compute noise",
    "stragglers": "stragglers",
    "drift": "drift",
    "faults": "faults",
    "tcp": "tcp",
    "flush": "the flush protocol",
    "hybrid": "the per-round hybrid",
}


def drawn_in(table) -> str:
    """Which of issue 13's mechanisms the table's points carry, with their counts (read from
    the table's ``mechanisms``, so the text never claims draws the table lacks)."""
    tags = table["mechanisms"].str.split("+")
    counts = {name: int(tags.map(lambda t, k=tag: k in t).sum()) for tag, name in WAN_TAGS.items()}
    present = [f"{name} ({n})" for name, n in counts.items() if n]
    if not present:
        return "Its draws predate issue 13's WAN physics (none of its points carries them)."
    return "Issue 13's WAN physics on top, points per mechanism: " + ", ".join(present) + "."


def crashed(table) -> int:
    """Points where the analytical engine raised something other than an input error."""
    return int(table["refused"].astype(str).str.startswith("analytical crashed").sum())


EXPLAINED = {
    "loss with several messages in flight": "links deliver in order (TCP), so a lost "
    "message holds every message behind it for its retransmission (200 ms by default, often "
    "several laps). Other requests' messages: the M/G/inf resequencing wait per hop "
    "(`wansim/analytical/resequencing.py`, checked against a simulation to 5%). A request's "
    "own async blocks: the window stalls once per loss, not once per held block, and losses "
    "among the blocks still crossing other hops are repaired inside the same stall "
    "(`wansim.analytical.blocks.loss_stalls`): while one loss holds the ring S0 fills its "
    "window, and losses among the other blocks' crossings overlap the stall, each loss "
    "costing its stall / sqrt(1 + 2x) with x = 0.3 g (B - 1) (fitted on 17 single-request "
    "lossy async points against the DES, tests/engines/test_async_loss_stalls.py). It counts "
    "the window, not the blocks of the lossless lap, so a faster ring never absorbs fewer "
    "losses (halving latency had cost up to 7% of tokens/s). The single-request async points "
    "with loss of the draws before the serving mechanisms (seeds 89, 156, 216, 250) went from "
    "-68%, -73%, -60%, -19% to -5%, +1%, -6%, -5%; 4% loss with near-certain acceptance on "
    "10 stages (17 blocks in flight) from +44% (+36%: seed 287) to +8% (-14%). Left: 16 async "
    "requests at 4% loss (seed 101 +38%, seed 84 +52% against a DES half-width of 72%), and "
    "requests without speculation whose 4-token outputs ride behind 512-token prefills "
    "(seed 24, -31%). Seed 210 (+391%, now inside the DES's 95% interval): 8 requests whose "
    "7 MB prefills take 590 ms a hop at 100 Mbit/s start 590 ms apart, so requests of equal "
    "length never finish together and their successors' prefills convoy them; counted pair "
    "by pair (`stagger_fraction` in `wansim/analytical/concurrent.py`: the pairs whose start "
    "spacing outlasts a request's decode), so that a shorter decode moves the share "
    "continuously (an all-or-none switch made a faster link lower tokens/s, seed 2058).",
    "no measured regime covers this combination": "the overlapped drafter with concurrent "
    "requests was never measured on a grid. Its drafter device is shared: a queued draft that "
    "starts after its request's lost bet is heard drafts from the correction, so a loaded "
    "drafter makes fewer stale drafts than a request alone; the stale-work fixed point runs "
    "on the drafter's queue (seed 139: -37.5% -> +0.1%; seed 53: -44% -> -1.5%), mixing the "
    "two states where the stale counts step with the wait (seed 48: 4x the bandwidth had "
    "given -18%). Saturated (16 requests on a 4 ms drafter, seed 297), its FIFO queue holds "
    "one draft per request, each waits (N - 1) d, longer than its pass's travel, and no draft "
    "is stale: -33% -> -3%.",
    "transport tcp with one micro-batch": "(`validated: false`, not on the grid) the batch's "
    "frame once a lap, followed from the run's start "
    "(`wansim.analytical.transport.ring_start_costs_ms`: the first wave's prompts from cold "
    "connections, then verify frames; a ring can settle warm or cold under restart-after-idle "
    "and the DES picks by its start), a replacement's prompt frame's window in TTFT. Against "
    "the DES on scenarios/tcp-ring-frame-per-lap.yaml (tests/physics/test_tcp_loaded.py): "
    "tokens/s -3.5% to +2.1%, TTFT -8.7% to -0.8%. Several micro-batches and lossy batches "
    "are answered since as trains (`validated: false`: several frames a lap travel as a "
    "platoon whose window restarts by its history, +458% for the evenly spaced train of 2 "
    "micro-batches) with the window range (`approximation.range`: every window cold to every "
    "window open, the DES inside it). Batching without micro-batches is answered as its "
    "requests apart (`validated: false`: the batch's groups drift apart, a request's frame "
    "opening its window sooner than the whole batch's) with a range over the structures the "
    "batch can take (the requests apart, the lockstep batch, 2, 4, ... micro-batches), every "
    "window closed and open: the DES inside it on 5 sync rings and 13% above it for an async "
    "window of 2 (tests/physics/test_tcp_batch_apart.py).",
    "transport tcp with loss": "one request on a lossy tcp ring: a loss leaves ssthresh at "
    "half the flight and the windows after it never grow back within the run, so what a "
    "loss costs depends on where in the run it falls; the model runs each hop's train and "
    "the prefills with their losses spread evenly, and where the run expects fewer than "
    "one loss a stretch, weights one loss's excess by where the run's first loss falls "
    "(seed 127, 0.1% loss: -76% -> -12% on tokens/s, TTFT +698% -> +0.1%). Seed 9 (4% loss, "
    "10 stages, 4-token outputs: -16%) is beyond its band: evenly spaced losses understate "
    "the clumps of random ones.",
    "TTFT": "a new request's prefill enters in the phase its predecessor leaves, so on a ring "
    "without link randomness it waits for no one (seed 43 of the earlier draws: +85% -> 0%, "
    "seed 83: +19% -> -1%); the async ring's TTFT band is the hunt's (seed 26: +57% against a "
    "DES half-width of 12%, 35%). The DES's half-width on the mean TTFT has floors for rare "
    "retransmissions and for the stated jitter (`ttft_half_rel`, `jitter_floor_ms`).",
    "continuous batching whose batch would run": "the DES's replacements travel as groups of "
    "their own, and where the sequences drift apart (they finish at different passes) and "
    "the batch's own work is a large share of its lap (long trees, many sequences, slow links) "
    "the groups pipeline through the ring: 16 tree sequences of 32 nodes run 38% faster in the "
    "DES than the lockstep batch. Batches whose sequences finish together (no speculation, "
    "near-certain acceptance) stay one batch and agree (their refill convoys were the -83% to "
    "-96% errors of the renewal count, fixed with the slots' completion waves). Where one "
    "station's pass (a drafter on S0 or the last stage included) outlasts the rest of the lap, "
    "the groups alternate at it and never merge, and the split runs slower: a 60 ms drafter on "
    "S0 beside a ring of 6 ms, +52% on tokens/s (fresh hunt seed 4436).",
    "continuous batching whose replacements' prefills outrun": "a replacement's prefill "
    "faster than the batch at every station (short prompts beside a costly batch: trees, "
    "a cost per sequence) runs ahead of it, never meets it in a queue and travels as a group "
    "of its own, so the DES's batch fragments where the lockstep model keeps it whole "
    "(`wansim.analytical.batched.prefill_lead`; seed 1796 of a fresh hunt: passes of 1.06 "
    "sequences on average in the DES against the model's 8, tokens/s -18% while validated; "
    "seed 1780 -18%; the grid's 10-stage ring with 16-token prompts -12%). Where a prompt's "
    "pass is the slower somewhere the batch waits behind it and merges (the grid's 512-token "
    "prompts; seed 1796 with 2,048-token prompts: +2%).",
    "continuous batching of requests that differ in output": "without speculation a "
    "batch's sequences of one length finish at the same pass, so each node's batch of like "
    "requests refills in one wave of prompts; outputs of unequal lengths end apart in the "
    "run and their replacements prefill in small groups (fresh hunt seed 2095, found by "
    "`--deepen`: 4 users, lognormal lengths: mean TTFT +70% to +87%, tokens/s exact).",
    "continuous batching with a cost per sequence": "each sequence beyond the first adds "
    "its cost to a batched pass; where sequences finish apart (speculation) the DES's batch "
    "splits into groups that pay less of it than the lockstep batch of every user the model "
    "keeps, and the grid measured no such cost (fresh hunt seed 2485, found by `--deepen`: "
    "2 ms a stage a sequence, 4 users on 3 stages: tokens/s -12%, +1% without the cost).",
    "jitter beyond 5 ms": "heavy or heavy-tailed jitter on a loaded ring holds messages "
    "behind late ones (the resequencing wait models the hold, not the bunches it releases "
    "downstream); the DES's own intervals are wide there (26-56% half-widths). An async "
    "window's blocks queue the same way behind one request's late messages (seed 256: a "
    "window of 11 behind 0.8-87 ms of empirical jitter, +17% on 256 requests; a window of "
    "one, -0.4%).",
    "jitter of": "an async window's blocks are held behind late ones, more than the "
    "resequencing wait carries once the ring's jitter is a large share of its lap "
    "(`wansim.analytical.regime.jitter_share`; fresh hunt seed 2028: 5 ms hops with 5 ms of "
    "lognormal jitter, a window of 4: tokens/s +14% at 22% of the lap; on the same ring +3% "
    "at 7% and +9% at 19%). The async grid measured up to 13% (its 2-stage, 5 ms points).",
    "KV admission with requests that differ": "the analytical engine answers requests that "
    "differ node by node, and each node's KV queue as if every user were of its kind, where "
    "the DES's requests share one pool (fresh hunt seed 1926, the shipped trace's lengths "
    "behind an 8,225-token cache: mean TTFT +45% to +69% on 256 requests).",
    "requests that differ without speculation on a ring without link randomness": "the "
    "analytical engine answers requests that differ node by node, each node a ring of like "
    "requests; without speculation, jitter or loss such a ring is deterministic and its "
    "requests keep their phases and never wait, where the run's unequal lengths end them out "
    "of step and their successors enter at mixed phases (fresh hunt seed 2198, found by "
    "`--deepen`: the shipped trace's lengths, 8 users on 10 stages, lap 111 ms against the "
    "DES's 155, tokens/s +37%; with 3 ms of jitter +6%, with a chain of 3 drafts -0.3%).",
    "micro-batches with loss or long trees": "micro-batched rings are `validated: false` "
    "outside their measured grid (chunked prefill, no loss). With loss a retransmission "
    "(200 ms, several laps) holds the other micro-batches' messages too: the lap gains the "
    "resequencing wait of the other N' - 1 batches' messages, the cycle solved as a fixed "
    "point (`hol_wait_ms` in `wansim/analytical/micro_batched.py`; seeds 32, 62, 285 from "
    "+190%, +150%, +134% to +14%, +12%, -23%; the 42 micro-batched points' mean |error| "
    "20.6% -> 7.3%); the Poisson law understates the bunches a long hold releases. Seed 128 "
    "(+30%) keeps its error: 4 batches of 32-node trees, whose passes pipeline. 32-node trees in 2-8 "
    "micro-batches pipeline where the model keeps them in lockstep (seed 35: +66% against a "
    "DES half-width of 32%). Eight points of this kind (seeds 32, 62, 76, 128, 154, 163, 226, 244: "
    "auxiliary hidden states on a micro-batched ring) crashed the engine before this table "
    "(the return message's features asked for a ring size; `wire_bytes.verdict_bytes`).",
    "several requests on links below 1000 Mbit/s": "prefills of hundreds of tokens hold a "
    "slow link for seconds; the convoys they form dominate the ring (100 Mbit/s, 8 requests, "
    "no speculation: -54%).",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wansim.studies.agreement_hunt")
    ap.add_argument("--points", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0, help="first seed; points use seed..seed+N-1")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--out", default="agreement_hunt.csv")
    ap.add_argument(
        "--reanswer",
        metavar="CSV",
        help="answer an earlier run's points again with the analytical engine as it is now,"
        " keeping its DES columns (reanswered), and write the table to --out",
    )
    ap.add_argument(
        "--deepen",
        metavar="CSV",
        help="run the DES again, deeper, on an earlier run's validated points whose error lies"
        " beyond their band but inside its noise (deepened), and write the table to --out",
    )
    args = ap.parse_args(argv)
    import json

    if args.deepen:
        need = ["seed", "refused", "validated", "regime", "band", "out_of_band"]
        need += ["err tokens_per_s", "err ttft_ms_mean", "des ttft_ms_mean", "des_ttft_half_rel"]
        return _rework("--deepen", args.deepen, args.out, need, deepened)
    if args.reanswer:
        need = ["seed", "mechanisms", "refused", "des_half_rel"]
        need += [f"des {m}" for m in (*COMPARED, "max_utilization")]
        return _rework("--reanswer", args.reanswer, args.out, need, reanswered)

    partial = open(args.out + ".jsonl", "w")  # noqa: SIM115 - appended to as points finish

    def save(row):
        partial.write(json.dumps({k: v for k, v in row.items()}, default=float) + "\n")
        partial.flush()

    table = run(range(args.seed, args.seed + args.points), workers=args.workers, progress=save)
    partial.close()
    table.to_csv(args.out, index=False, float_format="%.6g")
    s = summary(table)
    for key, value in s.items():
        print(f"{key}: {value}")
    return 0 if s["silent"] == 0 else 1


def read_table(path):
    """A table this module wrote (``--out``), as written: empty cells NaN, but ``refused``
    text ("" where both engines answered, also in a table where nothing was refused, which
    pandas would read as floats)."""
    import pandas as pd

    table = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"refused": "str"})
    if "refused" in table.columns:
        table["refused"] = table["refused"].fillna("")
    return table


def _rework(flag: str, path: str, out: str, need: list[str], transform) -> int:
    """An earlier run's table at ``path``, ``transform``-ed (:func:`reanswered`,
    :func:`deepened`; progress on stderr), written to ``out``, its summary printed. Exit 2 for
    a table this module did not write, 1 where a silent error remains."""

    try:
        table = read_table(path)
    except (OSError, ValueError) as err:
        print(f"{flag}: {path}: cannot read a CSV table ({err})", file=sys.stderr)
        return 2
    missing = [c for c in need if c not in table.columns]
    if missing:
        print(
            f"{flag}: {path} lacks the columns {', '.join(missing)}"
            " (a table written by this module's --out)",
            file=sys.stderr,
        )
        return 2
    table = transform(table, progress=lambda i, n: print(f"\r{i}/{n}", end="", file=sys.stderr))
    print(file=sys.stderr)
    table.to_csv(out, index=False, float_format="%.6g")
    s = summary(table)
    for key, value in s.items():
        print(f"{key}: {value}")
    return 0 if s["silent"] == 0 and s.get("deep_silent", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
