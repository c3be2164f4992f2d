"""``analyze(scenario)``: every metric with a closed form, for one scenario."""

from __future__ import annotations

import numpy as np

from wansim.analytical.distribution import (
    lap_distribution,
    mean_var,
    mixture_normal_quantiles,
    quantiles,
)
from wansim.analytical.sync import lap_parts, passes_per_node, stage_utilization, sync_metrics
from wansim.errors import ScenarioError
from wansim.result import Result
from wansim.scenario import Scenario


def check_supported(scenario: Scenario) -> None:
    """The closed forms cover the sync schedule with one request at a time, or a lockstep batch
    of ``workload.concurrency`` sequences with ``schedule.batching: continuous``; any policy
    (none, chain, tree, a chain with hedge branches) and verifier rule."""
    batched = scenario.schedule.batching == "continuous"
    unsupported = [
        ("schedule.kind", scenario.schedule.kind, scenario.schedule.kind == "sync"),
        (
            "workload.concurrency",
            scenario.workload.concurrency,
            scenario.workload.concurrency == 1 or batched,
        ),
        ("workload.arrival", scenario.workload.arrival, scenario.workload.arrival == "closed"),
    ]
    for path, value, ok in unsupported:
        if not ok:
            raise ScenarioError(
                path, "not modelled by the analytical engine (use --engine des)", value
            )


def analyze(scenario: Scenario) -> Result:
    check_supported(scenario)
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
    details = {
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
