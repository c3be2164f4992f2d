"""Tree attention for one verify pass over a token tree (SpecInfer / Sequoia style).

Nodes are numbered so that ``parents[i] < i`` (node 0 the root, ``parents[0] == -1``). Node i
sits at absolute position ``pos + depth(i)`` and attends to the cached prefix ``[0, pos)`` and
to its ancestors and itself, never to a sibling branch: so every root-to-leaf path is computed
exactly as if it were the only continuation (tested against separate chain passes).
"""

from __future__ import annotations

import torch


def tree_depths(parents: list[int]) -> list[int]:
    """Depth of every node (root 0); ``parents[i] < i`` is required."""
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        p = int(parents[i])
        if not 0 <= p < i:
            raise ValueError(f"tree node {i}: parent must be an earlier node, got {p}")
        depth[i] = depth[p] + 1
    return depth


def ancestors(parents: list[int]) -> torch.Tensor:
    """Boolean [n, n]: ``A[i, j]`` iff node j is node i or one of its ancestors."""
    n = len(parents)
    a = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        if i > 0:
            a[i] = a[int(parents[i])]
        a[i, i] = True
    return a


def tree_attention_mask(
    parents: list[int], pos: int, first: int = 0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Additive mask [1, 1, n - first, pos + n] for nodes ``first..n-1`` of the tree: 0 where a
    query may attend (the prefix, its ancestors and itself), the dtype's minimum elsewhere."""
    n = len(parents)
    allowed = torch.ones(n - first, pos + n, dtype=torch.bool)
    allowed[:, pos:] = ancestors(parents)[first:]
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask[~allowed] = torch.finfo(dtype).min
    return mask[None, None]
