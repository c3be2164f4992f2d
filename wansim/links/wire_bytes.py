"""Byte accounting on the wire.

Forward hop (stage i -> i+1), a pass of n tokens:

    bytes = header_bytes + n * s_act
    s_act = hidden_size * bits / 8 + (2 * ceil(hidden_size / quant_group_size) if bits < 16)

(activations at 16/8/4/3 bits; below 16 bits each group of ``quant_group_size`` values carries
one fp16 scale). Return hop (last stage -> S0): the verdict as token ids (accepted ids + the
next drafts), a fixed ``return_bytes`` message (tens of bytes).

Trees: a forward message verifying a tree of N draft nodes for one sequence carries N + 1
tokens of activations plus the tree's mask metadata, one int16 parent index per verified token
(the root's is -1), from which each stage rebuilds the ancestor attention mask:

    tree_mask_bytes(N) = PARENT_INDEX_BYTES * (N + 1)       (0 for chains: the mask is causal)

A dense packed ancestor bitmask would cost ceil((N + 1)^2 / 8) bytes; the parent list is smaller
for N > 15 and carries the same information. When the drafter sits on the last stage, the
verdict on the return hop also carries the next tree: each of its N nodes' token id and parent
index (``TREE_NODE_RETURN_BYTES`` = 4 + 2 bytes) on top of ``return_bytes``.

Extra tensors (``payload.extra_tensors``): a tensor of V values per token at b bits that stage
s's output adds and stage t consumes rides hops s .. t - 1 (hop P - 1 is the return hop, t = P
means S0), so hop h's forward message carries

    bytes_h = header_bytes + n * (s_act + e_h),   e_h = sum over tensors with s <= h < t of
              activation_bytes_per_token(V, b)

and the extras accumulate along the ring (an EAGLE-3 drafter's auxiliary hidden states taken at
a few stages grow the message at each of them).

The return message per sequence, from what it carries (:func:`verdict_bytes`):

    return_bytes                          fixed framing (request id, accepted count, ...)
    + return_token_bytes * n              the verdict: one token id per verified position (a
                                          fixed-size frame; the committed ones are a prefix)
    + return_token_bytes * K              the next chain drafts (drafter on the last stage)
    + TREE_NODE_RETURN_BYTES * N          or the next tree (drafter on the last stage)
    + n * e_(P-1)                         draft features: extra tensors carried to S0

With the defaults (``return_token_bytes: 0``, no extra tensors) this is the constant
``return_bytes`` (plus the tree) of earlier versions.

Serialisation time on a link of B Mbit/s: bytes * 8 / (B * 1000) ms.
"""

from __future__ import annotations

import numpy as np

from wansim.config.payload import Payload
from wansim.links.delivery import wire_ms

PARENT_INDEX_BYTES = 2  # int16 parent index per verified token
TOKEN_ID_BYTES = 4
TREE_NODE_RETURN_BYTES = TOKEN_ID_BYTES + PARENT_INDEX_BYTES


def activation_bytes_per_token(hidden_size, bits, group_size=128) -> np.ndarray:
    """Bytes of one token's hidden state at ``bits`` per value (scales included below 16)."""
    hidden = np.asarray(hidden_size, dtype=float)
    bits = np.asarray(bits, dtype=float)
    scales = np.where(bits < 16, 2.0 * np.ceil(hidden / np.asarray(group_size, dtype=float)), 0.0)
    return hidden * bits / 8.0 + scales


def extra_bytes_per_token(payload: Payload, hop: int, stages: int) -> float:
    """e_h: bytes per token of the extra tensors hop ``hop`` of a ring of ``stages`` carries
    (hop ``stages - 1`` is the return hop)."""
    total = 0.0
    for extra in payload.extra_tensors:
        to_stage = stages - 1 if extra.to_stage is None else extra.to_stage
        if extra.stage <= hop < to_stage:
            total += float(
                activation_bytes_per_token(
                    extra.values_per_token, extra.bits, payload.quant_group_size
                )
            )
    return total


def forward_bytes(payload: Payload, hidden_size, n_tokens, hop=None, stages=None) -> np.ndarray:
    """Bytes of one forward message carrying ``n_tokens`` tokens' activations; on hop ``hop``
    of a ring of ``stages`` also the extra tensors it carries (hop None: activations only)."""
    per_token = activation_bytes_per_token(
        hidden_size, payload.activation_bits, payload.quant_group_size
    )
    if hop is not None and payload.extra_tensors:
        per_token = per_token + extra_bytes_per_token(payload, hop, stages)
    return np.asarray(payload.header_bytes, dtype=float) + np.asarray(n_tokens) * per_token


def return_bytes(payload: Payload) -> np.ndarray:
    """Bytes of the verdict message on the return hop."""
    return np.asarray(payload.return_bytes, dtype=float)


def serialise_ms(n_bytes, bandwidth_mbps) -> np.ndarray:
    """Time to put ``n_bytes`` on a link of ``bandwidth_mbps`` megabits per second (the shared
    rule's :func:`wansim.links.delivery.wire_ms`, on arrays)."""
    return wire_ms(np.asarray(n_bytes, dtype=float), np.asarray(bandwidth_mbps, dtype=float))


def tree_mask_bytes(tree_nodes) -> np.ndarray:
    """Mask metadata per sequence for a tree of ``tree_nodes`` draft nodes (0: a chain)."""
    n = np.asarray(tree_nodes, dtype=float)
    return np.where(n > 0, PARENT_INDEX_BYTES * (n + 1), 0.0)


def verdict_bytes(
    payload: Payload,
    tree_nodes=0,
    drafter_on_last_stage=True,
    verified_tokens=0,
    chain_drafts=0,
    stages=None,
) -> np.ndarray:
    """One sequence's return message (module docstring): ``return_bytes``, the ids of the
    ``verified_tokens`` positions and of the next ``chain_drafts`` drafts at
    ``return_token_bytes`` each, the next tree's ids and parent indices (drafts only when the
    drafter sits on the last stage), and the extra tensors carried over the return hop of a
    ring of ``stages`` for every verified token."""
    tree = np.asarray(tree_nodes, dtype=float) * TREE_NODE_RETURN_BYTES
    ids = np.asarray(payload.return_token_bytes, dtype=float) * (
        np.asarray(verified_tokens, dtype=float)
        + (np.asarray(chain_drafts, dtype=float) if drafter_on_last_stage else 0.0)
    )
    features = 0.0
    # no verified ids listed (the micro-batched ring's records): no features either, and no
    # ring size needed (hunt seeds 32, 62, 76: the analytical engine crashed on int(None))
    if payload.extra_tensors and np.any(np.asarray(verified_tokens) != 0):
        features = np.asarray(verified_tokens, dtype=float) * extra_bytes_per_token(
            payload, int(stages) - 1, int(stages)
        )
    return (
        np.asarray(payload.return_bytes, dtype=float)
        + (tree if drafter_on_last_stage else 0.0)
        + ids
        + features
    )
