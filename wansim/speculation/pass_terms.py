"""What a verify pass costs and carries, vectorised over a grid of points (fields may be
arrays): the batch sharing a pass, the forward and return messages' bytes, the drafter's time,
and the per-point acceptance terms (passes, tau, rate factors) the analytical engine needs.

Costs per lap for a batch of b sequences (b = ``workload.concurrency`` when ``schedule.batching``
is ``continuous``, else 1; the analytical engine's lockstep batch):

- verify pass: b * tokens_per_pass tokens in every stage (``compute.stage_ms``);
- drafter: ``compute.drafter_tree_ms(drafter, depth, nodes, b)`` (chain: depth = nodes = K);
- forward hop: header + b * (tokens_per_pass * s_act + mask) bytes, mask =
  ``wire_bytes.tree_mask_bytes(N)`` for trees, 0 otherwise;
- return hop: b * ``wire_bytes.verdict_bytes(...)``: ``return_bytes``, the verified ids and
  next drafts at ``return_token_bytes`` each, the next tree (drafter on the last stage), draft
  features;
- extra tensors (``payload.extra_tensors``) add e_h bytes per token on the hops that carry them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.acceptance import closed_form
from wansim.config.scenario import Scenario
from wansim.config.schedule import FLUSH_ON_FULL_ACCEPTANCE
from wansim.links.wire_bytes import (
    activation_bytes_per_token,
    extra_bytes_per_token,
    tree_mask_bytes,
    verdict_bytes,
)
from wansim.speculation.policies import policy
from wansim.stages.compute import drafter_tree_ms


def batch_size(scenario: Scenario) -> np.ndarray:
    """Sequences sharing every pass: ``workload.concurrency`` (at most ``workload.requests``)
    with continuous batching, else 1."""
    if scenario.schedule.batching == "continuous":
        wl = scenario.workload
        return np.minimum(np.asarray(wl.concurrency), np.asarray(wl.requests))
    return np.asarray(1)


def forward_message_bytes(
    scenario: Scenario, tokens_per_pass, nodes_if_tree, batch, hop=None
) -> np.ndarray:
    """One forward message for the batch: header + b (tokens (s_act + e_hop) + tree mask), e_hop
    the extra tensors hop ``hop`` carries (:func:`wansim.links.wire_bytes.extra_bytes_per_token`; hop None:
    none)."""
    payload = scenario.payload
    s_act = activation_bytes_per_token(
        scenario.model.hidden_size, payload.activation_bits, payload.quant_group_size
    )
    if hop is not None and payload.extra_tensors:
        s_act = s_act + extra_bytes_per_token(payload, hop, int(scenario.stages))
    mask = tree_mask_bytes(nodes_if_tree)
    return np.asarray(payload.header_bytes, dtype=float) + np.asarray(batch) * (
        np.asarray(tokens_per_pass) * s_act + mask
    )


def forward_message_bytes_hops(scenario: Scenario, tokens_per_pass, nodes_if_tree, batch):
    """Per forward hop (P - 1 of them) the message of :func:`forward_message_bytes`, when
    ``payload.extra_tensors`` makes hops differ; None when every hop carries the same bytes."""
    if not scenario.payload.extra_tensors:
        return None
    return tuple(
        forward_message_bytes(scenario, tokens_per_pass, nodes_if_tree, batch, hop)
        for hop in range(int(scenario.stages) - 1)
    )


def return_message_bytes(
    scenario: Scenario, nodes_if_tree, batch, tokens_per_pass=0, nodes=0
) -> np.ndarray:
    """The verdicts of the batch on the return hop (:func:`wansim.links.wire_bytes.verdict_bytes`): per
    sequence the ids of the ``tokens_per_pass`` verified positions, and with the drafter on
    the last stage the next drafts (a chain's ``nodes`` ids, or the tree)."""
    last = scenario.drafter.placement == "last_stage"
    chain_drafts = np.asarray(nodes) - np.asarray(nodes_if_tree)
    return np.asarray(batch) * verdict_bytes(
        scenario.payload,
        nodes_if_tree,
        last,
        tokens_per_pass,
        chain_drafts,
        scenario.stages if scenario.payload.extra_tensors else None,
    )


def point_columns(scenario: Scenario, m_tokens) -> list[np.ndarray]:
    spec = scenario.speculation
    acc = scenario.drafter.acceptance
    return [
        np.asarray(spec.k),
        np.asarray(spec.tree.budget_nodes),
        np.asarray(acc.domain_shift, dtype=float),
        np.asarray(-1.0 if acc.alpha is None else acc.alpha, dtype=float),
        np.asarray(m_tokens),
        np.asarray(scenario.payload.activation_bits),
    ]


def point_scenario(scenario: Scenario, k, budget, shift, alpha, bits=None) -> Scenario:
    """A scalar copy of ``scenario`` with one point's speculation, acceptance and activation
    width (``bits``: kept as is when None)."""
    acc = dataclasses.replace(
        scenario.drafter.acceptance,
        domain_shift=float(shift),
        alpha=None if alpha < 0 else float(alpha),
    )
    spec = scenario.speculation
    spec = dataclasses.replace(
        spec, k=int(k), tree=dataclasses.replace(spec.tree, budget_nodes=int(budget))
    )
    payload = scenario.payload
    if bits is not None:
        payload = dataclasses.replace(payload, activation_bits=int(bits))
    return dataclasses.replace(
        scenario,
        speculation=spec,
        drafter=dataclasses.replace(scenario.drafter, acceptance=acc),
        payload=payload,
    )


def policy_terms(scenario: Scenario, m_tokens) -> dict[str, np.ndarray]:
    """Per point (fields may be arrays): the policy's shape and its acceptance terms.

    tokens (per sequence per pass), nodes, depth, tree_nodes (N for trees, else 0),
    passes (expected verify passes for M tokens, step-weighted over difficulty), tau = M /
    passes, rate_factor = E_w[M / E[N_Z] (1 + Var N_Z / E[N_Z]^2)] and lap_noise_factor =
    E_w[M / E[N_Z]^2] (the delta expansion of the rate: :mod:`wansim.analytical.sync`).
    Evaluated once per distinct (k, budget, domain_shift, alpha, M) and mapped back; the
    per-node values stay per distinct row: node_row (per point: its row) indexes the (rows, Q)
    tables node_weights w, node_passes E[N_Z] and node_passes_var Var N_Z (Q nodes, padded
    with zero weights).
    """
    cols = point_columns(scenario, m_tokens)
    shape = np.broadcast_shapes(*(c.shape for c in cols))
    rows, inverse = distinct_rows(cols, shape)
    names = (
        "tokens",
        "nodes",
        "depth",
        "tree_nodes",
        "passes",
        "rate_factor",
        "lap_noise_factor",
        "rate_factor_delta",
    )
    out = {n: np.empty(len(rows)) for n in names}
    per_node: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    pols, nodes = [], []
    for k, budget, shift, alpha, _m, bits in rows:
        pol = policy(point_scenario(scenario, k, budget, shift, alpha, bits))
        w, surv = pol.difficulty_nodes()
        pols.append(pol)
        nodes.append((w, commit_survival(scenario, surv)))
    # every row's pass-count recurrences at once (the same values as one row at a time)
    chains = [i for i, (_, surv) in enumerate(nodes) if surv.shape[1]]
    moments = closed_form.passes_moments_many(
        [nodes[i][1] for i in chains], [rows[i][4] for i in chains]
    )
    moments_of = dict(zip(chains, moments, strict=True))
    for i, (_k, _budget, _shift, _alpha, m, _bits) in enumerate(rows):
        pol = pols[i]
        w, surv = nodes[i]
        depth = surv.shape[1]
        if depth:
            n_mean, n_var = moments_of[i]
        else:
            n_mean, n_var = np.full(len(w), float(m)), np.zeros(len(w))
        out["tokens"][i] = pol.tokens_per_pass()
        out["nodes"][i] = pol.nodes
        out["depth"][i] = pol.depth
        out["tree_nodes"][i] = pol.nodes if pol.kind == "tree" else 0
        out["passes"][i] = w @ n_mean
        out["rate_factor_delta"][i] = w @ (m / n_mean * (1.0 + n_var / n_mean**2))
        exact = closed_form.inverse_pass_moments(surv, m) if depth else None
        if exact is not None:  # short outputs: E[M / N] exactly
            out["rate_factor"][i] = w @ (m * exact[0])
            out["lap_noise_factor"][i] = w @ (m * exact[1])
        else:
            out["rate_factor"][i] = w @ (m / n_mean * (1.0 + n_var / n_mean**2))
            out["lap_noise_factor"][i] = w @ (m / n_mean**2)
        per_node.append((w, n_mean, n_var))
    res = {n: v[inverse].reshape(shape) for n, v in out.items()}
    res["node_row"] = np.asarray(inverse).reshape(shape)
    q = max(len(w) for w, _, _ in per_node)
    for j, name in enumerate(("node_weights", "node_passes", "node_passes_var")):
        pad = 0.0 if j != 1 else 1.0  # padded nodes: weight 0, one pass (finite rates)
        table = np.full((len(rows), q), pad)
        for i, node in enumerate(per_node):
            table[i, : len(node[j])] = node[j]
        res[name] = table
    res["tau"] = np.asarray(m_tokens) / res["passes"]
    return res


def commit_survival(scenario: Scenario, survival: np.ndarray) -> np.ndarray:
    """P(committed - 1 >= d), d = 1.., per pass under the schedule's commit rule (both engines:
    the DES verifier draws from it, the closed forms count passes with it).

    Every schedule but one commits A + 1 for A accepted drafts (the bonus or correction
    token): the acceptance's own S_1..S_D. ``schedule.async_protocol:
    flush_on_full_acceptance`` commits a block's K drafts when all K are accepted (no bonus
    token), else the target's one token at the divergence: committed - 1 is K - 1 with
    probability S_K, else 0, i.e. the survival (S_K, ..., S_K) of depth K - 1."""
    if scenario.schedule.async_protocol != FLUSH_ON_FULL_ACCEPTANCE:
        return survival
    s = np.asarray(survival, dtype=float)
    return np.repeat(s[..., -1:], max(s.shape[-1] - 1, 0), axis=-1)


def drafter_ms(scenario: Scenario, terms: dict, batch) -> np.ndarray:
    """Drafter time per lap for the batch (0 without speculation)."""
    return drafter_tree_ms(scenario.drafter, terms["depth"], terms["nodes"], batch)


def distinct_rows(columns: list[np.ndarray], shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of broadcast columns and each point's row index."""
    size = int(np.prod(shape))
    if all(col.ndim == 0 for col in columns):
        return np.array([[col.item() for col in columns]]), np.zeros(size, dtype=np.int64)
    code = np.zeros(size, dtype=np.int64)
    for col in columns:
        if col.ndim == 0:
            continue
        _, inv = np.unique(np.broadcast_to(col, shape).ravel(), return_inverse=True)
        code = code * (inv.max() + 1) + inv
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    rows = np.empty((len(first), len(columns)))
    for j, col in enumerate(columns):
        rows[:, j] = col.item() if col.ndim == 0 else np.broadcast_to(col, shape).ravel()[first]
    return rows, inverse
