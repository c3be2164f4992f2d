"""Metric names shared by both engines, with units and meanings."""

from __future__ import annotations

# name -> (unit, meaning). Both engines report these names with the same meaning.
METRICS: dict[str, tuple[str, str]] = {
    "tokens_per_s": (
        "tok/s",
        "mean decode rate of one request (output tokens after the first / decode time)",
    ),
    "throughput_tokens_per_s": ("tok/s", "all requests: output tokens / wall time"),
    "tau": ("tok/pass", "tokens committed per verify pass (step-weighted)"),
    "lap_ms_mean": ("ms", "verify-to-verify time of a request, mean"),
    "lap_ms_p50": ("ms", "lap, median"),
    "lap_ms_p99": ("ms", "lap, 99th percentile"),
    "tpot_ms_p50": (
        "ms",
        "time per output token of a request (decode time / decode tokens), median",
    ),
    "tpot_ms_p99": ("ms", "time per output token, 99th percentile over requests"),
    "ttft_ms_mean": ("ms", "time to first token (prefill through the pipeline), mean"),
    "ttft_ms_p50": ("ms", "time to first token (arrival to first token), median"),
    "ttft_ms_p99": ("ms", "time to first token, 99th percentile over requests"),
    "e2e_ms_p50": ("ms", "end-to-end latency of a request (arrival to last token), median"),
    "e2e_ms_p99": ("ms", "end-to-end latency, 99th percentile over requests"),
    "queue_ms_mean": ("ms", "queueing delay (arrival to admission: a slot or KV memory), mean"),
    "queue_ms_p99": ("ms", "queueing delay, 99th percentile over requests"),
    "slo_attainment": ("", "share of requests meeting workload.slo (TTFT and TPOT bounds)"),
    "goodput_requests_per_s": ("req/s", "requests meeting workload.slo per second of wall time"),
    "bubble_fraction": ("", "idle share of stage time, 1 - mean stage utilisation"),
    "stage_utilization": ("", "busy share of each stage (list, S0 first)"),
    "bytes_per_token": (
        "B/tok",
        "wire bytes per committed decode token, all hops, retransmissions included",
    ),
    "wasted_token_fraction": (
        "",
        "verified-but-rejected plus cancelled tokens over all tokens processed",
    ),
    "target_exact": (
        "",
        "output distribution is the target's (false for typical acceptance, a lossy rule)",
    ),
    "tokens_per_s_ci95": (
        "tok/s",
        "DES: 95% confidence interval of tokens_per_s [low, high] (null when undefined)",
    ),
}

# DES: a 95% interval beside every percentile (bootstrap; wansim.sim.metrics)
PERCENTILE_METRICS = tuple(name for name in METRICS if name.endswith(("_p50", "_p99")))
CI_METRICS = ("tokens_per_s_ci95", *(f"{name}_ci95" for name in PERCENTILE_METRICS))

# with faults only (scenario ``faults.events``)
FAULT_METRICS: dict[str, tuple[str, str]] = {
    "goodput_tokens_per_s": ("tok/s", "output tokens of the requests that finished / wall time"),
    "failed_requests": ("", "requests that failed (recovery: fail; expected value analytically)"),
    "availability": ("", "share of the wall time the ring could serve (outside outages)"),
}
ALL_METRICS = {**METRICS, **FAULT_METRICS}

ORDER = list(ALL_METRICS)


def is_interval(name: str) -> bool:
    """Whether a metric is a [low, high] interval (DES only)."""
    return name.endswith("_ci95")


def scalar_metrics(metrics: dict) -> dict[str, float]:
    """Flatten to scalars: lists become name_0, name_1, ... (for tables and sweeps)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if is_interval(key) and value is None:  # undefined: keep the columns
            out[f"{key}_low"] = out[f"{key}_high"] = float("nan")
        elif isinstance(value, (list, tuple)):
            if is_interval(key) and len(value) == 2:  # a side may be null: unbounded
                low, high = (float("nan") if v is None else float(v) for v in value)
                out[f"{key}_low"], out[f"{key}_high"] = low, high
            else:
                for i, v in enumerate(value):
                    out[f"{key}_{i}"] = float(v)
        elif value is not None:
            out[key] = value if isinstance(value, (bool, str)) else float(value)
    return out


def stage_utilization(busy_ms, span_ms: float) -> list[float]:
    """Per stage: busy ms (compute and drafting on that stage, prefill included) over the span
    they share (a run's makespan, or one request's duration when nothing else runs). Both
    engines report it so; ``bubble_fraction`` is 1 - its mean."""
    return [float(b) / float(span_ms) for b in busy_ms]
