"""Closed forms for the sync schedule, vectorised.

Every numeric scenario field read here may be a numpy array (all broadcast to one shape), so one
call evaluates a whole grid. The model: docs/architecture.md ("The physics in one lap"). The speculation policy (none,
chain, tree, verifier rule) enters only through :mod:`wansim.speculation`: per sequence a pass
verifies n = K + 1 (chain), N + 1 (tree of N nodes) or 1 token(s), and the accepted length has
survival S_d per difficulty node. A batch of b sequences (``workload.concurrency`` with
``schedule.batching: continuous``) is modelled in lockstep: the b sequences share every pass
(b n tokens per stage, one forward message of header + b (n s_act + tree mask), their b
verdicts on the return hop), and each sequence commits its own accepted tokens; the batch is
kept full (continuous refill); :mod:`wansim.analytical.batched` adds what the refills cost
(admission convoys, the replacements' TTFT, cold start and drain). b = 1 otherwise (one
request in flight):

  T_lap     = t_draft + sum_i t_stage(b n) + sum_fwd E[T_hop](fwd bytes) + E[T_ret](b verdict)
  T_prefill = sum_i t_stage(b prompt) + sum_fwd E[T_hop](header + b prompt s_act)  (= TTFT)

(t_stage_i is stage i's own model with ``model.stage_compute``; the code carries the mean over
stages, ``stage_ms``, so that P * stage_ms is the sum.)

A request commits M = output_tokens - 1 tokens in N verify passes (the first token comes from
prefill). For difficulty Z (quadrature weights w), E[N_Z] and Var N_Z come from the recurrences in
:mod:`wansim.acceptance.closed_form`. Then

  tokens_per_s            = E_w[M / (N_Z Tbar)]  (mean over requests of each one's rate; Tbar
                            the mean of its N laps), to second order:
                          = E_w[M/E[N_Z] (1 + Var N_Z / E[N_Z]^2 + Var T / (E[N_Z] T^2))] / T
  tau                     = M / E_w[E[N_Z]]             (committed per pass, step-weighted)
  throughput_tokens_per_s = b (M + 1) / (T_prefill + E_w[N] T_lap)
  utilisation of stage i  = (t_stage(b prompt) + E_w[N] (t_stage(b n) + t_draft [drafter on i]))
                            / (T_prefill + E_w[N] T_lap);   bubble_fraction = 1 - mean_i
  bytes_per_token         = E_w[N] sum_hops bytes_h (1 + E[G_h]) / (b M)       (decode only)
  wasted_token_fraction   = 1 - M / (E_w[N] n)
  target_exact            = false for typical acceptance (lossy), else true

Without per-prompt difficulty and for long outputs tokens_per_s = tau / E[T_lap] exactly (the
renewal-reward theorem); with difficulty it is the mean of per-request rates, which exceeds the
step-weighted tau / E[T_lap] (Jensen). Where transmissions can be lost the second-order form
fails for rare, long retransmissions (most requests see none), so the rate is then conditioned
on the request's loss count (:func:`request_rate`, :mod:`wansim.analytical.rate`).
"""

from __future__ import annotations

import numpy as np

from wansim import speculation
from wansim.acceptance import closed_form
from wansim.analytical.path import hop_bytes, ring_sums
from wansim.analytical.rate import mean_rate
from wansim.config.scenario import Scenario
from wansim.links.expected_delay import expected_losses, hop_mean, hop_var, loss_terms_ms
from wansim.links.wire_bytes import forward_bytes
from wansim.speculation.block_schedule import bet_draft_ms
from wansim.stages import slowdown
from wansim.stages.compute import mean_stage_ms, stage_ms_each


def passes_per_node(scenario: Scenario) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, E[N_Z], Var[N_Z]) over the difficulty quadrature (scalar scenario)."""
    m = float(scenario.workload.output_tokens - 1)
    w, surv = speculation.policy(scenario).difficulty_nodes()
    depth = surv.shape[1]
    if depth == 0:
        return np.ones(1), np.array([m]), np.zeros(1)
    n_mean, n_var = closed_form.passes_moments(surv, m)
    return w, n_mean, n_var


def _hop_sums(scenario: Scenario, n_bytes_fwd, n_bytes_ret) -> tuple:
    """(sum of forward hop means, return hop mean, wire bytes per pass incl. retransmissions,
    variance of the lap's hop time)."""
    fwd, ret = ring_sums(scenario, hop_mean, n_bytes_fwd, n_bytes_ret)
    var = sum(ring_sums(scenario, hop_var, n_bytes_fwd, n_bytes_ret))
    wire = sum(
        ring_sums(
            scenario,
            lambda link, n: n * (1 + expected_losses(link.loss_rate)),
            n_bytes_fwd,
            n_bytes_ret,
        )
    )
    return fwd, ret, wire, var


def _loss_sums(scenario: Scenario, n_bytes_fwd, n_bytes_ret) -> dict[str, np.ndarray]:
    """Per lap, summed over the hops: lost transmissions (mean, variance) and the delay they add
    (mean, variance) (:func:`wansim.links.expected_delay.loss_terms_ms`)."""

    def total(key: str) -> np.ndarray:
        def term(link, n):
            return loss_terms_ms(link.loss_rate, link.retransmit_ms, link.bandwidth_mbps, n)[key]

        return sum(ring_sums(scenario, term, n_bytes_fwd, n_bytes_ret))

    return {
        key: total(key) for key in ("count_mean", "count_var", "delay_mean_ms", "delay_var_ms2")
    }


def request_rate(parts: dict, lap, lap_var, loss: dict) -> np.ndarray:
    """tokens_per_s: E_w[M / T_Z] for a request of N_Z laps of mean ``lap`` and variance
    ``lap_var`` (the module docstring). Without losses the delta expansion, factorised over the
    difficulty nodes (``rate_factor``, ``lap_noise_factor``). Where transmissions can be lost,
    per node with the retransmissions conditioned on their count K
    (:func:`wansim.analytical.rate.mean_rate`): a lap is l0 + noise (s0^2) + its retransmission
    delay D (mean d, variance Var D, over g lost transmissions of variance Var G), and given k

      T | k = N l0 + c k + noise,   c = d / g,
      E[K] = E[N] g,   Var K = E[N] Var G + Var N g^2,
      Var(T | k) = Var N l0^2 + E[N] s0^2 + k v,   v = (Var D - Var G c^2) / g

    (v: the spread of one retransmission's delay over hops of different RTOs). Exact for a
    fixed N on one hop without jitter; as E[K] grows the sum becomes the delta expansion of the
    whole T but for the N-K coupling term 2 Var N l0 d (left out: kept, it lifted short lossy
    requests above the lossless rate). Against Monte Carlo: within 0.43% (5% loss, RTO 15x the
    lap); the expansion of the whole T was up to 3.9% high where losses are rare and long."""
    lap = np.asarray(lap, dtype=float)
    rate = 1e3 * (parts["rate_factor"] + parts["lap_noise_factor"] * lap_var / lap**2) / lap
    g = loss["count_mean"]
    shape = np.broadcast_shapes(np.shape(rate), np.shape(g))
    lossy = np.flatnonzero(np.broadcast_to(g, shape) > 0)
    if not lossy.size:
        return rate

    def at(x) -> np.ndarray:  # the lossy points' values, as a column against the nodes
        return np.broadcast_to(np.asarray(x, dtype=float), shape).reshape(-1)[lossy, None]

    row = np.broadcast_to(parts["node_row"], shape).reshape(-1)[lossy]
    w, n, n_var = (parts[k][row] for k in ("node_weights", "node_passes", "node_passes_var"))
    g, g_var = at(g), at(loss["count_var"])
    d, d_var = at(loss["delay_mean_ms"]), at(loss["delay_var_ms2"])
    lap0, var0 = at(lap) - d, np.maximum(at(lap_var) - d_var, 0.0)
    c = d / g
    v = np.maximum((d_var - g_var * c**2) / g, 0.0)
    per_node = mean_rate(
        at(parts["m"]), n * lap0, n_var * lap0**2 + n * var0, n * g, n * g_var + n_var * g**2, c, v
    )
    # mean_rate expands E[1 / N] around E[N]; where the lossless factor is exact (short
    # outputs) the lossy rate takes the same correction, exact / expanded
    exact = np.broadcast_to(parts["rate_factor"] / parts["rate_factor_delta"], shape)
    out = np.broadcast_to(rate, shape).reshape(-1).copy()
    out[lossy] = 1e3 * (w * per_node).sum(axis=1) * exact.reshape(-1)[lossy]
    return out.reshape(shape)


def lap_parts(scenario: Scenario) -> dict[str, np.ndarray]:
    """The policy's per-lap quantities (arrays): tokens per sequence ``n``, batch ``b``, the
    acceptance terms, drafter ms, stage ms of one verify pass, and the message sizes."""
    wl = scenario.workload
    m = np.asarray(wl.output_tokens) - 1
    terms = speculation.policy_terms(scenario, m)
    b = speculation.batch_size(scenario)
    n = terms["tokens"]
    return {
        **terms,
        "m": m,
        "batch": b,
        "draft_ms": speculation.drafter_ms(scenario, terms, b),
        # a block schedule's block drafted on a bet (the guess first)
        "bet_draft_ms": bet_draft_ms(scenario, terms["depth"], terms["nodes"], b),
        "stage_ms": mean_stage_ms(scenario, b * n, b),  # mean over stages (they may differ)
        "forward_bytes": speculation.forward_message_bytes(scenario, n, terms["tree_nodes"], b),
        # per forward hop when payload.extra_tensors make them differ, else None
        "forward_bytes_hops": speculation.forward_message_bytes_hops(
            scenario, n, terms["tree_nodes"], b
        ),
        "return_bytes": speculation.return_message_bytes(
            scenario, terms["tree_nodes"], b, n, terms["nodes"]
        ),
    }


def lap_breakdown(lap, tokens, draft, stage, fwd, ret) -> dict[str, np.ndarray]:
    """Tokens per pass and the parts of the lap (for breakdowns), each in ``lap``'s shape:
    drafting, one stage's compute, the forward hops, the return hop. On an array ``lap`` they
    are read-only broadcast views (a part that depends on few grid axes is not written out)."""
    return {
        "tokens_per_pass": like_lap(tokens, lap),
        "draft_ms": like_lap(draft, lap),
        "stage_compute_ms": like_lap(stage, lap),
        "forward_hops_ms": like_lap(fwd, lap),
        "return_hop_ms": like_lap(ret, lap),
    }


def like_lap(value, lap):
    """``value * np.ones_like(lap)``: the same values and dtype; a scalar ``lap`` gives what
    that product gives, an array ``lap`` a read-only broadcast view (no full-size copy)."""
    if np.ndim(lap) == 0:
        return value * np.ones_like(lap)
    dtype = np.result_type(value, lap)  # the product's dtype (``ones_like`` keeps lap's)
    return np.broadcast_to(np.asarray(value, dtype=dtype), np.shape(lap))


def forward_sizes(parts: dict):
    """The forward message sizes for :func:`wansim.analytical.path.ring_sums`: one per hop
    when they differ (``payload.extra_tensors``), else the one size."""
    hops = parts.get("forward_bytes_hops")
    return parts["forward_bytes"] if hops is None else hops


def ring_message_bytes(scenario: Scenario, parts: dict) -> list[float]:
    """The P message sizes of a lap (scalar scenario): the forward hops', then the return's."""
    p = int(scenario.stages)
    fwd = forward_sizes(parts)
    return [float(hop_bytes(fwd, h)) for h in range(p - 1)] + [float(parts["return_bytes"])]


def lap_constant(scenario: Scenario, parts: dict) -> tuple[float, list]:
    """(the lap's deterministic compute and drafting ms, the slowed stages' random terms) for
    :func:`wansim.analytical.distribution.lap_distribution` (scalar scenario)."""
    draft = float(parts["draft_ms"])
    if not slowdown.active(scenario.model):
        return draft + scenario.stages * float(parts["stage_ms"]), []
    each = stage_ms_each(
        scenario, parts["batch"] * parts["tokens"], mean=False, sequences=parts["batch"]
    )
    fixed, terms = slowdown.lap_terms(scenario.model, each)
    return draft + fixed, terms


def prefill_sizes(scenario: Scenario, tokens):
    """The prefill's forward message sizes (per hop with ``payload.extra_tensors``)."""
    payload, hidden = scenario.payload, scenario.model.hidden_size
    if not payload.extra_tensors:
        return forward_bytes(payload, hidden, tokens)
    stages = int(scenario.stages)
    return tuple(forward_bytes(payload, hidden, tokens, h, stages) for h in range(stages - 1))


def sync_metrics(scenario: Scenario) -> dict[str, np.ndarray]:
    """Mean metrics (arrays) for the sync schedule (one request, or one lockstep batch)."""
    stages = np.asarray(scenario.stages)
    wl = scenario.workload
    parts = lap_parts(scenario)
    m, b, n, passes = parts["m"], parts["batch"], parts["tokens"], parts["passes"]

    stage = parts["stage_ms"]
    stage_prefill = mean_stage_ms(scenario, b * np.asarray(wl.prompt_tokens), b)
    draft = parts["draft_ms"]
    ret_bytes = parts["return_bytes"]
    fwd, ret, wire, lap_var = _hop_sums(scenario, forward_sizes(parts), ret_bytes)
    pre_fwd, _, _, _ = _hop_sums(
        scenario, prefill_sizes(scenario, b * np.asarray(wl.prompt_tokens)), ret_bytes
    )

    lap = draft + stages * stage + fwd + ret
    if slowdown.active(scenario.model):  # compute noise, stragglers: per stage c^2 Var(XY)
        each = stage_ms_each(scenario, b * n, mean=False, sequences=b)
        lap_var = lap_var + slowdown.lap_variance_ms2(scenario.model, each)
    prefill = stages * stage_prefill + pre_fwd
    duration = prefill + passes * lap
    busy_all = stages * stage_prefill + passes * (stages * stage + draft)
    exact = speculation.target_exact(scenario)
    return {
        "tokens_per_s": request_rate(
            parts, lap, lap_var, _loss_sums(scenario, forward_sizes(parts), ret_bytes)
        ),
        "throughput_tokens_per_s": 1e3 * b * (m + 1) / duration,
        "tau": parts["tau"],
        "lap_ms_mean": lap,
        "tpot_ms_mean": passes * lap / m,
        "ttft_ms_mean": prefill,
        "bubble_fraction": 1.0 - busy_all / (stages * duration),
        "bytes_per_token": passes * wire / (b * m),
        "wasted_token_fraction": 1.0 - m / (passes * n),
        "target_exact": np.broadcast_to(exact, np.shape(lap))
        if np.ndim(lap)
        else np.full((), exact),
        **lap_breakdown(lap, n, draft, stage, fwd, ret),
        "prefill_ms": prefill,
        "passes_per_request": passes,
        "lap_ms_var": like_lap(lap_var, lap),
    }


def stage_busy_ms(scenario: Scenario, means: dict) -> tuple[list[float], float]:
    """Per-stage busy ms of one request (scalar scenario; the drafter's stage also pays its
    passes) and the request's duration."""
    stages = int(scenario.stages)
    passes = float(means["passes_per_request"])
    duration = float(means["prefill_ms"] + passes * means["lap_ms_mean"])
    b = float(speculation.batch_size(scenario))
    prefill = stage_ms_each(scenario, b * scenario.workload.prompt_tokens, sequences=b)
    verify = stage_ms_each(scenario, b * float(means["tokens_per_pass"]), sequences=b)
    busy = [float(pre) + passes * float(ver) for pre, ver in zip(prefill, verify, strict=True)]
    draft_stage = 0 if scenario.drafter.placement == "first_stage" else stages - 1
    busy[draft_stage] += passes * float(means["draft_ms"])
    return busy, duration
