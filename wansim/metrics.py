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

# with faults only (scenario ``faults.events``)
FAULT_METRICS: dict[str, tuple[str, str]] = {
    "goodput_tokens_per_s": ("tok/s", "output tokens of the requests that finished / wall time"),
    "failed_requests": ("", "requests that failed (recovery: fail; expected value analytically)"),
    "availability": ("", "share of the wall time the ring could serve (outside outages)"),
}
ALL_METRICS = {**METRICS, **FAULT_METRICS}

ORDER = list(ALL_METRICS)


def scalar_metrics(metrics: dict) -> dict[str, float]:
    """Flatten to scalars: lists become name_0, name_1, ... (for tables and sweeps)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key == "tokens_per_s_ci95" and value is None:  # undefined: keep the columns
            out[f"{key}_low"] = out[f"{key}_high"] = float("nan")
        elif isinstance(value, (list, tuple)):
            if key == "tokens_per_s_ci95" and len(value) == 2:
                out[f"{key}_low"], out[f"{key}_high"] = float(value[0]), float(value[1])
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
