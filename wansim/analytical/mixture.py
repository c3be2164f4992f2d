"""Expectations over a workload whose requests differ: prompt/output lengths from a distribution
or a trace (``workload.lengths``) and acceptance rows mixed per request (``workload.mix``).

The workload is replaced by nodes (:func:`wansim.serving.workload.length_nodes` x the mix's rows, with
weights w_i summing to 1); each node is analysed as a scenario of its own (every request with
that node's lengths and acceptance) and the answers are combined:

- per-request means (``tokens_per_s``, ``ttft_ms_mean``, ``queue_ms_mean``,
  ``slo_attainment``): sum w_i x_i;
- per-pass and per-token ratios, weighted by what they count: ``tau`` = E[M] / E[passes],
  ``lap_ms_mean`` over passes, ``bytes_per_token`` over decode tokens,
  ``wasted_token_fraction`` over verified tokens;
- ``throughput_tokens_per_s`` = E[tokens per request] / E[time per request], a node's time per
  request being its tokens / its throughput; ``goodput_requests_per_s`` = attainment x
  requests per second; ``stage_utilization`` weighted by each node's share of the time;
- percentiles (laps over passes, the rest over requests): quantiles of the mixture over nodes of
  normals through each node's p50 and p99 (a point mass where they coincide); the queueing
  delay's p99 likewise through each node's mean and p99. TPOT's percentiles are replaced by the
  engine with those of :mod:`wansim.analytical.decode_tails` (each request's own passes, the
  population's waits), where every node gives its decode parts.

One request at a time on a tcp ring, a node's window costs are its requests' share of one
walk of the nodes' requests in sequence (:func:`wansim.analytical.transport.mixed_request_walk_ms`),
not of like requests only: the windows carry state from one request to the next.

Regime: exact for means of one request at a time whose lengths enter linearly; at concurrency
> 1 each node is a pipe of like requests, while in a real run requests of different lengths
share it. Validated where measured (:func:`wansim.analytical.regime.varied_approximation`:
the approximation-error groups "varied lengths" and "varied-length tails"), with the wider of
the nodes' band and the measured varied-lengths band; TTFT and end-to-end tails keep the
normal-through-two-percentiles guess (no band is measured for them).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.analytical.distribution import mixture_normal_quantiles
from wansim.serving.workload import length_nodes

Z99 = 2.3263478740408408  # the standard normal's 99th percentile


def varies(scenario) -> bool:
    """Whether the requests differ (lengths not fixed, or a mix of acceptance rows)."""
    wl = scenario.workload
    return wl.lengths.kind != "fixed" or bool(wl.mix)


def nodes(scenario) -> list[tuple[float, object]]:
    """(weight, scenario of like requests) for each node (module docstring)."""
    wl = scenario.workload
    w_len, prompt, output = length_nodes(wl)
    rows = [(None, 1.0)] if not wl.mix else [(r.workload, r.share) for r in wl.mix]
    total = sum(share for _, share in rows)
    fixed = dataclasses.replace(wl.lengths, kind="fixed", prompt_cv=0.0, output_cv=0.0)
    out = []
    acc = scenario.drafter.acceptance
    for name, share in rows:
        drafter = scenario.drafter
        if name is not None:
            drafter = dataclasses.replace(
                drafter, acceptance=dataclasses.replace(acc, workload=name)
            )
        for w, p, o in zip(w_len, prompt, output, strict=True):
            node_wl = dataclasses.replace(
                wl,
                prompt_tokens=int(p),
                output_tokens=int(o),
                lengths=fixed,
                trace=None,
                mix=(),
            )
            out.append(
                (
                    float(w) * share / total,
                    dataclasses.replace(scenario, workload=node_wl, drafter=drafter),
                )
            )
    return out


def mean_output_tokens(scenario) -> float:
    """Output tokens per request in expectation: the nodes' weighted mean where requests
    differ, else ``workload.output_tokens``."""
    if not varies(scenario):
        return float(scenario.workload.output_tokens)
    return float(sum(w * node.workload.output_tokens for w, node in nodes(scenario)))


def _mixture_quantiles(weights, p50, p99, qs) -> list[float]:
    sd = np.maximum((np.asarray(p99) - np.asarray(p50)) / Z99, 0.0)
    return [float(x) for x in mixture_normal_quantiles(weights, p50, sd, qs)]


def combine(weighted: list[tuple[float, dict, int]]) -> dict:
    """The combined metrics (module docstring) of (weight, node metrics, node output tokens)."""
    w = np.array([x for x, _, _ in weighted], dtype=float)
    w = w / w.sum()
    ms = [m for _, m, _ in weighted]
    out_tokens = np.array([o for _, _, o in weighted], dtype=float)
    m_dec = out_tokens - 1.0

    def col(name):
        return np.array([float(m[name]) for m in ms])

    tau = col("tau")
    passes = m_dec / tau
    time = out_tokens / col("throughput_tokens_per_s")
    verified = m_dec / np.maximum(1.0 - col("wasted_token_fraction"), 1e-300)
    util = np.array([m["stage_utilization"] for m in ms], dtype=float)
    util = (w * time) @ util / (w @ time)
    attain = float(w @ col("slo_attainment"))
    throughput = float(w @ out_tokens) / float(w @ time)
    out = {
        "tokens_per_s": float(w @ col("tokens_per_s")),
        "throughput_tokens_per_s": throughput,
        "tau": float(w @ m_dec) / float(w @ passes),
        "lap_ms_mean": float((w * passes) @ col("lap_ms_mean")) / float(w @ passes),
    }
    wp = w * passes / float(w @ passes)
    out["lap_ms_p50"], out["lap_ms_p99"] = _mixture_quantiles(
        wp, col("lap_ms_p50"), col("lap_ms_p99"), [0.5, 0.99]
    )
    for name in ("tpot_ms", "ttft_ms", "e2e_ms"):
        out[f"{name}_p50"], out[f"{name}_p99"] = _mixture_quantiles(
            w, col(f"{name}_p50"), col(f"{name}_p99"), [0.5, 0.99]
        )
    out["ttft_ms_mean"] = float(w @ col("ttft_ms_mean"))
    out["queue_ms_mean"] = float(w @ col("queue_ms_mean"))
    queue_p99 = col("queue_ms_p99")
    out["queue_ms_p99"] = (
        _mixture_quantiles(
            w, col("queue_ms_mean"), np.maximum(queue_p99, col("queue_ms_mean")), [0.99]
        )[0]
        if np.any(queue_p99 > 0)
        else 0.0
    )
    out["slo_attainment"] = attain
    out["goodput_requests_per_s"] = attain * throughput / float(w @ out_tokens)
    out["bubble_fraction"] = 1.0 - float(np.mean(util))
    out["stage_utilization"] = [float(u) for u in util]
    out["bytes_per_token"] = float((w * m_dec) @ col("bytes_per_token")) / float(w @ m_dec)
    out["wasted_token_fraction"] = 1.0 - float(w @ m_dec) / float(w @ verified)
    out["target_exact"] = all(bool(m["target_exact"]) for m in ms)
    return {k: out[k] for k in ms[0] if k in out}
