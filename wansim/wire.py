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

Serialisation time on a link of B Mbit/s: bytes * 8 / (B * 1000) ms.
"""

from __future__ import annotations

import numpy as np

from wansim.links.delivery import wire_ms
from wansim.scenario import Payload

PARENT_INDEX_BYTES = 2  # int16 parent index per verified token
TOKEN_ID_BYTES = 4
TREE_NODE_RETURN_BYTES = TOKEN_ID_BYTES + PARENT_INDEX_BYTES


def activation_bytes_per_token(hidden_size, bits, group_size=128) -> np.ndarray:
    """Bytes of one token's hidden state at ``bits`` per value (scales included below 16)."""
    hidden = np.asarray(hidden_size, dtype=float)
    bits = np.asarray(bits, dtype=float)
    scales = np.where(bits < 16, 2.0 * np.ceil(hidden / np.asarray(group_size, dtype=float)), 0.0)
    return hidden * bits / 8.0 + scales


def forward_bytes(payload: Payload, hidden_size, n_tokens) -> np.ndarray:
    """Bytes of one forward message carrying ``n_tokens`` tokens' activations."""
    per_token = activation_bytes_per_token(
        hidden_size, payload.activation_bits, payload.quant_group_size
    )
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


def verdict_bytes(payload: Payload, tree_nodes=0, drafter_on_last_stage=True) -> np.ndarray:
    """One sequence's verdict message on the return hop: ``return_bytes``, plus the next tree's
    token ids and parent indices when the drafter sits on the last stage."""
    extra = np.asarray(tree_nodes, dtype=float) * TREE_NODE_RETURN_BYTES
    return np.asarray(payload.return_bytes, dtype=float) + (extra if drafter_on_last_stage else 0.0)
