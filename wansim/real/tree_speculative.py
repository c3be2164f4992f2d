"""Draft trees: drafting a tree, verifying it from one pass of tree logits, and the in-process
reference of the pipeline's tree algorithm.

Tree (``wansim.acceptance.trees.Tree``): node 0 is the root, the last committed token; the
children of a node are candidates for the next position, ranked 1..c. A verify pass runs the
whole tree through every stage at once (``StageShard.forward_tree``: tree attention mask, node i
at position ``pos + depth(i)``) and the last stage gets one logits row per node.

Drafting (the draft model at stage 0, its cache primed with the committed tokens, one tree
forward per level):

- greedy (T = 0): a node's c children are the drafter's top-c tokens, rank = order;
- lossless (T > 0): the c children are drawn *without replacement* from ``q = softmax(l / T)``
  at that node (sequentially: draw, zero, renormalise), rank = draw order; ``q`` per node is
  sent with the pass;
- dynamic (greedy only, EAGLE-2): ``depth`` levels; at each, the ``width`` nodes of largest path
  probability (product of the drafter's probabilities along the path) get their ``width``
  likeliest children; at the end the ``budget`` nodes of largest path probability are kept (a
  closed set: a child's path probability never exceeds its parent's, ties go to earlier nodes).

Verification (walk from the root; ``path`` = accepted nodes, root excluded):

- greedy: descend into the child whose token is the target's argmax at the current node; stop
  when none is; the next token is that argmax. Output == plain greedy decoding.
- lossless, multi-candidate rejection sampling without replacement (Sequoia, Chen et al. 2024,
  Algorithm "SpecInfer without replacement"; SpecInfer, Miao et al. 2024): at a node, with the
  residual ``r = p`` and the drafter's ``q``, try the children in rank order: accept child x
  with probability ``min(1, r(x) / q(x))``; on rejection ``r <- norm(max(r - q, 0))``,
  ``q(x) <- 0``, ``q <- norm(q)``; if every child is rejected the next token is drawn from
  ``r``; at a leaf from ``p``. Each committed token is distributed as the target's
  ``softmax(logits / T)`` (checked by chi-square tests).

KV rollback: after the verdict every stage keeps the prefix and the accepted path's entries
(``StageShard.keep_path``), done lazily at the next pass from the ``keep`` list it carries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wansim.acceptance.trees import Tree
from wansim.real.model import StageShard
from wansim.real.speculative import (
    Drafter,
    _sample,
    check_decoding,
    probs,
    prompt_generators,
    sample_first,
)


@dataclass(frozen=True)
class DraftTree:
    """A drafted tree: its shape, each node's token (``tokens[0]`` the root) and, for lossless
    verification, ``q[i]``: the distribution node i's children were drawn from (zeros at
    leaves)."""

    shape: Tree
    tokens: tuple[int, ...]
    q: torch.Tensor | None = None

    @property
    def nodes(self) -> int:
        return self.shape.nodes


@dataclass(frozen=True)
class TreeVerdict:
    """Accepted nodes (root excluded, root-to-leaf) and the token the target adds after them."""

    path: tuple[int, ...]
    next_token: int

    @property
    def accepted(self) -> int:
        return len(self.path)


@dataclass(frozen=True)
class WalkRecord:
    """What a trace keeps of one tree step: accepted depth, the sibling rank accepted at each
    depth, and the number of candidates at each node of the walk (root first; the last entry is
    how many were tried and all rejected)."""

    accepted: int
    ranks: tuple[int, ...]
    children: tuple[int, ...]


def shape_from_parents(parents: list[int]) -> Tree:
    """The tree whose siblings are ranked in node order (how a pass sends a canonical tree)."""
    seen: dict[int, int] = {}
    rank = [0]
    for p in parents[1:]:
        seen[p] = seen.get(p, 0) + 1
        rank.append(seen[p])
    return Tree(tuple(int(p) for p in parents), tuple(rank))


def walk_record(shape: Tree, path: tuple[int, ...]) -> WalkRecord:
    return WalkRecord(
        accepted=len(path),
        ranks=tuple(shape.rank[n] for n in path),
        children=tuple(len(shape.children[n]) for n in (0, *path)),
    )


def _levels(shape: Tree) -> list[list[int]]:
    """Nodes by depth; a canonical (breadth-first) tree has each level contiguous."""
    out: list[list[int]] = [[] for _ in range(shape.max_depth + 1)]
    for i, d in enumerate(shape.depth):
        out[d].append(i)
    return out


def _without_replacement(q: torch.Tensor, c: int, gen: torch.Generator) -> list[int]:
    """c distinct tokens drawn one after another from q, each from the renormalised rest."""
    rest = q.double().clone()
    out = []
    for _ in range(c):
        if rest.sum() <= 0:
            raise ValueError(f"cannot draw {c} distinct tokens from a distribution")
        t = _sample(rest / rest.sum(), gen)
        out.append(t)
        rest[t] = 0.0
    return out


@torch.no_grad()
def draft_fixed(
    drafter: Drafter,
    committed: list[int],
    shape: Tree,
    temperature: float,
    gen: torch.Generator,
) -> DraftTree:
    """Fill a fixed (canonical) shape: one drafter forward per level with children."""
    if shape.canonical() != shape:
        raise ValueError("the tree shape must be in breadth-first (canonical) order")
    logits = {0: drafter.prime(committed)}
    pos = len(committed) - 1
    n = shape.nodes + 1
    tokens = [committed[-1]] + [0] * shape.nodes
    qs = torch.zeros(n, drafter.shard.vocab_size) if temperature > 0 else None
    levels = _levels(shape)
    for d, level in enumerate(levels):
        if d > 0 and any(shape.children[i] for i in level):
            x = torch.tensor([tokens[i] for i in level])
            out = drafter.shard.forward_tree(x, pos, list(shape.parent[: level[-1] + 1]), level[0])
            logits.update({i: out[j] for j, i in enumerate(level)})
        for i in level:
            kids = shape.children[i]
            if not kids:
                continue
            if temperature > 0:
                q = probs(logits[i], temperature).float()  # float32: what goes on the wire
                qs[i] = q
                picks = _without_replacement(q, len(kids), gen)
            else:
                picks = torch.topk(logits[i], len(kids)).indices.tolist()
            for child, t in zip(kids, picks, strict=True):
                tokens[child] = int(t)
    return DraftTree(shape, tuple(tokens), qs)


@torch.no_grad()
def draft_dynamic(
    drafter: Drafter, committed: list[int], budget: int, depth: int, width: int
) -> DraftTree:
    """EAGLE-2 shaped greedy tree (module docstring)."""
    pos = len(committed) - 1
    root_logits = drafter.prime(committed)
    # generated candidates: parent (generated index), token, path probability, rank
    g_parent, g_token, g_value, g_rank = [-1], [committed[-1]], [1.0], [0]
    f_parent, f_of = [-1], {0: 0}  # the forwarded tree (root + expanded nodes)
    logits = {0: root_logits}
    frontier = [0]
    for d in range(depth):
        new = []
        for g in frontier:
            p = torch.softmax(logits[g].double(), -1)
            top = torch.topk(p, width)
            for r, (pr, t) in enumerate(
                zip(top.values.tolist(), top.indices.tolist(), strict=True)
            ):
                g_parent.append(g)
                g_token.append(int(t))
                g_value.append(g_value[g] * pr)
                g_rank.append(r + 1)
                new.append(len(g_parent) - 1)
        if d == depth - 1:
            break
        frontier = sorted(new, key=lambda i: (-g_value[i], i))[:width]
        frontier.sort()
        first = len(f_parent)
        for g in frontier:
            f_of[g] = len(f_parent)
            f_parent.append(f_of[g_parent[g]])
        out = drafter.shard.forward_tree(
            torch.tensor([g_token[g] for g in frontier]), pos, f_parent, first
        )
        logits.update({g: out[j] for j, g in enumerate(frontier)})
    kept = set(sorted(range(1, len(g_parent)), key=lambda i: (-g_value[i], i))[:budget])
    kids: dict[int, list[int]] = {}
    for i in sorted(kept):
        kids.setdefault(g_parent[i], []).append(i)
    parent, rank, tokens, queue = [-1], [0], [committed[-1]], [(0, 0)]
    while queue:  # breadth-first renumbering, siblings by rank
        g, new_idx = queue.pop(0)
        for r, child in enumerate(sorted(kids.get(g, []), key=lambda i: g_rank[i])):
            parent.append(new_idx)
            rank.append(r + 1)
            tokens.append(g_token[child])
            queue.append((child, len(parent) - 1))
    return DraftTree(Tree(tuple(parent), tuple(rank)), tuple(tokens), None)


def verify_tree_greedy(logits: torch.Tensor, tree: DraftTree) -> TreeVerdict:
    """Greedy walk; ``logits`` has one row per node (root first)."""
    target = logits.argmax(dim=-1).tolist()
    node, path = 0, []
    while True:
        want = target[node]
        nxt = next((c for c in tree.shape.children[node] if tree.tokens[c] == want), None)
        if nxt is None:
            return TreeVerdict(tuple(path), int(want))
        path.append(nxt)
        node = nxt


def verify_tree_lossless(
    logits: torch.Tensor, tree: DraftTree, temperature: float, gen: torch.Generator
) -> TreeVerdict:
    """Multi-candidate rejection sampling without replacement (module docstring)."""
    p = probs(logits, temperature)
    node, path = 0, []
    while True:
        r = p[node].clone()
        kids = tree.shape.children[node]
        if kids and (tree.q is None or tree.q.shape[0] != tree.nodes + 1):
            raise ValueError("lossless tree verification needs q for every node")
        q = tree.q[node].double().clone() if kids else None
        accepted = None
        for c in kids:
            x = tree.tokens[c]
            u = torch.rand((), generator=gen, dtype=torch.float64)
            if q[x] > 0 and u * q[x] < r[x]:  # u < min(1, r/q)
                accepted = c
                break
            res = torch.clamp(r - q, min=0)
            if res.sum() > 0:  # else r == q: a rejection had probability 0
                r = res / res.sum()
            q[x] = 0.0
            if q.sum() > 0:
                q = q / q.sum()
        if accepted is None:
            return TreeVerdict(tuple(path), _sample(r / r.sum(), gen))
        path.append(accepted)
        node = accepted


def verify_tree(
    logits: torch.Tensor, tree: DraftTree, verifier: str, temperature: float, gen
) -> TreeVerdict:
    if verifier == "greedy":
        return verify_tree_greedy(logits, tree)
    return verify_tree_lossless(logits, tree, temperature, gen)


def draft_tree(
    drafter: Drafter,
    committed: list[int],
    tree_spec,
    fixed: Tree | None,
    temperature: float,
    gen: torch.Generator,
) -> DraftTree:
    """The pass's tree: ``fixed`` shape (static, sequoia) or a dynamic one."""
    if fixed is not None:
        return draft_fixed(drafter, committed, fixed, temperature, gen)
    return draft_dynamic(drafter, committed, tree_spec.budget, tree_spec.depth, tree_spec.width)


def commit(committed: list[int], tree: DraftTree, verdict: TreeVerdict) -> None:
    committed.extend(tree.tokens[n] for n in verdict.path)
    committed.append(verdict.next_token)


@torch.no_grad()
def tree_speculative_decode(
    target,
    drafter: Drafter,
    prompt: list[int],
    max_new_tokens: int,
    tree_spec,
    verifier: str = "greedy",
    temperature: float = 0.0,
    seed: int = 0,
    prompt_index: int = 0,
) -> tuple[list[int], list[WalkRecord]]:
    """In-process reference of the pipeline's tree algorithm: (new tokens, walk per step).

    Same drafting, verification, random streams and KV handling (``keep_path`` of the accepted
    path before the next pass) as the staged pipeline, the whole target in one process.
    """
    check_decoding(verifier, temperature, 0)
    shard = StageShard(target, 0, len(target.model.layers))
    dgen, vgen = prompt_generators(seed, prompt_index)
    drafter.reset()
    fixed = tree_spec.shape()
    fixed = fixed.canonical() if fixed is not None else None
    logits = shard.forward(torch.tensor(prompt), 0)
    committed = list(prompt)
    committed.append(sample_first(logits[-1], verifier, temperature, vgen))
    records: list[WalkRecord] = []
    prev: tuple[int, tuple[int, ...]] | None = None  # (pos, kept nodes) of the last tree pass
    while len(committed) - len(prompt) < max_new_tokens:
        tree = draft_tree(drafter, committed, tree_spec, fixed, temperature, dgen)
        pos = len(committed) - 1
        if prev is not None:
            shard.keep_path(*prev)
        logits = shard.forward_tree(torch.tensor(tree.tokens), pos, list(tree.shape.parent))
        v = verify_tree(logits, tree, verifier, temperature, vgen)
        commit(committed, tree, v)
        records.append(walk_record(tree.shape, v.path))
        prev = (pos, (0, *v.path))
    return committed[len(prompt) :][:max_new_tokens], records
