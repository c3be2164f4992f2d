"""Compute-time models: how long a stage (or the drafter) takes for a pass of n tokens.

All functions broadcast over numpy arrays (n and any model field may be an array), so the
analytical engine evaluates whole grids with them and the simulator calls them per pass.

- linear:   t(n) = base_ms + per_token_ms * n
- roofline: t(n) = overhead_ms + 1e3 * max(bytes / (mem_bandwidth_gbs * 1e9),
                                           2 * params * n / (peak_tflops * 1e12))
            bytes = params_b * 1e9 * bytes_per_param + kv_bytes_per_token * context_tokens
- moe:      as roofline with bytes = dense * bytes_per_param + touched * expert_params *
            expert_bytes_per_param (default bytes_per_param) + KV,
            touched = E * (1 - (1 - k/E)^n) distinct experts for n tokens under uniform top-k
            routing, FLOPs = 2 n (dense + k * expert_params)
- table:    measured (n, ms) points, linear interpolation, last slope extended beyond the end
            (and the first value held below the first point)

Stages may differ (``model.stage_compute``: one model per stage); :func:`stage_ms_each` gives
each stage's time and :func:`mean_stage_ms` their mean (both engines sum the stages). A
batched pass of b sequences (several requests' blocks in one pass) adds ``sequence_ms`` per
sequence beyond the first: t(n, b) = t(n) + overhead + sequence_ms * (b - 1) (the requests'
caches laid side by side and split back, measured on the real path: ``docs/calibrate.md``).

Drafter: one pass costs ``draft_ms``; a parallel (block) drafter drafts K tokens in one pass, an
autoregressive drafter pays K passes. A tree of N nodes and depth D drafted for b sequences:

    t_draft = passes * (draft_ms + sequence_ms * (b - 1)) + width_ms * b * (N - D),
    passes = 1 (parallel) or D

the passes draft the depth-D spine as for a chain of D (an autoregressive drafter runs once per
level, EAGLE-2 style); every candidate beyond one per depth (N - D of them per sequence) costs
``width_ms`` more (extra rows in the drafter's passes, or re-drafting under a non-top-1 parent
for a block drafter). A chain (N = D = K) costs exactly ``drafter_ms(K)``.
"""

from __future__ import annotations

import numpy as np

from wansim.config.drafter import Drafter
from wansim.config.model import (
    ComputeModel,
    LinearCompute,
    MoeCompute,
    RooflineCompute,
    TableCompute,
)
from wansim.stages import slowdown


def stage_ms(model: ComputeModel, n_tokens: np.ndarray | float) -> np.ndarray:
    """Milliseconds for one stage to process a pass of ``n_tokens`` tokens."""
    n = np.asarray(n_tokens, dtype=float)
    if isinstance(model, LinearCompute):
        return model.base_ms + model.per_token_ms * n
    if isinstance(model, RooflineCompute):
        weight_bytes = model.params_b * 1e9 * model.bytes_per_param
        flops = 2.0 * model.params_b * 1e9 * n
        return _roofline(model, weight_bytes, flops)
    if isinstance(model, MoeCompute):
        e = float(model.experts)
        touched = e * (1.0 - (1.0 - model.experts_per_token / e) ** n)
        expert_bytes = model.expert_bytes_per_param or model.bytes_per_param
        weight_bytes = 1e9 * (
            model.dense_params_b * model.bytes_per_param
            + touched * model.expert_params_b * expert_bytes
        )
        params_used = model.dense_params_b + model.experts_per_token * model.expert_params_b
        flops = 2.0 * n * params_used * 1e9
        return _roofline(model, weight_bytes, flops)
    if isinstance(model, TableCompute):
        return _table(model, n)
    raise TypeError(f"unknown compute model {model!r}")


def stage_overheads_ms(scenario) -> tuple:
    """Per stage: the fixed host-side cost of every pass, ``model.stage_overhead_ms[i]`` (else
    ``model.overhead_ms``) times ``model.host_cpu_factor`` (ms)."""
    m = scenario.model
    each = m.stage_overhead_ms or (m.overhead_ms,) * int(np.max(scenario.stages))
    return tuple(o * m.host_cpu_factor for o in each)


def stage_sequence_costs_ms(scenario) -> tuple:
    """Per stage: what each sequence beyond the first adds to a batched pass,
    ``model.stage_sequence_ms[i]`` (else ``model.sequence_ms``) times ``model.host_cpu_factor``
    (ms)."""
    m = scenario.model
    each = m.stage_sequence_ms or (m.sequence_ms,) * int(np.max(scenario.stages))
    return tuple(c * m.host_cpu_factor for c in each)


def stage_pass_ms(
    model: ComputeModel, overhead_ms: float, n_tokens, sequence_ms: float = 0.0, sequences=1
) -> np.ndarray:
    """One stage's pass of ``n_tokens`` tokens over ``sequences`` sequences (a batched pass
    holds several requests' blocks): its compute model for the tokens, its fixed overhead, and
    ``sequence_ms`` for each sequence beyond the first (ms)."""
    out = stage_ms(model, n_tokens) + overhead_ms
    if sequence_ms:
        out = out + sequence_ms * np.maximum(np.asarray(sequences, dtype=float) - 1.0, 0.0)
    return out


def stage_ms_each(scenario, n_tokens, *, mean=True, sequences=1) -> list[np.ndarray]:
    """Per stage (``Scenario.stage_compute_models``, :func:`stage_overheads_ms`,
    :func:`stage_sequence_costs_ms`): ms for a pass of ``n_tokens`` tokens over ``sequences``
    sequences; its mean under compute noise and stragglers (times E[XY],
    :mod:`wansim.stages.slowdown`) unless ``mean=False`` (the deterministic time)."""
    each = [
        stage_pass_ms(m, o, n_tokens, c, sequences)
        for m, o, c in zip(
            scenario.stage_compute_models(),
            stage_overheads_ms(scenario),
            stage_sequence_costs_ms(scenario),
            strict=True,
        )
    ]
    if mean and slowdown.active(scenario.model):
        each = [
            c * f
            for c, f in zip(each, slowdown.mean_factors(scenario.model, len(each)), strict=True)
        ]
    return each


def stages_differ(scenario) -> bool:
    """Whether stages may cost different times per pass (per-stage models, overheads or
    slowdowns): then ``stages`` is a scalar and :func:`stage_ms_each` gives each one."""
    m = scenario.model
    return bool(m.stage_compute or m.stage_overhead_ms or m.stage_sequence_ms or slowdown.active(m))


def mean_stage_ms(scenario, n_tokens, sequences=1) -> np.ndarray:
    """Mean over the stages of :func:`stage_pass_ms` (times ``stages`` = the pipeline's compute
    per pass); with none of ``model.stage_compute``, ``model.stage_overhead_ms`` and
    ``model.stage_sequence_ms`` every stage is the same and ``stages`` may be an array
    (grids)."""
    m = scenario.model
    if not stages_differ(scenario):
        f = m.host_cpu_factor
        return stage_pass_ms(m.compute, m.overhead_ms * f, n_tokens, m.sequence_ms * f, sequences)
    each = stage_ms_each(scenario, n_tokens, sequences=sequences)
    return sum(each[1:], start=each[0]) / len(each)


def _roofline(model: RooflineCompute | MoeCompute, weight_bytes, flops) -> np.ndarray:
    mem_bytes = weight_bytes + model.kv_bytes_per_token * model.context_tokens
    memory_ms = 1e3 * mem_bytes / (model.mem_bandwidth_gbs * 1e9)
    compute_ms = 1e3 * flops / (model.peak_tflops * 1e12)
    return model.overhead_ms + np.maximum(memory_ms, compute_ms)


def _table(model: TableCompute, n: np.ndarray) -> np.ndarray:
    xs = np.array([p[0] for p in model.points], dtype=float)
    ys = np.array([p[1] for p in model.points], dtype=float)
    out = np.interp(n, xs, ys)
    if len(xs) >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(n > xs[-1], ys[-1] + slope * (n - xs[-1]), out)
    return out


def draft_passes(drafter: Drafter, k: np.ndarray | int) -> np.ndarray:
    """Drafter passes to draft k tokens: 1 for a block drafter, k for an autoregressive one."""
    k = np.asarray(k)
    if drafter.parallel:
        return np.where(k > 0, 1, 0)
    return k


def drafter_ms(drafter: Drafter, k: np.ndarray | int) -> np.ndarray:
    """Milliseconds to draft a block of k tokens (0 when k = 0: no speculation)."""
    return draft_passes(drafter, k) * np.asarray(drafter.draft_ms, dtype=float)


def drafter_tree_ms(drafter: Drafter, depth, nodes, batch=1) -> np.ndarray:
    """Milliseconds to draft a tree of ``nodes`` candidates and depth ``depth`` for ``batch``
    sequences (module docstring; each pass costs ``sequence_ms`` more per sequence beyond the
    first); 0 when nothing is drafted."""
    depth = np.asarray(depth)
    nodes = np.asarray(nodes)
    passes = np.where(nodes > 0, 1, 0) if drafter.parallel else depth
    extra = np.maximum(nodes - depth, 0) * np.asarray(batch)
    per_pass = np.asarray(drafter.draft_ms, dtype=float)
    if drafter.sequence_ms:
        per_pass = per_pass + drafter.sequence_ms * np.maximum(
            np.asarray(batch, dtype=float) - 1.0, 0.0
        )
    return passes * per_pass + extra * np.asarray(drafter.width_ms, dtype=float)
