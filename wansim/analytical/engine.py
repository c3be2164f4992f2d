"""``analyze(scenario)``: every metric with a closed form, for one scenario."""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.analytical.batched import batched, batched_metrics
from wansim.analytical.batched import stage_utilization as batched_stage_utilization
from wansim.analytical.blocks import block_schedule_metrics, uses_blocks
from wansim.analytical.concurrent import concurrent_metrics
from wansim.analytical.distribution import (
    lap_distribution,
    mean_var,
    mixture_normal_quantiles,
    quantiles,
    shifted_mixture,
)
from wansim.analytical.sync import lap_parts, passes_per_node, stage_utilization, sync_metrics
from wansim.analytical.transport import tcp_equivalent
from wansim.errors import ScenarioError
from wansim.result import Result
from wansim.scenario import Scenario


def check_supported(scenario: Scenario) -> None:
    """What the analytical engine models:

    - the sync schedule, one request at a time (closed forms), any policy (none, chain, tree,
      a chain with hedge branches) and verifier rule;
    - continuous batching of ``workload.concurrency`` sequences (``schedule.batching:
      continuous``, sync): the lockstep batch plus its admissions in steady state
      (:mod:`wansim.analytical.batched`);
    - N concurrent requests without batching (``batching: none``): the closed-network
      approximation of :mod:`wansim.analytical.concurrent`;
    - the block schedule - async in-pipe speculation and the overlapped drafter (max(.) law) -
      with chains, one request or N without batching (:mod:`wansim.analytical.blocks`).

    The rest is refused with a one-line error."""
    sched = scenario.schedule
    blocks = uses_blocks(scenario)
    field = "schedule.kind" if sched.kind == "async" else "drafter.overlap"
    value = sched.kind if sched.kind == "async" else True
    unsupported = [
        ("workload.arrival", scenario.workload.arrival, scenario.workload.arrival == "closed", ""),
        (
            field,
            value,
            not (blocks and scenario.speculation.policy == "tree"),
            "bets on a chain's drafts; trees are",
        ),
        (
            field,
            value,
            not (blocks and sched.hedge_branches),
            "bets on a chain; hedge branches are",
        ),
        (
            "schedule.batching",
            sched.batching,
            not (blocks and sched.batching == "continuous"),
            "async / an overlapped drafter with continuous batching is",
        ),
    ]
    net = scenario.network
    if net.transport == "tcp":
        one = not (blocks or batched(scenario) or concurrent(scenario))
        lossless = not any(h.loss_rate > 0 for h in scenario.resolved_hops())
        scalar = all(np.ndim(v) == 0 for v in (scenario.stages, net.latency_ms, net.loss_rate))
        unsupported.append(
            (
                "network.transport",
                "tcp",
                one and lossless and scalar,
                "tcp beyond one lossless request in the sync schedule (one point at a time) is",
            )
        )
    d = net.drift
    unsupported.append(
        (
            "network.drift",
            f"latency_factor {d.latency_factor}, bandwidth_factor {d.bandwidth_factor}",
            (d.latency_factor, d.bandwidth_factor) == (1.0, 1.0),
            "a drifting ring is",
        )
    )
    for path, value, ok, what in unsupported:
        if not ok:
            why = f"{what} not modelled by the analytical engine" if what else "not modelled by"
            why = why if what else "not modelled by the analytical engine"
            raise ScenarioError(path, f"{why} (use --engine des)", value)


def concurrent(scenario: Scenario) -> bool:
    """N > 1 requests without batching (the closed-network approximation)."""
    return scenario.schedule.batching == "none" and bool(
        np.any(np.asarray(scenario.workload.concurrency) > 1)
    )


def mean_metrics(scenario: Scenario) -> dict[str, np.ndarray]:
    """Mean metrics (arrays; fields may be arrays) by the model that covers the scenario."""
    blocks = uses_blocks(scenario)
    out = block_schedule_metrics(scenario) if blocks else sync_metrics(scenario)
    if batched(scenario):
        out = batched_metrics(scenario, out, lap_parts(scenario))
    if concurrent(scenario):
        out = concurrent_metrics(scenario, out, lap_parts(scenario), blocks)
    return out


GRID_KEYS = (
    "tokens_per_s",
    "throughput_tokens_per_s",
    "tau",
    "lap_ms_mean",
    "tpot_ms_mean",
    "ttft_ms_mean",
    "bubble_fraction",
    "bytes_per_token",
    "wasted_token_fraction",
    "target_exact",
    "tokens_per_pass",
    "draft_ms",
    "stage_compute_ms",
    "forward_hops_ms",
    "return_hop_ms",
    "prefill_ms",
    "passes_per_request",
    "lap_ms_var",
)


def analyze(scenario: Scenario) -> Result:
    check_supported(scenario)
    if scenario.network.transport == "tcp":  # the sync lap under the window, then ideal forms
        scenario = tcp_equivalent(scenario, lambda sc: sync_metrics(sc)["lap_ms_mean"])
    if uses_blocks(scenario) or concurrent(scenario):
        return _analyze_approximation(scenario)
    raw = sync_metrics(scenario)
    exact = bool(np.asarray(raw.pop("target_exact")))
    means = {key: float(np.asarray(v)) for key, v in raw.items()}
    parts = lap_parts(scenario)
    m = scenario.workload.output_tokens - 1

    # lap distribution: compute and drafting are deterministic, hops carry the randomness
    hops = list(scenario.resolved_hops())
    sizes = [float(parts["forward_bytes"])] * (len(hops) - 1) + [float(parts["return_bytes"])]
    constant = float(parts["draft_ms"]) + scenario.stages * float(parts["stage_ms"])
    values, pmf, grid_ms = lap_distribution(hops, sizes, constant)
    lap_p50, lap_p99 = quantiles(values, pmf, [0.5, 0.99])
    _, lap_var = mean_var(values, pmf)
    lap_mean = means["lap_ms_mean"]

    # TPOT: mixture over difficulty of normals (renewal CLT for the number of passes)
    w, n_mean, n_var = passes_per_node(scenario)
    tpot_mean = n_mean * lap_mean / m
    tpot_sd = np.sqrt(lap_mean**2 * n_var + n_mean * lap_var) / m
    tpot_p50, tpot_p99 = mixture_normal_quantiles(w, tpot_mean, tpot_sd, [0.5, 0.99])

    utilization = stage_utilization(scenario, means)
    details = {}
    if batched(scenario):  # continuous batching: the lockstep batch plus admissions
        raw = batched_metrics(scenario, {**raw, "target_exact": exact}, parts)
        stretch = float(np.asarray(raw["lap_ms_mean"])) / lap_mean
        lap_mean = float(np.asarray(raw["lap_ms_mean"]))
        # a lap is the lockstep one, late by D(j) when j other requests were admitted ahead
        others = raw["_admissions"]["others"]
        late = [float(np.asarray(d)) for _, _, d in others]
        exposed = float(np.asarray(raw["_admissions"]["exposed"]))
        prob = [exposed * float(np.asarray(pj)) for _, pj, _ in others]
        lap_p50, lap_p99 = quantiles(*shifted_mixture(values, pmf, late, prob), [0.5, 0.99])
        tpot_p50, tpot_p99 = stretch * tpot_p50, stretch * tpot_p99
        for key in ("tokens_per_s", "throughput_tokens_per_s", "ttft_ms_mean"):
            means[key] = float(np.asarray(raw[key]))
        utilization = batched_stage_utilization(scenario, raw)
        details = {
            "approximation": "continuous batching in steady state (lockstep batch + admissions)",
            "lockstep_lap_ms": float(np.asarray(raw["lockstep_lap_ms"])),
            "convoy_ms_per_lap": float(np.asarray(raw["convoy_ms_per_lap"])),
        }
    metrics = {
        "tokens_per_s": means["tokens_per_s"],
        "throughput_tokens_per_s": means["throughput_tokens_per_s"],
        "tau": means["tau"],
        "lap_ms_mean": lap_mean,
        "lap_ms_p50": float(lap_p50),
        "lap_ms_p99": float(lap_p99),
        "tpot_ms_p50": float(tpot_p50),
        "tpot_ms_p99": float(tpot_p99),
        "ttft_ms_mean": means["ttft_ms_mean"],
        "bubble_fraction": 1.0 - float(np.mean(utilization)),
        "stage_utilization": utilization,
        "bytes_per_token": means["bytes_per_token"],
        "wasted_token_fraction": means["wasted_token_fraction"],
        "target_exact": exact,
    }
    details |= {
        "lap_breakdown_ms": {
            "draft": means["draft_ms"],
            "stage_compute": means["stage_compute_ms"] * scenario.stages,
            "forward_hops": means["forward_hops_ms"],
            "return_hop": means["return_hop_ms"],
        },
        "lap_grid_ms": grid_ms,
        "passes_per_request": means["passes_per_request"],
        "tokens_per_pass": means["tokens_per_pass"],
    }
    return Result(scenario=scenario, engine="analytical", metrics=metrics, details=details)


def _analyze_approximation(scenario: Scenario) -> Result:
    """The block schedule and/or N concurrent requests (approximations, module docstrings of
    :mod:`wansim.analytical.blocks` and :mod:`wansim.analytical.concurrent`)."""
    from wansim.compute import stage_ms_each

    blocks = uses_blocks(scenario)
    alone = block_schedule_metrics(scenario) if blocks else sync_metrics(scenario)
    parts = lap_parts(scenario)
    m = scenario.workload.output_tokens - 1
    p = int(scenario.stages)
    # one request at a time: lap and TPOT percentiles
    if blocks:
        res = alone["_block_details"]
        values, weights = res["lap_atoms"]
        lap_sd = np.sqrt(float(np.asarray(alone["lap_ms_var"])))
        lap_p50, lap_p99 = mixture_normal_quantiles(
            weights, values, np.full(len(values), lap_sd), [0.5, 0.99]
        )
        w = res["weights"][0]
        tpot_mean = res["decode_node_ms"][0] / m
        tpot_sd = np.sqrt(res["decode_node_var"][0]) / m
        tpot_p50, tpot_p99 = mixture_normal_quantiles(w, tpot_mean, tpot_sd, [0.5, 0.99])
    else:
        single = analyze(
            dataclasses.replace(
                scenario, workload=dataclasses.replace(scenario.workload, concurrency=1)
            )
        ).metrics
        lap_p50, lap_p99 = single["lap_ms_p50"], single["lap_ms_p99"]
        tpot_p50, tpot_p99 = single["tpot_ms_p50"], single["tpot_ms_p99"]
    means = alone
    stretch = 1.0
    if concurrent(scenario):
        means = concurrent_metrics(scenario, alone, parts, blocks)
        stretch = float(np.asarray(means["lap_ms_mean"])) / float(np.asarray(alone["lap_ms_mean"]))
        utilization = [float(u) for u in np.asarray(means["stage_rho"])[:p]]
    else:
        duration = float(np.asarray(alone["prefill_ms"])) + float(np.asarray(alone["decode_ms"]))
        prompt = scenario.workload.prompt_tokens
        pre = [float(x) for x in stage_ms_each(scenario, prompt)]
        ver = [float(x) for x in stage_ms_each(scenario, float(np.asarray(parts["tokens"])))]
        passes = float(np.asarray(alone["passes_per_request"]))
        s0 = float(np.asarray(alone["stale_blocks_s0_per_request"]))
        fwd = float(np.asarray(alone["stale_blocks_forwarded_per_request"]))
        draft = 0.0 if scenario.drafter.overlap else float(np.asarray(parts["draft_ms"]))
        busy = [pre[i] + passes * ver[i] for i in range(p)]
        first = scenario.drafter.placement == "first_stage"
        busy[0 if first else p - 1] += passes * draft
        busy[0] += s0 * (ver[0] + (draft if first else 0.0))
        for i in range(1, p - 1):
            busy[i] += fwd * ver[i]
        utilization = [b / duration for b in busy]
    f = {k: float(np.asarray(v)) for k, v in means.items() if np.ndim(v) == 0 and k in GRID_KEYS}
    metrics = {
        "tokens_per_s": f["tokens_per_s"],
        "throughput_tokens_per_s": f["throughput_tokens_per_s"],
        "tau": f["tau"],
        "lap_ms_mean": f["lap_ms_mean"],
        "lap_ms_p50": float(lap_p50) * stretch,
        "lap_ms_p99": float(lap_p99) * stretch,
        "tpot_ms_p50": float(tpot_p50) * stretch,
        "tpot_ms_p99": float(tpot_p99) * stretch,
        "ttft_ms_mean": f["ttft_ms_mean"],
        "bubble_fraction": 1.0 - float(np.mean(utilization)),
        "stage_utilization": utilization,
        "bytes_per_token": f["bytes_per_token"],
        "wasted_token_fraction": f["wasted_token_fraction"],
        "target_exact": bool(np.asarray(means["target_exact"])),
    }
    details = {
        "approximation": ("block schedule" if blocks else "")
        + (" + " if blocks and concurrent(scenario) else "")
        + ("closed network of concurrent requests" if concurrent(scenario) else ""),
        "passes_per_request": f["passes_per_request"],
        "tokens_per_pass": f["tokens_per_pass"],
    }
    if blocks:
        details["bet_win_rate"] = float(np.asarray(alone["bet_win_rate"]))
        details["stale_blocks_s0_per_request"] = float(
            np.asarray(alone["stale_blocks_s0_per_request"])
        )
        details["stale_blocks_forwarded_per_request"] = float(
            np.asarray(alone["stale_blocks_forwarded_per_request"])
        )
    return Result(scenario=scenario, engine="analytical", metrics=metrics, details=details)
