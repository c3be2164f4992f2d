"""``analyze(scenario)``: every metric with a closed form, for one scenario (what it answers,
point by point or refused: :mod:`wansim.analytical.coverage`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from wansim.analytical import batched as batching
from wansim.analytical.answer import Answer, Percentiles
from wansim.analytical.async_batched import async_batched
from wansim.analytical.batched import batched, batched_metrics
from wansim.analytical.blocks import block_schedule, block_schedule_metrics
from wansim.analytical.concurrent import WAIT_PARTS, concurrent_metrics
from wansim.analytical.coverage import check_grid, check_supported, concurrent, point_field
from wansim.analytical.decode_tails import (
    DecodeParts,
    loaded_tpot_quantiles,
    population_tpot_quantiles,
)
from wansim.analytical.distribution import (
    lap_distribution,
    mean_var,
    mixture_normal_quantiles,
    quantiles,
    shifted_mixture,
    waits_variance,
    with_waits,
)
from wansim.analytical.faults import fault_run, fault_run_mixed, without_faults
from wansim.analytical.finite_run import varied_run_metrics
from wansim.analytical.hybrid import analyze_hybrid
from wansim.analytical.idle_cost import analyze_idle_cost
from wansim.analytical.idle_cost import fixed_point as idle_fixed_point
from wansim.analytical.micro_batched import micro_batched_metrics, micro_batched_run
from wansim.analytical.mixture import combine, nodes, varies
from wansim.analytical.nonstationary import analyze_pieces, stationary_at
from wansim.analytical.open_arrivals import analyze_open
from wansim.analytical.regime import (
    approximation,
    unvalidated,
    varied_approximation,
)
from wansim.analytical.serving import serving_metrics
from wansim.analytical.shared_host import analyze_shared_host, contended, scaled
from wansim.analytical.sync import (
    lap_constant,
    lap_parts,
    passes_per_node,
    ring_message_bytes,
    sync_metrics,
)
from wansim.analytical.sync import stage_busy_ms as sync_stage_busy_ms
from wansim.analytical.transport import (
    batch_runs_apart,
    batch_structures,
    messages_in_flight,
    mixed_request_walk_ms,
    prefill_extra_ms,
    prompt_window_ms,
    requests_apart,
    tcp_equivalent,
    walk_misses_windows,
    window_extremes,
)
from wansim.config.scenario import Scenario
from wansim.errors import ScenarioError
from wansim.links.nonstationary import network_modulation
from wansim.results.metric_names import stage_utilization
from wansim.results.result import Result
from wansim.serving.micro_batching import micro_batched
from wansim.serving.workload import trace_rows
from wansim.speculation.block_schedule import flushes, uses_blocks
from wansim.speculation.hybrid_rounds import (
    async_scenario,
    confident_fraction,
    is_hybrid,
    tree_scenario,
)
from wansim.stages import idle_cost


def mean_metrics(scenario: Scenario) -> dict[str, np.ndarray]:
    """Mean metrics (arrays; fields may be arrays) by the model that covers the scenario."""
    check_grid(scenario)
    point = point_field(scenario)
    if point is not None:  # (evaluate_grid answers these one point at a time)
        field, value = point
        raise ScenarioError(
            field,
            "is answered one point at a time (analytical.grid.evaluate_grid, wansim run), not"
            " by the vectorised closed forms",
            value,
        )
    blocks = uses_blocks(scenario)
    out = block_schedule_metrics(scenario) if blocks else sync_metrics(scenario)
    if micro_batched(scenario):
        return micro_batched_metrics(scenario, lap_parts(scenario))
    if batched(scenario):
        out = batched_metrics(scenario, out, lap_parts(scenario))
    if concurrent(scenario):
        out = concurrent_metrics(scenario, out, lap_parts(scenario), blocks)
    return out


def point_means(scenario: Scenario) -> dict[str, float]:
    """:data:`GRID_KEYS` of one scalar scenario by the model :func:`analyze` uses (the TCP
    fixed point and the prefill's own window, the KV admission and its queue, the shared
    host's stretch, the faults' expected value: tokens/s, throughput, TTFT and the stages'
    idling through the outages); the other keys are those of the run the model answers on
    (the ideal-transport equivalent, the run without faults). A metric the faults leave
    undefined (failures outpacing recovery) is NaN."""
    if batch_runs_apart(scenario):  # tcp: the batch's groups drift apart (transport.py)
        check_supported(scenario)
        return point_means(requests_apart(scenario))
    if idle_cost.in_scenario(scenario):  # the run at the fixed point's extras (idle_cost.py)
        return point_means(idle_fixed_point(scenario, analyze)[0])
    if contended(scenario):  # the run at the fixed point's stretch (shared_host.py)
        stretch = analyze(scenario).details["shared_host"]["stage_stretch"]
        return point_means(scaled(scenario, stretch))
    answer, used, _, queued = _stationary_answer(scenario)
    metrics = _metrics(answer)  # (the bubble from the utilisation, as analyze reports it)
    means = {k: float(np.asarray(metrics.get(k, answer.means[k]))) for k in GRID_KEYS}
    if scenario.faults.events:  # on the scenario analyze takes them on (tcp: its equivalent)
        on = scenario if queued else used
        merged, _ = _with_faults(on, answer, metrics, dict(answer.details))
        for key in ("tokens_per_s", "throughput_tokens_per_s", "ttft_ms_mean", "bubble_fraction"):
            value = merged[key]
            means[key] = float("nan") if value is None else float(value)
    return means


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


def _scalars(raw: dict) -> dict[str, float]:
    return {k: float(np.asarray(v)) for k, v in raw.items() if np.ndim(v) == 0}


def analyze(scenario: Scenario) -> Result:
    """Every metric of one scenario, by the model that covers it (:func:`check_supported`),
    with the approximation it was answered by (:mod:`wansim.analytical.regime`); a tcp ring
    whose windows the walk does not follow (several frames a lap, a lossy batch) also carries
    the answers with every window closed and open (``approximation["range"]``,
    :func:`wansim.analytical.transport.window_extremes`)."""
    if batch_runs_apart(scenario):
        return _batch_apart(scenario)
    result = _analyzed(scenario)
    if walk_misses_windows(scenario):
        result = _with_window_range(scenario, result)
    return result


def _batch_apart(scenario: Scenario) -> Result:
    """Continuous batching without micro-batches on a tcp ring: the answer of its requests
    apart (:func:`wansim.analytical.transport.requests_apart`); with several users in flight
    ``validated: false`` and a range over the structures the batch can take, the requests
    apart and its groups (:func:`wansim.analytical.transport.batch_structures`), each with
    every window closed and open (module docstring of :mod:`wansim.analytical.transport`). One user: the batch is the lone request (the same
    run), answered as such."""
    check_supported(scenario)
    apart = analyze(requests_apart(scenario))
    trust = dict(apart.approximation or {})
    if np.all(np.asarray(apart.scenario.workload.concurrency) <= 1):
        trust["regime"] = f"{trust.get('regime', '')} (continuous batching of one user)"
        return Result.analytical(scenario, apart.metrics, apart.details, trust)
    grouped = [
        _analyzed(extreme).metrics
        for structure in batch_structures(scenario)
        for extreme in window_extremes(structure)
    ]
    span = {}
    for key in WINDOW_RANGE_METRICS:
        values = list(trust.get("range", {}).get(key, [apart.metrics[key]]))
        values += [float(np.asarray(a[key])) for a in grouped]
        if all(np.isfinite(values)):
            span[key] = [min(values), max(values)]
    trust = unvalidated(
        trust,
        "continuous batching on tcp as requests apart",
        "tcp with continuous batching without schedule.micro_batches: the batch's groups drift"
        " apart (a request's frame opens its window sooner than the whole batch's), answered"
        " as the requests without batching; the range spans them and the batch as one group or"
        " as 2, 4, ... micro-batches, every window closed and open (wansim/analytical/transport.py; tests/physics/"
        "test_tcp_batch_apart.py), not on the approximation-error grid",
    )
    trust["range"] = span
    return Result.analytical(scenario, apart.metrics, apart.details, trust)


def _analyzed(scenario: Scenario) -> Result:
    """:func:`analyze` without the window range (the models' own recursion)."""
    check_supported(scenario)
    if idle_cost.in_scenario(scenario):  # a fixed point of the stages' idles (idle_cost.py)
        return analyze_idle_cost(scenario, _analyzed)
    modulated = network_modulation(scenario.network) is not None
    if modulated and scenario.workload.arrival != "closed":  # pieces of open-arrival queues
        return analyze_pieces(scenario, _analyzed)
    if scenario.workload.arrival != "closed":  # the flow-equivalent server (open_arrivals.py)
        return analyze_open(scenario, _analyzed)
    if contended(scenario):  # computes share the host's cores (wansim.analytical.shared_host)
        return analyze_shared_host(scenario, _analyzed)
    if network_modulation(scenario.network) is not None:  # drift, trace: quasi-static pieces
        if scenario.faults.events:
            return _pieces_with_faults(scenario)
        return analyze_pieces(scenario, _analyzed)
    if varies(scenario):
        if scenario.faults.events:
            return _nodes_with_faults(scenario)
        return _over_nodes(scenario)
    if is_hybrid(scenario):  # two schedules mixed per round (wansim.analytical.hybrid)
        if scenario.faults.events:
            return _hybrid_with_faults(scenario)
        return analyze_hybrid(scenario, _analyzed)
    return _analyze_stationary(scenario)


WINDOW_RANGE_METRICS = ("tokens_per_s", "throughput_tokens_per_s", "lap_ms_mean")


def _with_window_range(scenario: Scenario, result: Result) -> Result:
    """``result`` with ``approximation["range"]``: per metric of
    :data:`WINDOW_RANGE_METRICS`, [low, high] over the answers with every window closed and
    every window open (:func:`wansim.analytical.transport.window_extremes`)."""
    answers = [_analyzed(extreme).metrics for extreme in window_extremes(scenario)]
    span = {}
    for key in WINDOW_RANGE_METRICS:
        values = [float(np.asarray(a[key])) for a in answers]
        if all(np.isfinite(values)):
            span[key] = [min(values), max(values)]
    trust = {**result.approximation, "range": span}
    return dataclasses.replace(result, approximation=trust)


def _analyze_stationary(scenario: Scenario, walked=None) -> Result:
    """:func:`analyze`'s answer for like requests on stationary links (faults in expected
    value on top); ``walked``: a tcp ring's walk of its requests among others
    (:func:`wansim.analytical.transport.mixed_request_walk_ms`)."""
    requested = scenario
    answer, scenario, judged, queued = _stationary_answer(scenario, walked)
    metrics, details = _metrics(answer), {**answer.details, "decode": answer.decode}
    metrics.update(serving_metrics(scenario, answer.means))
    trust = approximation(judged).to_json()
    if queued:
        trust["regime"] += " + KV admission queue"
        scenario = requested
    if scenario.faults.events:
        metrics, details = _with_faults(scenario, answer, metrics, details)
        per_request = details["faults"].get("failures_per_request", 0.0)
        if details["undefined"]:
            trust = {**trust, "validated": False, "why": next(iter(details["undefined"].values()))}
        elif micro_batched(scenario):
            trust = _faults_trust(
                trust,
                {},
                "faults with micro-batches: the re-prefills as a cold wave of chunk passes on"
                " the micro-batched run (checked against the DES in tests/physics/"
                "test_faults_micro_batched.py, not on the approximation-error grid)",
            )
        elif trust["validated"] and per_request > RARE_FAILURES_PER_REQUEST:
            trust = {
                **trust,
                "validated": False,
                "why": f"failures not rare against a request ({per_request:.2g} per request; the"
                f" grid measured up to {RARE_FAILURES_PER_REQUEST:g}): the model takes the lost"
                " work and re-prefills of each as independent of the others (600 failures an"
                " hour on 45 s requests: -10% on tokens/s)",
            }
    return Result.analytical(scenario, metrics, details, trust)


def _stationary_answer(requested: Scenario, walked=None) -> tuple[Answer, Scenario, Scenario, bool]:
    """The answer for like requests on stationary links (no faults counted yet): (answer, the
    scenario it was computed on -- KV-admitted, tcp as its ideal equivalent --, the scenario
    the regime is judged on, whether a KV admission queue was added)."""
    scenario = kv_admitted(requested)
    judged = scenario  # the regime is judged on the transport asked for
    alone = _one_frame_a_lap(scenario)
    if scenario.network.transport == "tcp" and alone:
        # the sync lap under the window, then the ideal closed forms (transport.py)
        scenario = tcp_equivalent(
            scenario, lambda sc: sync_metrics(sc)["lap_ms_mean"], walked=walked
        )
    elif scenario.network.transport == "tcp":  # the full ideal model's lap, loaded trains
        scenario = tcp_equivalent(
            scenario,
            lambda sc: analyze(sc).metrics["lap_ms_mean"],
            messages_in_flight(scenario),
        )
    parts = lap_parts(scenario)
    answer = _one_request(scenario, parts)
    if judged.network.transport == "tcp" and alone:  # the prefill's own window (transport.py)
        answer = _tcp_prefill(
            answer, prefill_extra_ms(judged, scenario, answer.means["lap_ms_mean"], walked)
        )
    if micro_batched(scenario):
        answer = _micro_batched(scenario, parts, answer)
        if judged.network.transport == "tcp" and messages_in_flight(judged) <= 1:
            # one micro-batch: a prompt's pass under the window (transport.py)
            answer = _tcp_prompt_window(answer, prompt_window_ms(judged))
    elif batched(scenario) and uses_blocks(scenario):
        answer = async_batched(scenario, parts, answer)
    elif batched(scenario):
        answer = _batched(scenario, parts, answer)
    elif concurrent(scenario):
        answer = _concurrent(scenario, parts, answer)
    queued = scenario.workload.concurrency < requested.workload.concurrency
    if queued:
        answer = _kv_queue(
            answer,
            requested.workload.concurrency,
            scenario.workload.concurrency,
            scenario.workload.output_tokens - 1,
        )
    return answer, scenario, judged, queued


def _nodes_with_faults(scenario: Scenario) -> Result:
    """Faults with requests that differ (length distributions, mixes): the run without faults
    as the expectation over the workload's nodes (:mod:`wansim.analytical.mixture`), then the
    faults' expected value over the nodes' kinds of request
    (:func:`wansim.analytical.faults.fault_run_mixed`: a failure finds a kind in proportion to
    its ring time). Each node's means are its own model's (one request, or the loaded ring at
    the scenario's concurrency, a pipe of like requests; with the per-round hybrid, its mixed
    request: :func:`_hybrid_fault_means`)."""
    calm = without_faults(scenario)
    averaged = _over_nodes(calm)
    kinds = []
    for w, node in nodes(scenario):
        if is_hybrid(node):
            kinds.append((w, node, _hybrid_fault_means(node)[1]))
            continue
        answer, used, _, queued = _stationary_answer(node)
        kinds.append((w, node if queued else used, _fault_means(used, answer.means)))
    fa = fault_run_mixed(scenario, kinds, in_flight(scenario))
    calm_details = {k: v for k, v in averaged.details.items() if k != "steady_throughput"}
    metrics, details = _merged_faults(dict(averaged.metrics), calm_details, fa)
    trust = _faults_trust(
        averaged.approximation,
        details["undefined"],
        "faults with requests that differ: the faults' expected value over the workload's"
        " kinds of request (checked against the DES in tests/physics/test_faults_varied.py,"
        " not on the approximation-error grid)",
    )
    return Result.analytical(scenario, metrics, details, trust)


def _faults_trust(calm: dict | None, undefined: dict, why: str) -> dict:
    """The approximation of a run with faults answered on a calm run's model: not validated,
    the unvalidated band, and why (a metric the faults leave undefined, else ``why``)."""
    return unvalidated(calm, "faults", next(iter(undefined.values())) if undefined else why)


def _hybrid_with_faults(scenario: Scenario) -> Result:
    """Faults with the per-round hybrid: the run without faults by the hybrid's mix
    (:mod:`wansim.analytical.hybrid`), then the faults' expected value
    (:mod:`wansim.analytical.faults`) on the mixed request (:func:`_hybrid_fault_means`)."""
    res, means = _hybrid_fault_means(scenario)
    fa = fault_run(scenario, means, in_flight(scenario))
    metrics, details = _merged_faults(dict(res.metrics), dict(res.details), fa)
    trust = _faults_trust(
        res.approximation,
        details["undefined"],
        "faults with the per-round hybrid: the faults' expected value on the two schedules'"
        " laps mixed per round (checked against the DES in tests/physics/"
        "test_faults_hybrid.py, not on the approximation-error grid)",
    )
    return Result.analytical(scenario, metrics, details, trust)


def _hybrid_fault_means(scenario: Scenario) -> tuple[Result, dict]:
    """(the hybrid's run without faults, its mixed request's means for the fault model): its
    passes, lap and TTFT; the laps' variance mixed over the passes of each kind of round, the
    passes' coefficient of variation over their decode time; a failover's restart lap is the
    block schedule's first lap when the round after the re-prefill is confident (probability
    p, the confident fraction), a tree round's lap otherwise; the lap a failure interrupts has
    the residual of the round it falls in (in proportion to the decode time each kind takes)."""
    calm = without_faults(scenario)
    res = analyze_hybrid(calm, analyze)
    kinds = []
    for part in (async_scenario(calm), tree_scenario(calm)):
        answer, used, _, _ = _stationary_answer(part)
        kinds.append(_fault_means(used, answer.means))
    chain, tree = kinds
    time_a = float(res.details["confident_decode_share"])
    pass_a = float(res.details["confident_pass_share"])
    p = float(confident_fraction(scenario))
    lap = float(res.metrics["lap_ms_mean"])
    passes = float(res.details["passes_per_request"])
    second = [k["lap_ms_var"] + k["lap_ms_mean"] ** 2 for k in kinds]
    cv2 = [k["passes_var"] / max(k["passes_per_request"], 1e-300) ** 2 for k in kinds]
    lap_t = tree["lap_ms_mean"]
    means = {
        "prefill_ms": chain["prefill_ms"],
        "ttft_ms_mean": res.metrics["ttft_ms_mean"],
        "tokens_per_s": res.metrics["tokens_per_s"],
        "passes_per_request": passes,
        "lap_ms_mean": lap,
        "lap_ms_var": max(pass_a * second[0] + (1.0 - pass_a) * second[1] - lap**2, 0.0),
        "passes_var": passes**2 * (time_a * cv2[0] + (1.0 - time_a) * cv2[1]),
        "first_lap_ms": p * chain["first_lap_ms"] + (1.0 - p) * lap_t,
        "lap_residual_ms": time_a * chain["lap_residual_ms"]
        + (1.0 - time_a) * second[1] / (2.0 * max(lap_t, 1e-300)),
    }
    return res, means


def _pieces_with_faults(scenario: Scenario) -> Result:
    """Faults on time-varying links: the run without faults over its quasi-static pieces
    (:mod:`wansim.analytical.nonstationary`), then the faults' expected value
    (:mod:`wansim.analytical.faults`) on the run-averaged ring: its mean lap, TTFT and rate,
    the passes and their variances of the links at the start. Assumes the faults' cost does not
    depend on the piece they fall in (their re-prefills are taken on the starting links). With
    requests that differ, each kind's means at the start are moved by the ratios the run-averaged
    ring gives the workload's (lap, rate, TTFT), and the faults are taken over the kinds
    (:func:`wansim.analytical.faults.fault_run_mixed`)."""
    calm = without_faults(scenario)
    averaged = analyze_pieces(calm, analyze)
    static = kv_admitted(stationary_at(scenario, 1.0, 1.0))
    m = averaged.metrics
    if not varies(static):
        answer = _one_request(static, lap_parts(static))
        means = {
            **answer.means,
            "lap_ms_mean": m["lap_ms_mean"],
            "tokens_per_s": m["tokens_per_s"],
            "ttft_ms_mean": m["ttft_ms_mean"],
            "prefill_ms": answer.means["prefill_ms"]
            * m["ttft_ms_mean"]
            / answer.means["ttft_ms_mean"],
        }
        if micro_batched(static):  # the run-averaged ring's makespan (faults.fault_run_mixed)
            wl = static.workload
            means["makespan_ms"] = (
                1e3 * wl.requests * wl.output_tokens / m["throughput_tokens_per_s"]
            )
        kinds = [(1.0, static, _fault_means(static, means))]
    else:  # each kind's means moved as the run-averaged ring moves the workload's
        calm_static = dataclasses.replace(static, faults=calm.faults)
        at_start = _over_nodes(calm_static).metrics
        ratio = {k: m[k] / at_start[k] for k in ("lap_ms_mean", "tokens_per_s", "ttft_ms_mean")}
        kinds = []
        for w, node in nodes(static):
            answer, used, _, queued = _stationary_answer(node)
            means = dict(answer.means)
            for key in ratio:
                means[key] *= ratio[key]
            means["prefill_ms"] *= ratio["ttft_ms_mean"]
            kinds.append((w, node if queued else used, _fault_means(used, means)))
    fa = fault_run_mixed(static, kinds, in_flight(static))
    metrics, details = _merged_faults(dict(m), dict(averaged.details), fa)
    trust = unvalidated(
        averaged.approximation,
        "faults",
        "faults on time-varying links: the faults' expected value on the run-averaged ring"
        " (checked against the DES in tests/physics/test_faults_loaded.py, not on the"
        " approximation-error grid)",
    )
    return Result.analytical(scenario, metrics, details, trust)


def kv_admitted(scenario: Scenario) -> Scenario:
    """The scenario at the concurrency the KV capacity admits: floor(kv_capacity_tokens /
    (prompt + output)) like requests (each reserves its whole context), when that is fewer
    than ``workload.concurrency`` (and the requests); else the scenario itself."""
    wl = scenario.workload
    if wl.kv_capacity_tokens is None:
        return scenario
    slots = wl.kv_capacity_tokens // (wl.prompt_tokens + wl.output_tokens)
    if slots >= min(wl.concurrency, wl.requests):
        return scenario
    admitted = dataclasses.replace(wl, concurrency=max(int(slots), 1), kv_capacity_tokens=None)
    return dataclasses.replace(scenario, workload=admitted)


def _tcp_prefill(answer: Answer, extra_ms: float) -> Answer:
    """One request at a time, its prefill ``extra_ms`` longer: TTFT, the request's duration
    (throughput) and the stages' utilisation over it."""
    m = dict(answer.means)
    before = m["prefill_ms"] + m["passes_per_request"] * m["lap_ms_mean"]
    m["ttft_ms_mean"] = m["ttft_ms_mean"] + extra_ms
    m["prefill_ms"] = m["prefill_ms"] + extra_ms
    m["throughput_tokens_per_s"] = m["throughput_tokens_per_s"] * before / (before + extra_ms)
    util = [u * before / (before + extra_ms) for u in answer.utilization]
    return dataclasses.replace(answer, means=m, utilization=util)


def _tcp_prompt_window(answer: Answer, extra_ms: float) -> Answer:
    """One micro-batch on a tcp ring: each request's TTFT ``extra_ms`` longer (its prompt's
    passes under the window); the other members' laps through those passes are not charged
    (the DES's tokens/s within 3% without them, tests/physics/test_tcp_loaded.py)."""
    m = dict(answer.means)
    m["ttft_ms_mean"] = m["ttft_ms_mean"] + extra_ms
    return dataclasses.replace(answer, means=m)


def _kv_queue(answer: Answer, users: int, slots: int, decode_tokens: int) -> Answer:
    """``users`` closed-loop users sharing the ``slots`` the KV cache admits: each waits in the
    admission queue, then resides T (TTFT + decode). With users > slots the queue never
    empties in steady state, so the slots stay busy and Little's law over them gives the
    request rate X = slots / T; over the users' cycle (users = X (W + T)) the mean wait is
    W = users / X - T = (users / slots - 1) T, added to TTFT. (The run's throughput, which
    counts the cold start and the drain in its makespan, would understate X in short runs:
    +22% on TTFT at 4 requests per user.) Its spread is not modelled: the queue's p99 is taken
    as W (the wait sums the services of about (users - slots) / slots requests ahead)."""
    m = dict(answer.means)
    residence = m["ttft_ms_mean"] + m["tpot_ms_mean"] * decode_tokens
    wait = max((users / slots - 1.0) * residence, 0.0)
    m["ttft_ms_mean"] += wait
    m["queue_ms_mean"] = m["queue_ms_p99"] = wait
    details = {**answer.details, "kv_admission": {"users": users, "slots": slots, "wait_ms": wait}}
    return dataclasses.replace(answer, means=m, details=details)


def _over_nodes(scenario: Scenario) -> Result:
    """Requests that differ (lengths, acceptance rows): expectations over nodes
    (:mod:`wansim.analytical.mixture`)."""
    weighted = nodes(scenario)
    walks = _mixed_walks(scenario, weighted)
    if walks is None:
        parts = [(w, node, _analyzed(node)) for w, node in weighted]
    else:  # one request at a time on tcp: each node's windows those its neighbours left
        parts = [
            (w, node, _analyze_stationary(node, k))
            for (w, node), k in zip(weighted, walks, strict=True)
        ]
    metrics = combine([(w, r.metrics, node.workload.output_tokens) for w, node, r in parts])
    # the rate of the slots kept busy (open arrivals' flow-equivalent server reads it), before
    # the finite run's unequal finishes lengthen its makespan
    steady = metrics["throughput_tokens_per_s"]
    metrics = varied_run_metrics(scenario, parts, metrics)
    decode = [(w, r.details.get("decode")) for w, _, r in parts]
    if all(d is not None for _, d in decode):  # own passes, the population's waits
        p50, p99 = population_tpot_quantiles(decode)
        metrics["tpot_ms_p50"], metrics["tpot_ms_p99"] = float(p50), float(p99)
    trust = varied_approximation(
        scenario, [dict(r.approximation or {}) for _, _, r in parts], weighted
    )
    trust = dataclasses.replace(
        trust, regime=f"{trust.regime} + expectation over {len(parts)} workload nodes"
    )
    details = {"approximation": trust.regime, "nodes": len(parts), "steady_throughput": steady}
    return Result.analytical(scenario, metrics, details, trust.to_json())


def _one_frame_a_lap(scenario: Scenario) -> bool:
    """One request's frame a lap: no block schedule, batching or concurrent requests."""
    return not (uses_blocks(scenario) or batched(scenario) or concurrent(scenario))


def _mixed_walks(scenario: Scenario, weighted) -> list | None:
    """Requests that differ, one at a time on a tcp ring (no faults or hybrid rounds): each
    node's costs from one walk of requests of every node
    (:func:`wansim.analytical.transport.mixed_request_walk_ms`); else None (each node its own
    walk of like requests); a trace's rows are walked in their order."""
    if not (
        scenario.network.transport == "tcp"
        and _one_frame_a_lap(scenario)
        and len(weighted) > 1
        and not scenario.faults.events
        and not is_hybrid(scenario)
    ):
        return None
    wl = scenario.workload
    order = None
    if wl.lengths.kind == "trace" and not wl.mix:  # the trace's rows in order: their nodes
        order = trace_rows(wl)[0]
    return mixed_request_walk_ms(weighted, int(wl.requests), order)


def _with_faults(scenario: Scenario, answer: Answer, metrics: dict, details: dict):
    """The run with its faults in expected value (:mod:`wansim.analytical.faults`)."""
    fa = fault_run(scenario, _fault_means(scenario, answer.means), in_flight(scenario))
    return _merged_faults(metrics, details, fa)


def _fault_means(scenario: Scenario, means: dict) -> dict:
    """A kind of request's means for the fault model: the model's, the variance of its
    number of passes (over the difficulty quadrature), and under the block schedule the lap
    that restarts its chain after a re-prefill (:func:`wansim.analytical.faults.fault_run`)."""
    w, n_mean, n_var = passes_per_node(scenario)
    passes_var = float((w * (n_var + n_mean**2)).sum() - (w * n_mean).sum() ** 2)
    out = {**means, "passes_var": passes_var}
    if uses_blocks(scenario):
        out["first_lap_ms"], out["lap_residual_ms"] = _chain_laps_ms(
            scenario, float(means["lap_ms_mean"])
        )
    return out


def _chain_laps_ms(scenario: Scenario, lap_ms: float) -> tuple[float, float]:
    """The block schedule's laps as a failover sees them: (the first lap after a re-prefill,
    the mean residual of the lap a failure interrupts). The first lap is one block alone
    through the drafting and the whole ring, a sync lap (the blocks model's B = 1 limit); the
    residual E[L^2] / 2 E[L] is over the model's verify-to-verify laps (short spacings inside
    a chain, a long restart after each lost bet: ``lap_atoms``) and the verdicts' jitter.
    With several requests in flight both carry the queueing the loaded ring adds to a lap
    (the loaded lap ``lap_ms`` less the lone request's)."""
    wl = scenario.workload
    calm = dataclasses.replace(scenario.faults, events=())
    lone = dataclasses.replace(
        scenario,
        workload=dataclasses.replace(wl, concurrency=1),
        schedule=dataclasses.replace(scenario.schedule, batching="none"),
        faults=calm,
    )
    one = dataclasses.replace(
        lone,
        schedule=dataclasses.replace(lone.schedule, kind="sync", max_inflight_blocks=1),
        drafter=dataclasses.replace(scenario.drafter, overlap=False),
    )
    sched = block_schedule(lone)
    values, weights = sched.chains.lap_atoms
    lone_lap = float((weights * values).sum())
    queued = max(lap_ms - lone_lap, 0.0) if in_flight(scenario) > 1 else 0.0
    values = values + queued
    jitter_var = float(np.asarray(sched.means["lap_ms_var"]))
    residual = float(((weights * values**2).sum() + jitter_var) / (2.0 * (weights * values).sum()))
    return float(sync_metrics(one)["lap_ms_mean"]) + queued, residual


def _merged_faults(metrics: dict, details: dict, fa) -> tuple[dict, dict]:
    """The metrics and details without faults, with the faults' answer on top (the stages
    idle through the outages)."""
    metrics = {**metrics, **fa.metrics}
    if fa.metrics["availability"] is not None:
        util = [u * fa.metrics["availability"] for u in metrics["stage_utilization"]]
        metrics["stage_utilization"] = util
        metrics["bubble_fraction"] = 1.0 - float(np.mean(util))
    undefined = {**details.get("undefined", {}), **fa.undefined}
    return metrics, {**details, "faults": fa.details, "undefined": undefined}


RARE_FAILURES_PER_REQUEST = 0.35  # the approximation grid's most: 120/h on ~10 s requests


def in_flight(scenario: Scenario) -> int:
    """The requests in the ring at once: one at a time, the concurrency (capped by the
    requests), or the micro-batches' slots."""
    from wansim.serving.micro_batching import serving_slots

    if micro_batched(scenario):
        return int(np.asarray(serving_slots(scenario)))
    return int(min(scenario.workload.concurrency, scenario.workload.requests))


def _metrics(a: Answer) -> dict[str, Any]:
    """The metric dict (the one place it is assembled)."""
    m, p = a.means, a.percentiles
    return {
        "tokens_per_s": m["tokens_per_s"],
        "throughput_tokens_per_s": m["throughput_tokens_per_s"],
        "tau": m["tau"],
        "lap_ms_mean": m["lap_ms_mean"],
        "lap_ms_p50": p.lap_ms_p50,
        "lap_ms_p99": p.lap_ms_p99,
        "tpot_ms_p50": p.tpot_ms_p50,
        "tpot_ms_p99": p.tpot_ms_p99,
        "ttft_ms_mean": m["ttft_ms_mean"],
        "bubble_fraction": 1.0 - float(np.mean(a.utilization)),
        "stage_utilization": a.utilization,
        "bytes_per_token": m["bytes_per_token"],
        "wasted_token_fraction": m["wasted_token_fraction"],
        "target_exact": bool(m["target_exact"]),
    }


def _one_request(scenario: Scenario, parts: dict) -> Answer:
    """One request at a time (the sync closed forms or the block schedule), with the lap
    distribution each gives (for the percentiles of the loaded models too)."""
    m = scenario.workload.output_tokens - 1
    if uses_blocks(scenario):
        sched = block_schedule(scenario)
        means = _scalars(sched.means)
        chains = sched.chains
        values, weights = chains.lap_atoms
        lap_sd = np.sqrt(means["lap_ms_var"])
        lap_p50, lap_p99 = mixture_normal_quantiles(
            weights, values, np.full(len(values), lap_sd), [0.5, 0.99]
        )
        tpot_mean = chains.decode_node_ms[0] / m
        tpot_sd = np.sqrt(chains.decode_node_var[0]) / m
        tpot_p50, tpot_p99 = mixture_normal_quantiles(
            chains.weights[0], tpot_mean, tpot_sd, [0.5, 0.99]
        )
        details = {
            "approximation": "block schedule",
            "passes_per_request": means["passes_per_request"],
            "tokens_per_pass": means["tokens_per_pass"],
            "bet_win_rate": means["bet_win_rate"],
            "stale_blocks_s0_per_request": means["stale_blocks_s0_per_request"],
            "stale_blocks_forwarded_per_request": means["stale_blocks_forwarded_per_request"],
        }
        busy, duration = _block_busy_ms(scenario, means, parts)
        return Answer(
            means,
            Percentiles(float(lap_p50), float(lap_p99), float(tpot_p50), float(tpot_p99)),
            stage_utilization(busy, duration),
            details,
            *_smoothed(values, weights, float(lap_sd)),
            _alone(chains.weights[0], tpot_mean, tpot_sd, means["lap_ms_mean"], m),
        )
    means = _scalars(sync_metrics(scenario))
    # lap distribution: compute and drafting are deterministic, hops carry the randomness
    hops = list(scenario.resolved_hops())
    sizes = ring_message_bytes(scenario, parts)
    constant, stage_terms = lap_constant(scenario, parts)
    values, pmf, grid_ms = lap_distribution(hops, sizes, constant, stage_terms)
    lap_p50, lap_p99 = quantiles(values, pmf, [0.5, 0.99])
    _, lap_var = mean_var(values, pmf)
    # TPOT: mixture over difficulty of normals (renewal CLT for the number of passes)
    w, n_mean, n_var = passes_per_node(scenario)
    lap_mean = means["lap_ms_mean"]
    tpot_mean = n_mean * lap_mean / m
    tpot_sd = np.sqrt(lap_mean**2 * n_var + n_mean * lap_var) / m
    tpot_p50, tpot_p99 = mixture_normal_quantiles(w, tpot_mean, tpot_sd, [0.5, 0.99])
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
    busy, duration = sync_stage_busy_ms(scenario, means)
    return Answer(
        means,
        Percentiles(float(lap_p50), float(lap_p99), float(tpot_p50), float(tpot_p99)),
        stage_utilization(busy, duration),
        details,
        values,
        pmf,
        _alone(w, tpot_mean, tpot_sd, lap_mean, m),
    )


def _alone(w, tpot_ms, sd_ms, lap_ms: float, m: int) -> DecodeParts:
    """One request's TPOT parts alone (no waits)."""
    arrays = (np.atleast_1d(np.asarray(x, dtype=float)) for x in (w, tpot_ms, sd_ms))
    return DecodeParts(*arrays, float(lap_ms), float(lap_ms), 0.0, int(m))


def _loaded(alone: DecodeParts, lap_ms: float, wait_var: float) -> DecodeParts:
    """A request whose laps are its laps alone stretched to ``lap_ms`` in the mean plus
    independent waits of variance ``wait_var`` per lap (:mod:`wansim.analytical.decode_tails`)."""
    return dataclasses.replace(alone, lap_ms=float(lap_ms), wait_var_ms2=float(wait_var))


def _smoothed(atoms, weights, sd: float, points: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Atoms blurred by N(0, sd^2), on a uniform grid (the block schedule's laps): equal atoms
    merged, each chunk of the grid summing the atoms within :data:`KERNEL_REACH_SD` sd of it
    (the kernel is 0.0 in float64 beyond): the dense sum's values to ~4e-16 of the peak (the
    summation order differs)."""
    if sd <= 0:
        order = np.argsort(atoms)
        atoms, weights = np.asarray(atoms)[order], np.asarray(weights)[order]
        if len(atoms) == 1:
            return atoms, weights
        sd = max(float(atoms[-1] - atoms[0]) / points, 1e-9)
    grid = np.linspace(np.min(atoms) - 6 * sd, np.max(atoms) + 6 * sd, points)
    # equal atoms (many: chains x jitter nodes land on a few lap values) as one, their weights
    # summed; sorted, for the chunks below
    atoms, where = np.unique(np.asarray(atoms, dtype=float), return_inverse=True)
    weights = np.bincount(where.ravel(), weights=np.asarray(weights, dtype=float).ravel())
    reach = KERNEL_REACH_SD * sd
    dens = np.zeros(points)
    for start in range(0, points, SMOOTH_CHUNK):  # each chunk of the grid: the atoms in reach
        near = grid[start : start + SMOOTH_CHUNK]
        lo = np.searchsorted(atoms, near[0] - reach, side="left")
        hi = np.searchsorted(atoms, near[-1] + reach, side="right")
        if hi > lo:
            z = (near[:, None] - atoms[lo:hi]) / sd
            dens[start : start + SMOOTH_CHUNK] = (weights[lo:hi] * np.exp(-0.5 * z**2)).sum(1)
    return grid, dens / dens.sum()


KERNEL_REACH_SD = 38.7  # exp(-z^2 / 2) is 0.0 in float64 beyond (|z| > 38.6)
SMOOTH_CHUNK = 256  # grid points per chunk of _smoothed


def _block_busy_ms(scenario: Scenario, means: dict, parts: dict) -> tuple[list[float], float]:
    """Per-stage busy ms of one request under the block schedule (its passes, its stale
    blocks at S0 and forwarded ones in the middle, drafting where it occupies a stage) and the
    request's duration."""
    from wansim.stages.compute import stage_ms_each

    p = int(scenario.stages)
    duration = means["prefill_ms"] + means["decode_ms"]
    pre = [float(x) for x in stage_ms_each(scenario, scenario.workload.prompt_tokens)]
    ver = [float(x) for x in stage_ms_each(scenario, float(np.asarray(parts["tokens"])))]
    passes = means["passes_per_request"]
    s0 = means["stale_blocks_s0_per_request"]
    fwd = means["stale_blocks_forwarded_per_request"]
    # drafting per valid pass (first blocks and bets) and per stale block (a bet)
    overlap = scenario.drafter.overlap
    draft = 0.0 if overlap else float(np.asarray(means["draft_ms"]))
    stale_draft = 0.0 if overlap else float(np.asarray(means["stale_draft_ms"]))
    busy = [pre[i] + passes * ver[i] for i in range(p)]
    first = scenario.drafter.placement == "first_stage"
    busy[0 if first else p - 1] += passes * draft
    busy[0] += s0 * (ver[0] + (stale_draft if first else 0.0))
    for i in range(1, p if flushes(scenario) else p - 1):  # (flush: the last computes them too)
        busy[i] += fwd * ver[i]
    return busy, duration


def _batched(scenario: Scenario, parts: dict, lockstep: Answer) -> Answer:
    """Continuous batching: the lockstep batch plus its admissions in steady state."""
    raw = sync_metrics(scenario)
    run = batching.batched_run(scenario, raw, parts)
    means = _scalars(run.means)
    # a lap is the lockstep one, late by D(j) when j other requests were admitted ahead
    adm = run.admissions
    late = [float(np.asarray(d)) for _, _, d in adm.others[1:]]
    prob = [float(np.asarray(pj)) for _, pj, _ in adm.others[1:]]
    values, pmf = lockstep.lap_values_ms, lockstep.lap_pmf
    lap_p50, lap_p99 = quantiles(*shifted_mixture(values, pmf, late, prob), [0.5, 0.99])
    mean_late = float(np.dot(prob, late))
    wait_var = max(float(np.dot(prob, np.square(late))) - mean_late**2, 0.0)
    decode = _loaded(lockstep.decode, means["lap_ms_mean"], wait_var)
    tpot_p50, tpot_p99 = loaded_tpot_quantiles(decode)
    busy, makespan = batching.stage_busy_ms(scenario, run)
    details = {
        **lockstep.details,
        "approximation": "continuous batching in steady state (lockstep batch + admissions)",
        "lockstep_lap_ms": means["lockstep_lap_ms"],
        "convoy_ms_per_lap": means["convoy_ms_per_lap"],
    }
    return Answer(
        means,
        Percentiles(float(lap_p50), float(lap_p99), float(tpot_p50), float(tpot_p99)),
        stage_utilization(busy, makespan),
        details,
        lockstep.lap_values_ms,
        lockstep.lap_pmf,
        decode,
    )


def _micro_batched(scenario: Scenario, parts: dict, alone: Answer) -> Answer:
    """Micro-batches in steady state (micro_batched.py). Every decode lap is the cycle T: the
    lap distribution is the lone lap's spread (the hops' jitter) moved to mean T; a request's
    TPOT is N T / M, a mixture over difficulty of normals in N (renewal CLT)."""
    run = micro_batched_run(scenario, parts)
    means = _scalars(run.means)
    lap = means["lap_ms_mean"]
    values, pmf = alone.lap_values_ms, alone.lap_pmf
    values = values - float(np.sum(values * pmf)) + lap
    lap_p50, lap_p99 = quantiles(values, pmf, [0.5, 0.99])
    w, n_mean, n_var = passes_per_node(scenario)
    m = scenario.workload.output_tokens - 1
    tpot_sd = np.sqrt(lap**2 * n_var + n_mean * means["lap_ms_var"]) / m
    # as parts: the lone lap's, every lap waiting the rest of the cycle T (the hops' spread
    # is not stretched: the sd alone is the loaded one scaled back)
    lone = means["lone_lap_ms"]
    lone_parts = _alone(w, n_mean * lone / m, tpot_sd * lone / lap, lone, m)
    decode = _loaded(lone_parts, lap, 0.0)
    tpot_p50, tpot_p99 = loaded_tpot_quantiles(decode)
    p = int(scenario.stages)
    makespan = means["makespan_ms"]
    busy = [float(np.asarray(x)) for x in run.stage_busy_ms[:p]]
    details = {
        **alone.details,
        "approximation": "micro-batched pipeline in steady state (cycle max(L, N s_max))",
        "micro_batch_size": means["micro_batch_size"],
        "pass_tokens": means["pass_tokens"],
        "chunk_pass_tokens": means["chunk_pass_tokens"],
        "lone_lap_ms": means["lone_lap_ms"],
        "bottleneck_ms": means["bottleneck_ms"],
        "convoy_wait_ms": means["convoy_wait_ms"],
        "bound": "bottleneck"
        if scenario.schedule.micro_batches * means["bottleneck_ms"] >= lap * (1.0 - 1e-12)
        else "latency",
    }
    return Answer(
        means,
        Percentiles(float(lap_p50), float(lap_p99), float(tpot_p50), float(tpot_p99)),
        [min(b / makespan, 1.0) for b in busy],
        details,
        values,
        pmf,
        decode,
    )


def _concurrent(scenario: Scenario, parts: dict, alone: Answer) -> Answer:
    """N concurrent requests without batching: the closed ring (concurrent.py).

    Percentiles: a loaded lap is the lap alone plus independent waits (:func:`lap_waits`):
    queueing behind the other requests' passes, the convoy behind a prefill, and at the
    bottleneck's capacity the saturation wait. TPOT (a request's mean over many laps): the
    lap's mean stretch plus the waits' variance over its passes (:func:`_loaded`)."""
    blocks = uses_blocks(scenario)
    raw = block_schedule_metrics(scenario) if blocks else sync_metrics(scenario)
    loaded = concurrent_metrics(scenario, raw, parts, blocks)
    means = _scalars({k: v for k, v in loaded.items() if k != "stage_rho"})
    waits, shift = lap_waits(means)
    values, pmf = with_waits(alone.lap_values_ms, alone.lap_pmf, waits, shift)
    lap_p50, lap_p99 = quantiles(values, pmf, [0.5, 0.99])
    decode = _loaded(alone.decode, means["lap_ms_mean"], waits_variance(waits))
    tpot_p50, tpot_p99 = loaded_tpot_quantiles(decode)
    p = int(scenario.stages)
    details = {
        **alone.details,
        "approximation": ("block schedule + " if blocks else "")
        + "closed network of concurrent requests",
    }
    for key in ("stale_blocks_s0_per_request", "stale_blocks_forwarded_per_request"):
        if key in details:  # the loaded ring's counts (S0's wait spaces the blocks)
            details[key] = means[key]
    return Answer(
        means,
        Percentiles(float(lap_p50), float(lap_p99), float(tpot_p50), float(tpot_p99)),
        [float(u) for u in np.asarray(loaded["stage_rho"])[:p]],
        details,
        values,
        pmf,
        decode,
    )


def lap_waits(means: dict) -> tuple[list[tuple[float, float, float]], float]:
    """A loaded lap's waits beyond the lap alone, as (p, lo, hi) triples (0 with probability
    1 - p, else uniform on [lo, hi]; independent) and a fixed shift, with the ring's means
    (:func:`wansim.analytical.concurrent.solve`):

    - queueing behind the other requests' passes: it happens with probability pi (the pass
      finds some station on its lap busy: 1 - prod (1 - c_a^2 rho'), the arrival theorem's
      load), and then, behind a deterministic service in progress, is uniform around its
      conditional mean q / pi with a spread that shrinks with the bottleneck's load rho
      (uniform on [0, 2 q / pi] when idle, q / pi when saturated: a saturated deterministic
      ring waits the same every lap);
    - the convoy behind another request's prefill (:func:`~wansim.analytical.concurrent.
      convoy_wait`): caught with probability p_c, it loses slower - gap with the gap uniform
      on [0, m], m = min(slower, lap); p_c matches the mean;
    - at the bottleneck's capacity, the excess residence: every lap, the shift.

    Their means add up to the loaded lap's mean wait. Exact for a deterministic ring (no
    queueing below capacity, the fixed saturation wait at it) up to the convoys' phase, which
    is taken as uniform."""
    w = {k: float(np.asarray(means[k])) for k in WAIT_PARTS}
    waits = []
    q, pi = w["queue_ms"], w["queue_prob"]
    if q > 0 and pi > 0:
        per = q / pi
        spread = 1.0 - w["bottleneck_rho"]
        waits.append((pi, per * (1.0 - spread), per * (1.0 + spread)))
    conv, slower, reach = w["convoy_ms"], w["convoy_slower_ms"], w["convoy_reach_ms"]
    if conv > 0 and slower > 0:
        caught = min(conv / (slower - reach / 2), 1.0)
        waits.append((caught, slower - reach, slower))
    return waits, w["saturation_ms"]
