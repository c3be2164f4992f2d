"""The makespan of a finite run of requests that differ in length: R requests through N slots
(closed loop, no batching), each slot taking the next request the moment
its own finishes (greedy list scheduling, requests in order).

Model and assumptions:

- A request's duration at full load is D (ms): its node's loaded TTFT plus its output tokens at
  the loaded TPOT of its prompt's difficulty (the slowest request is often a hard prompt, not
  only a long one). All N slots stay busy until the last request starts, at t*; what is left
  then drains.
- Work conservation until t* is exact: N t* = (work of requests 1..R-1) - (what the other
  N - 1 slots still hold at t*), so E[t*] = ((R - 1) E[D] - (N - 1) E[Y]) / N with Y a busy
  slot's residual.
- For requests drawn independently (``lengths.kind`` lognormal or empirical) the residuals at
  t* are taken as independent draws of the equilibrium excess distribution of D (density
  (1 - F(y)) / E[D], E[Y] = E[D^2] / 2 E[D]: a renewal process seen at a random time), the last
  request's D fresh (for trace rows in order, ``kind: trace``, the last row's). With R <= N
  every request starts at 0 and the R durations drain whole; with more, the run is never taken
  shorter than that (between one and two rounds the residuals are still the first requests',
  not yet in equilibrium: within 5% of a brute-force list schedule there, 1.5% beyond).
- The drain: the N amounts left at t* (loaded ms), sorted a_(1) <= ... <= a_(N), are served at
  a speed that grows as the slots empty: with n requests left each runs u(n) times as fast as at
  full load, so the drain takes sum_k (a_(k) - a_(k-1)) / u(N - k + 1) (the expectation over
  the order statistics' spacings). u(n) = D_N / D_n with D_n the mean duration at n in service,
  taken linear in n between one request alone (D_1) and the full load (D_N).

The loaded TTFT and TPOT are each node's own (:mod:`wansim.analytical.mixture`: a pipe of like
requests), so a short request does not wait behind another's long prefill here: with many
users and long prompts the durations, and so the makespan, come out short (32 users on 4
stages, the shipped trace's rows drawn: E[D] -9%, throughput +15% against 10 DES seeds, where
the mixture's E[tokens] / E[time] alone said +36%). Like requests keep the makespan of their
own model (:mod:`wansim.analytical.concurrent`: the passes' spread).
"""

from __future__ import annotations

import numpy as np

GRID = 2048  # points of the integration grid for the order statistics' means


def drain_speedup(slots: int, alone_ms: float, loaded_ms: float) -> np.ndarray:
    """u(n) for n = 1..``slots`` (index n - 1): the loaded duration over the duration at n in
    service, the latter linear in n from ``alone_ms`` (n = 1) to ``loaded_ms`` (n = slots)."""
    n = np.arange(1, slots + 1, dtype=float)
    if slots == 1:
        return np.ones(1)
    at_n = alone_ms + (loaded_ms - alone_ms) * (n - 1.0) / (slots - 1.0)
    return loaded_ms / np.maximum(at_n, 1e-12)


def _drain_ms(mean_order_stats: np.ndarray, speedup: np.ndarray) -> float:
    """sum_k (a_(k) - a_(k-1)) / u(n_k), n_k = N - k + 1 requests left during the k-th gap."""
    a = np.concatenate([[0.0], np.asarray(mean_order_stats, dtype=float)])
    gaps = np.diff(a)
    left = len(gaps) - np.arange(len(gaps))  # N, N - 1, ..., 1
    return float((gaps / speedup[left - 1]).sum())


def _binomial_at_least(n: int, p: np.ndarray) -> np.ndarray:
    """P(Bin(n, p) >= j) for j = 0..n+1, each p (rows: p, columns: j); by logs (no scipy)."""
    p = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    j = np.arange(n + 1, dtype=float)
    log_comb = np.concatenate([[0.0], np.cumsum(np.log((n - j[1:] + 1.0) / j[1:]))])
    with np.errstate(divide="ignore", invalid="ignore"):
        lp = np.where(p > 0, np.log(np.maximum(p, 1e-300)), -np.inf)
        lq = np.where(p < 1, np.log(np.maximum(1.0 - p, 1e-300)), -np.inf)
        log_pmf = log_comb + j * lp[:, None] + (n - j) * lq[:, None]
        log_pmf = np.where((j == 0) & (p[:, None] == 0.0), 0.0, log_pmf)
        log_pmf = np.where((j == n) & (p[:, None] == 1.0), 0.0, log_pmf)
    pmf = np.exp(log_pmf)
    tail = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]  # P(>= j), j = 0..n
    return np.concatenate([tail, np.zeros((len(p), 1))], axis=1)


def _excess_cdf(x: np.ndarray, values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """G(x) = (1 / E[D]) int_0^x P(D > u) du for a discrete D (``values``, ``weights``)."""
    mean = float(weights @ values)
    # int_0^x P(D > u) du = E[min(D, x)]
    return (np.minimum(values[None, :], x[:, None]) @ weights) / max(mean, 1e-300)


def iid_makespan_ms(
    values_ms,
    weights,
    slots: int,
    requests: int,
    speedup: np.ndarray | None = None,
    last_weights=None,
) -> float:
    """E[makespan] of ``requests`` independent durations (a discrete distribution: ``values_ms``
    with ``weights``) through ``slots`` slots (module docstring); ``last_weights`` (optional)
    the last request's own distribution over the same values."""
    v = np.asarray(values_ms, dtype=float)
    w = np.asarray(weights, dtype=float)
    w = w / w.sum()
    n = int(min(slots, requests))
    u = np.ones(n) if speedup is None else np.asarray(speedup, dtype=float)[:n]
    if n <= 1:
        return float(requests * (w @ v))
    # midpoints of a grid holding every value: F is constant on each piece (exact), G linear
    edges = np.union1d(np.linspace(0.0, float(v.max()), GRID), v)
    x, width = (edges[:-1] + edges[1:]) / 2.0, np.diff(edges)
    cdf = (v[None, :] <= x[:, None]) @ w
    # every request starts at 0 (R <= N): order statistics of n draws of D
    at_least = _binomial_at_least(n, cdf)  # P(>= j of the n are <= x)
    one_round = _drain_ms(width @ (1.0 - at_least[:, 1 : n + 1]), u)
    if requests <= slots:
        return one_round
    wl = w if last_weights is None else np.asarray(last_weights, dtype=float)
    wl = wl / wl.sum()
    last_cdf = (v[None, :] <= x[:, None]) @ wl
    mean = float(w @ v)
    excess_mean = float(w @ v**2) / (2.0 * mean)
    start_last = max(((requests - 1) * mean - (n - 1) * excess_mean) / n, 0.0)
    g = _excess_cdf(x, v, w)
    at_least = _binomial_at_least(n - 1, g)  # among the N - 1 residuals
    # P(at least k of {D, Y_1..Y_{N-1}} <= x) = F P(>= k-1 Y) + (1 - F) P(>= k Y)
    k = np.arange(1, n + 1)
    both = last_cdf[:, None] * at_least[:, k - 1] + (1.0 - last_cdf[:, None]) * at_least[:, k]
    order = width @ (1.0 - both)
    # more requests never shorten a run: the equilibrium guess is held to N requests' exact
    # makespan where it falls below it (between one and two rounds)
    return max(start_last + _drain_ms(order, u), one_round)


def varied_run_metrics(scenario, parts: list, metrics: dict) -> dict:
    """The run's throughput (and what follows from it: goodput in requests, utilisation,
    bubbles) with its makespan from list scheduling (module docstring) for a closed run of
    requests that differ; ``parts`` are (weight, node scenario, node result) as in
    :func:`wansim.analytical.mixture.nodes`. A request's duration is its node's loaded TTFT
    plus its output tokens at its difficulty's loaded TPOT (the node's decode parts: the
    slowest request is often a hard prompt, not only a long one); a trace row keeps its own
    output length within its node. ``kind: trace`` takes its last request from the last
    row. One slot, open arrivals, batches (continuous or micro-batches) and a KV admission
    queue keep the mixture's answer (measured with continuous batching, the list schedule
    moved the approximation-error table's and the agreement hunt's points both ways, up to
    -40%: not adopted there)."""
    from wansim.serving.workload import trace_rows

    wl = scenario.workload
    slots, requests = int(wl.concurrency), int(wl.requests)
    sched = scenario.schedule
    plain = sched.batching == "none" and (sched.micro_batches or 1) == 1
    if slots <= 1 or wl.arrival != "closed" or not plain or wl.kv_capacity_tokens is not None:
        return metrics
    w = np.array([x for x, _, _ in parts], dtype=float)
    w = w / w.sum()
    out = np.array([node.workload.output_tokens for _, node, _ in parts], dtype=float)
    if wl.lengths.kind in ("trace", "empirical"):  # each row at its own output length
        cell, _, row_out = trace_rows(wl)
        cells = int(cell.max()) + 1
        mix = len(parts) // cells  # nodes: mix rows x cells (mixture.nodes)
        share = w.reshape(mix, cells).sum(axis=1)
        node = (np.arange(mix)[:, None] * cells + cell[None, :]).ravel()
        row_w = np.repeat(share / len(cell), len(cell))
        tokens = np.tile(row_out, mix)
        last = np.tile(np.arange(len(cell)) == len(cell) - 1, mix)
    else:
        node, row_w, tokens, last = np.arange(len(parts)), w, out, np.ones(len(parts), bool)
    speeds = [_tpot_by_difficulty(r) for _, _, r in parts]
    values, alone, weights, is_last = [], [], [], []
    for i in range(len(node)):
        ttft = parts[node[i]][2].metrics["ttft_ms_mean"]
        dw, loaded_tpot, alone_tpot = speeds[node[i]]
        values.append(ttft + (tokens[i] - 1.0) * loaded_tpot)
        alone.append(ttft + (tokens[i] - 1.0) * alone_tpot)
        weights.append(row_w[i] * dw)
        is_last.append(np.full(len(dw), last[i]))
    values, alone = np.concatenate(values), np.concatenate(alone)
    weights, is_last = np.concatenate(weights), np.concatenate(is_last)
    n = min(slots, requests)
    speedup = drain_speedup(n, float(weights @ alone), float(weights @ values))
    last_weights = weights * is_last if wl.lengths.kind == "trace" else None
    makespan = iid_makespan_ms(values, weights, slots, requests, speedup, last_weights)
    mean_tokens = float(row_w @ tokens) / float(row_w.sum())
    throughput = 1e3 * requests * mean_tokens / makespan
    scale = throughput / metrics["throughput_tokens_per_s"]
    util = [min(u * scale, 1.0) for u in metrics["stage_utilization"]]
    return {
        **metrics,
        "throughput_tokens_per_s": throughput,
        "goodput_requests_per_s": metrics["goodput_requests_per_s"] * scale,
        "stage_utilization": util,
        "bubble_fraction": 1.0 - float(np.mean(util)),
    }


def _tpot_by_difficulty(result) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, loaded mean TPOT ms, mean TPOT ms alone) per difficulty node of a node's
    requests (its decode parts, :mod:`wansim.analytical.decode_tails`; one node at 1 / its
    tokens/s where the model gives none)."""
    parts = result.details.get("decode")
    if parts is None:
        tpot = 1e3 / result.metrics["tokens_per_s"]
        return np.ones(1), np.array([tpot]), np.array([tpot])
    dw = np.asarray(parts.weights, dtype=float)
    loaded, _ = parts.loaded(parts.lap_ms, parts.wait_var_ms2)
    return dw / dw.sum(), np.asarray(loaded, dtype=float), np.asarray(parts.tpot_ms, dtype=float)
