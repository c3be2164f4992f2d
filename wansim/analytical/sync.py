"""Closed forms for the sync schedule with one request in flight, vectorised.

Every numeric scenario field read here may be a numpy array (all broadcast to one shape), so one
call evaluates a whole grid. The model (DESIGN.md section 2), with n = K + 1 tokens per pass:

  T_lap     = t_draft(K) + sum_i t_stage(n) + sum_fwd E[T_hop](header + n s_act) + E[T_ret](m)
  T_prefill = sum_i t_stage(prompt) + sum_fwd E[T_hop](header + prompt s_act)     (= TTFT)

A request commits M = output_tokens - 1 tokens in N verify passes (the first token comes from
prefill). For difficulty Z (quadrature weights w), E[N_Z] and Var N_Z come from the recurrences in
:mod:`wansim.acceptance.closed_form`. Then

  tokens_per_s            = E_w[M / (N_Z Tbar)]  (mean over requests of each one's rate; Tbar
                            the mean of its N laps), to second order:
                          = E_w[M/E[N_Z] (1 + Var N_Z / E[N_Z]^2 + Var T / (E[N_Z] T^2))] / T
  tau                     = M / E_w[E[N_Z]]             (committed per pass, step-weighted)
  throughput_tokens_per_s = (M + 1) / (T_prefill + E_w[N] T_lap)            (one at a time)
  utilisation of stage i  = (t_stage(prompt) + E_w[N] (t_stage(n) + t_draft [drafter on i]))
                            / (T_prefill + E_w[N] T_lap);   bubble_fraction = 1 - mean_i
  bytes_per_token         = E_w[N] sum_hops bytes_h (1 + E[G_h]) / M           (decode only)
  wasted_token_fraction   = 1 - M / (E_w[N] n)

Without per-prompt difficulty and for long outputs tokens_per_s = tau / E[T_lap] exactly (the
renewal-reward theorem); with difficulty it is the mean of per-request rates, which exceeds the
step-weighted tau / E[T_lap] (Jensen).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.acceptance import closed_form
from wansim.acceptance.model import acceptance_model
from wansim.compute import drafter_ms, stage_ms
from wansim.network import expected_losses, hop_mean, hop_mean_ms, hop_var, hop_var_ms
from wansim.scenario import AcceptanceSpec, Scenario
from wansim.wire import forward_bytes, return_bytes


def draft_tokens(scenario: Scenario) -> np.ndarray:
    """K per pass (0 without speculation)."""
    if scenario.speculation.policy == "none":
        return np.zeros_like(np.asarray(scenario.speculation.k))
    return np.asarray(scenario.speculation.k)


def acceptance_terms(spec: AcceptanceSpec, k: np.ndarray, m_tokens: np.ndarray) -> dict:
    """Per point: expected passes per request, mean per-request tokens per pass, and tau.

    Evaluated once per distinct (k, M, domain_shift, alpha) and mapped back to the points.
    """
    k = np.asarray(k)
    m = np.asarray(m_tokens)
    shift = np.asarray(spec.domain_shift, dtype=float)
    alpha = np.asarray(-1.0 if spec.alpha is None else spec.alpha, dtype=float)  # -1: not given
    shape = np.broadcast_shapes(k.shape, m.shape, shift.shape, alpha.shape)
    unique, inverse = _distinct_rows([k, m, shift, alpha], shape)
    passes = np.empty(len(unique))
    rate = np.empty(len(unique))
    lap_noise = np.empty(len(unique))
    for i, (ki, mi, gi, ai) in enumerate(unique):
        one = dataclasses.replace(spec, domain_shift=1.0, alpha=None if ai < 0 else float(ai))
        w, n_mean, n_var = passes_per_node(one, int(ki), float(mi), float(gi))
        passes[i] = w @ n_mean
        rate[i] = w @ (mi / n_mean * (1.0 + n_var / n_mean**2))
        lap_noise[i] = w @ (mi / n_mean**2)
    return {
        "passes": passes[inverse].reshape(shape),
        "rate_factor": rate[inverse].reshape(shape),
        "lap_noise_factor": lap_noise[inverse].reshape(shape),
        "tau": m / passes[inverse].reshape(shape),
    }


def _distinct_rows(columns: list[np.ndarray], shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of broadcast columns and each point's row index (1-D sorts only)."""
    size = int(np.prod(shape))
    code = np.zeros(size, dtype=np.int64)
    values = []
    for col in columns:
        if col.ndim == 0:
            values.append(np.array([col.item()]))
            continue
        uniq, inv = np.unique(np.broadcast_to(col, shape).ravel(), return_inverse=True)
        code = code * len(uniq) + inv
        values.append(uniq)
    if all(col.ndim == 0 for col in columns):
        return np.array([[v[0] for v in values]]), np.zeros(size, dtype=np.int64)
    distinct, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    rows = np.empty((len(distinct), len(columns)))
    for j, col in enumerate(columns):
        rows[:, j] = col.item() if col.ndim == 0 else np.broadcast_to(col, shape).ravel()[first]
    return rows, inverse


def passes_per_node(
    spec: AcceptanceSpec, k: int, m_tokens: float, shift: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, E[N_Z], Var[N_Z]) over the difficulty quadrature for blocks of k drafts."""
    model = acceptance_model(spec)
    if k == 0:
        return np.ones(1), np.array([m_tokens]), np.zeros(1)
    w, rates = model.nodes(k)
    surv = closed_form.survival(rates * shift)
    n_mean, n_var = closed_form.passes_moments(surv, m_tokens)
    return w, n_mean, n_var


def _hop_sums(scenario: Scenario, n_bytes_fwd, n_bytes_ret) -> tuple:
    """(sum of forward hop means, return hop mean, wire bytes per pass incl. retransmissions,
    variance of the lap's hop time)."""
    net = scenario.network
    if net.hops:
        hops = scenario.resolved_hops()
        fwd_hops, ret_hop = hops[:-1], hops[-1]
        fwd = sum((hop_mean(h, n_bytes_fwd) for h in fwd_hops), start=np.zeros(()))
        var = sum((hop_var(h, n_bytes_fwd) for h in fwd_hops), start=hop_var(ret_hop, n_bytes_ret))
        wire = sum(n_bytes_fwd * (1 + expected_losses(h.loss_rate)) for h in fwd_hops)
        wire = wire + n_bytes_ret * (1 + expected_losses(ret_hop.loss_rate))
        return fwd, hop_mean(ret_hop, n_bytes_ret), wire, var
    stages = np.asarray(scenario.stages)
    link = (net.latency_ms, net.bandwidth_mbps, net.jitter, net.loss_rate, net.retransmit_ms)
    resend = 1 + expected_losses(net.loss_rate)
    wire = ((stages - 1) * n_bytes_fwd + n_bytes_ret) * resend
    var = (stages - 1) * hop_var_ms(*link, n_bytes_fwd) + hop_var_ms(*link, n_bytes_ret)
    fwd = (stages - 1) * hop_mean_ms(*link, n_bytes_fwd)
    return fwd, hop_mean_ms(*link, n_bytes_ret), wire, var


def sync_metrics(scenario: Scenario) -> dict[str, np.ndarray]:
    """Mean metrics (arrays) for the sync schedule, one request in flight."""
    stages = np.asarray(scenario.stages)
    k = draft_tokens(scenario)
    n = k + 1
    wl = scenario.workload
    m = np.asarray(wl.output_tokens) - 1
    acc = acceptance_terms(scenario.drafter.acceptance, k, m)
    passes = acc["passes"]

    stage = stage_ms(scenario.model.compute, n)
    stage_prefill = stage_ms(scenario.model.compute, wl.prompt_tokens)
    draft = drafter_ms(scenario.drafter, k)
    hidden = scenario.model.hidden_size
    fwd_bytes = forward_bytes(scenario.payload, hidden, n)
    ret_bytes = return_bytes(scenario.payload)
    fwd, ret, wire, lap_var = _hop_sums(scenario, fwd_bytes, ret_bytes)
    pre_fwd, _, _, _ = _hop_sums(
        scenario, forward_bytes(scenario.payload, hidden, wl.prompt_tokens), ret_bytes
    )

    lap = draft + stages * stage + fwd + ret
    prefill = stages * stage_prefill + pre_fwd
    duration = prefill + passes * lap
    busy_all = stages * stage_prefill + passes * (stages * stage + draft)
    return {
        "tokens_per_s": 1e3
        * (acc["rate_factor"] + acc["lap_noise_factor"] * lap_var / lap**2)
        / lap,
        "throughput_tokens_per_s": 1e3 * (m + 1) / duration,
        "tau": acc["tau"],
        "lap_ms_mean": lap,
        "tpot_ms_mean": passes * lap / m,
        "ttft_ms_mean": prefill,
        "bubble_fraction": 1.0 - busy_all / (stages * duration),
        "bytes_per_token": passes * wire / m,
        "wasted_token_fraction": 1.0 - m / (passes * n),
        # parts of the lap, for breakdowns
        "draft_ms": draft * np.ones_like(lap),
        "stage_compute_ms": stage * np.ones_like(lap),
        "forward_hops_ms": fwd * np.ones_like(lap),
        "return_hop_ms": ret * np.ones_like(lap),
        "prefill_ms": prefill,
        "passes_per_request": passes,
        "lap_ms_var": lap_var * np.ones_like(lap),
    }


def stage_utilization(scenario: Scenario, means: dict) -> list[float]:
    """Per-stage busy fraction (scalar scenario): the drafter's stage also pays its passes."""
    stages = int(scenario.stages)
    k = draft_tokens(scenario)
    passes = float(means["passes_per_request"])
    duration = float(means["prefill_ms"] + passes * means["lap_ms_mean"])
    prefill_stage = float(stage_ms(scenario.model.compute, scenario.workload.prompt_tokens))
    busy = [prefill_stage + passes * float(means["stage_compute_ms"])] * stages
    draft_stage = 0 if scenario.drafter.placement == "first_stage" else stages - 1
    busy[draft_stage] += passes * float(drafter_ms(scenario.drafter, k))
    return [b / duration for b in busy]
