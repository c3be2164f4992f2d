"""Token trees: representation, exact expected accepted length, optimal/static/dynamic builders,
and a vectorised sampler of the verification walk.

Tree. Node 0 is the root (the last committed token, not a draft). Every other node i has a
parent ``parent[i] < i`` and a sibling rank ``rank[i] >= 1``: the children of a node are the
drafter's top-c candidates for the next position, ranked 1..c (ranks of one node's children are
exactly 1..c). Depth of the root is 0; a node at depth d drafts position d.

Positional acceptance model (Sequoia, Chen et al. 2024, generalised to depth-dependent rates).
``rates[d-1, r-1] = P_{d,r}``: the probability that the rank-r candidate at depth d is
accepted, given that its parent was accepted and the candidates ranked 1..r-1 under the same
parent were rejected. The verifier walks from the root: at an accepted node it tries the
children in rank order, descends into the first accepted one, and stops when none is. Hence

    m_{d,r}   = P_{d,r} prod_{j<r} (1 - P_{d,j})      (rank r is the accepted child)
    pi(i)     = prod over the path root -> i of m_{depth, rank}      (node i accepted)
    S_d       = sum_{i at depth d} pi(i) = P(accepted length >= d)   (at most one node per depth)
    E[tokens] = 1 + sum_i pi(i) = 1 + sum_d S_d        (the root / bonus token counts 1)

So a tree's accepted-length distribution is that of a chain with survival S_1..S_D: every chain
formula (tau, E[X^2], passes per request) applies to trees through :func:`survival`. A chain of
N nodes with rates P_{d,1} = p_d reproduces tau = 1 + sum_k prod_{i<=k} p_i exactly.

How ``rates`` are built from an acceptance model (depth-dependent chain rates, sibling ranks,
per-request difficulty, verifier rule) is :func:`rate_matrix`; rank 1 at depth d is the chain
rate p_d, and rank r >= 2 is the chain rate shifted down by a logit offset Delta_r (the profile's
``sibling_logit_offsets``, or derived from measured ``siblings``):

    P0_{d,r}(Z) = sigmoid(logit q_d + delta_v + sigma Z - Delta_r)     (Delta_1 = 0)

with q_d the median-difficulty chain rate, sigma Z the request's difficulty and delta_v the
verifier conversion (see :mod:`wansim.speculation`); a domain shift g scales every rank's
marginal mass (m_{d,r} = g m0_{d,r}: the right token is among the top-r candidates g times as
often, for every r), which for rank 1 is the chain model's P_{d,1} = g P0_{d,1}.

Builders (all take a rate matrix for depths 1..D, D the depth cap):
- :func:`static_tree`: every node at depth d-1 gets ``branching[d-1]`` children;
- :func:`optimal_tree`: Sequoia's dynamic programme, the tree of at most N nodes (root excluded)
  with the largest expected tokens, exact for the model above (checked against enumeration of
  every tree in the tests);
- :func:`greedy_tree`: confidence-shaped (EAGLE-2 style): repeatedly add the frontier candidate
  with the largest path probability pi. When m_{d,r} is non-increasing in r this is also optimal
  (top-N of a monotone value over a closure order); the difference from Sequoia in wansim is
  *what rates it sees*: a dynamic tree is shaped per request from that request's rates (the
  drafter's confidence reveals the request's difficulty), a Sequoia tree is built once offline
  from the pooled rates.
"""

from __future__ import annotations

import dataclasses
import heapq
from functools import cached_property

import numpy as np

from wansim.errors import WansimInputError

_DP_CELLS = 1 << 22  # table cells per chunk of the optimal-tree DP (~32 MB of float64)


# ----------------------------------------------------------------------------- representation
@dataclasses.dataclass(frozen=True)
class Tree:
    """A draft tree: ``parent[i]`` and ``rank[i]`` for nodes 0..N (node 0 the root: -1, 0)."""

    parent: tuple[int, ...]
    rank: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.parent) != len(self.rank) or not self.parent:
            raise ValueError("parent and rank need one entry per node, the root first")
        if self.parent[0] != -1 or self.rank[0] != 0:
            raise ValueError("node 0 is the root: parent -1, rank 0")
        ranks: dict[int, list[int]] = {}
        for i in range(1, len(self.parent)):
            p = self.parent[i]
            if not 0 <= p < i:
                raise ValueError(f"node {i}: parent must be an earlier node, got {p}")
            ranks.setdefault(p, []).append(self.rank[i])
        for p, rs in ranks.items():
            if sorted(rs) != list(range(1, len(rs) + 1)):
                raise ValueError(f"node {p}: children ranks must be 1..c, got {sorted(rs)}")

    # -- derived structure ---------------------------------------------------------------
    @property
    def nodes(self) -> int:
        """Draft nodes N (the root excluded)."""
        return len(self.parent) - 1

    @cached_property
    def depth(self) -> tuple[int, ...]:
        d = [0] * len(self.parent)
        for i in range(1, len(self.parent)):
            d[i] = d[self.parent[i]] + 1
        return tuple(d)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Children of every node, in rank order."""
        kids: list[list[tuple[int, int]]] = [[] for _ in self.parent]
        for i in range(1, len(self.parent)):
            kids[self.parent[i]].append((self.rank[i], i))
        return tuple(tuple(i for _, i in sorted(k)) for k in kids)

    @property
    def max_rank(self) -> int:
        return max(self.rank)

    @cached_property
    def level_widths(self) -> tuple[int, ...]:
        """Nodes at depth 1..max_depth."""
        return tuple(int(x) for x in np.bincount(self.depth, minlength=self.max_depth + 1)[1:])

    # -- encodings -----------------------------------------------------------------------
    def bfs_order(self) -> list[int]:
        order, queue = [], [0]
        while queue:
            node = queue.pop(0)
            order.append(node)
            queue.extend(self.children[node])
        return order

    def branching(self) -> list[int]:
        """Children count of every node in breadth-first order (root first, siblings by rank):
        enough to rebuild the tree (:meth:`from_branching`)."""
        return [len(self.children[i]) for i in self.bfs_order()]

    @classmethod
    def from_branching(cls, counts: list[int] | tuple[int, ...]) -> Tree:
        """Inverse of :meth:`branching`."""
        counts = [int(c) for c in counts]
        if not counts or any(c < 0 for c in counts):
            raise ValueError("branching needs non-negative child counts, the root first")
        parent, rank = [-1], [0]
        queue, pos = [0], 0
        while queue:
            node = queue.pop(0)
            if pos >= len(counts):
                raise ValueError("branching lists fewer nodes than the counts create")
            for r in range(1, counts[pos] + 1):
                parent.append(node)
                rank.append(r)
                queue.append(len(parent) - 1)
            pos += 1
        if pos != len(counts):
            raise ValueError(f"branching has {len(counts)} counts for a tree of {pos} nodes")
        return cls(tuple(parent), tuple(rank))

    def canonical(self) -> Tree:
        """The same tree with nodes renumbered in breadth-first order."""
        return Tree.from_branching(self.branching())

    @classmethod
    def chain(cls, n: int) -> Tree:
        return cls(tuple(range(-1, n)), (0,) + (1,) * n)


# ----------------------------------------------------------------------------- exact expectation
def marginals(rates: np.ndarray) -> np.ndarray:
    """m_{d,r} = P_{d,r} prod_{j<r} (1 - P_{d,j}) along the last axis."""
    rates = np.asarray(rates, dtype=float)
    rejected_before = np.cumprod(1.0 - rates, axis=-1)
    shifted = np.concatenate([np.ones_like(rates[..., :1]), rejected_before[..., :-1]], axis=-1)
    return rates * shifted


def _check_rates(tree: Tree, rates: np.ndarray) -> np.ndarray:
    rates = np.asarray(rates, dtype=float)
    if rates.ndim < 2:
        raise ValueError("rates need shape (..., depth, rank)")
    if tree.nodes and (rates.shape[-2] < tree.max_depth or rates.shape[-1] < tree.max_rank):
        raise ValueError(
            f"rates cover depth {rates.shape[-2]} x rank {rates.shape[-1]}, the tree needs"
            f" {tree.max_depth} x {tree.max_rank}"
        )
    return rates


def node_probabilities(tree: Tree, rates: np.ndarray) -> np.ndarray:
    """pi(i) for nodes 1..N (..., N): the probability that node i is accepted."""
    rates = _check_rates(tree, rates)
    m = marginals(rates)
    lead = rates.shape[:-2]
    pi = np.ones((*lead, tree.nodes + 1))
    for i in range(1, tree.nodes + 1):
        pi[..., i] = pi[..., tree.parent[i]] * m[..., tree.depth[i] - 1, tree.rank[i] - 1]
    return pi[..., 1:]


def survival(tree: Tree, rates: np.ndarray) -> np.ndarray:
    """S_d = P(accepted length >= d) for d = 1..max_depth (..., D)."""
    pi = node_probabilities(tree, rates)
    depth = np.asarray(tree.depth[1:])
    out = np.zeros((*pi.shape[:-1], max(tree.max_depth, 0)))
    for d in range(1, tree.max_depth + 1):
        out[..., d - 1] = pi[..., depth == d].sum(axis=-1)
    return out


def expected_tokens(tree: Tree, rates: np.ndarray) -> np.ndarray:
    """E[accepted drafts] + 1 (the root / bonus token counts)."""
    return 1.0 + node_probabilities(tree, rates).sum(axis=-1)


# ----------------------------------------------------------------------------- sampling
def sample_walk(rng: np.random.Generator, tree: Tree, rates: np.ndarray, size: int) -> np.ndarray:
    """Accepted drafts per verify pass by simulating the verifier's walk.

    ``rates`` (D, R) -> (size,); per-request rates (n, D, R) -> (n, size). Each candidate is an
    independent Bernoulli(P_{d,r}) tried in rank order at the accepted node (the first success
    is descended into); this never uses the closed form, so tests compare the two.
    """
    rates = _check_rates(tree, rates)
    single = rates.ndim == 2
    if single:
        rates = rates[None]
    n = rates.shape[0]
    kids = tree.children
    cmax = max((len(k) for k in kids), default=0)
    table = np.full((tree.nodes + 1, max(cmax, 1)), -1)
    for i, k in enumerate(kids):
        table[i, : len(k)] = k
    depth = np.asarray(tree.depth)
    rank = np.asarray(tree.rank)
    node = np.zeros((n, size), dtype=np.int64)
    accepted = np.zeros((n, size), dtype=np.int64)
    alive = np.ones((n, size), dtype=bool)
    req = np.broadcast_to(np.arange(n)[:, None], (n, size))
    for _ in range(tree.max_depth):
        cand = table[node]  # (n, size, cmax)
        exists = cand >= 0
        safe = np.where(exists, cand, 0)
        p = rates[req[..., None], depth[safe] - 1, np.maximum(rank[safe], 1) - 1]
        hit = exists & (rng.random(cand.shape) < p) & alive[..., None]
        any_hit = hit.any(axis=-1)
        first = hit.argmax(axis=-1)
        node = np.where(any_hit, np.take_along_axis(cand, first[..., None], -1)[..., 0], node)
        accepted += any_hit
        alive &= any_hit
        if not alive.any():
            break
    return accepted[0] if single else accepted


def sample_survival(rng: np.random.Generator, surv: np.ndarray, size: int) -> np.ndarray:
    """Accepted drafts from a survival vector with one uniform per pass: A = #{d : S_d > u}
    (the tree's accepted length has exactly this law; the engines use it per pass)."""
    surv = np.asarray(surv, dtype=float)
    if surv.ndim == 1:
        u = rng.random(size)
        return (surv[None, :] > u[:, None]).sum(axis=1)
    u = rng.random((surv.shape[0], size))
    return (surv[:, None, :] > u[:, :, None]).sum(axis=2)


# ----------------------------------------------------------------------------- builders
def static_tree(branching: tuple[int, ...] | list[int]) -> Tree:
    """Every node at depth d-1 gets ``branching[d-1]`` children ranked 1..b."""
    parent, rank = [-1], [0]
    level = [0]
    for b in branching:
        if b < 1:
            raise ValueError(f"branching must be >= 1 per depth, got {b}")
        nxt = []
        for node in level:
            for r in range(1, b + 1):
                parent.append(node)
                rank.append(r)
                nxt.append(len(parent) - 1)
        level = nxt
    return Tree(tuple(parent), tuple(rank))


def static_nodes(branching: tuple[int, ...] | list[int]) -> int:
    """Draft nodes of a static tree: sum_d prod_{j<=d} b_j."""
    return int(np.cumprod(np.asarray(branching, dtype=np.int64)).sum()) if len(branching) else 0


def optimal_tree_steps(rates: np.ndarray, budget: int) -> int:
    """Cells :func:`optimal_tree` evaluates: D R (N+2)^2, or R (N+2)^2 when the rates are
    depth-independent and the depth cap does not bind (its uniform case)."""
    m = marginals(np.asarray(rates, dtype=float))
    depth_cap, ranks = m.shape
    uniform = depth_cap >= budget and bool(np.all(m == m[:1]))
    return (1 if uniform else depth_cap) * ranks * (budget + 2) ** 2


def optimal_tree(rates: np.ndarray, budget: int, method: str = "auto") -> tuple[Tree, float]:
    """Sequoia's dynamic programme: the tree of at most ``budget`` draft nodes, depth at most
    ``rates.shape[0]``, ranks at most ``rates.shape[1]``, maximising expected tokens.

    f(d, n): best expected tokens of a subtree rooted at depth d with at most n nodes (itself
    included); g_r(n): best value of at most n nodes spread over ranks r.. (contiguous) of its
    children, g_r(n) = max(g_{r+1}(n)?, max_a m_{d+1,r} f(d+1, a) + g_{r+1}(n - a)) with "rank r
    unused" allowed only as "no child of rank >= r"; f(d, n) = 1 + g_1(n - 1). Returns (tree,
    expected tokens). Cost O(D R N^2) (O(R N^2) when rates are depth-independent and the depth
    cap does not bind). ``method``: auto | general | uniform (the last two for tests).
    """
    rates = np.asarray(rates, dtype=float)
    if rates.ndim != 2 or rates.shape[0] < 1 or rates.shape[1] < 1:
        raise ValueError("rates need shape (depth >= 1, ranks >= 1)")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    m = marginals(rates)
    depth_cap, ranks = m.shape
    size = budget + 1  # nodes including the root
    uniform = depth_cap >= budget and bool(np.all(m == m[:1]))
    if method == "uniform" and not uniform:
        raise ValueError("the uniform method needs depth-independent rates and depth >= budget")
    if uniform and method != "general":
        return _optimal_uniform(m[0], budget)
    # f[d, n] for d = 0..D, n = 0..size; choice[d, r, n] = nodes given to rank r+1's subtree
    f = np.zeros((depth_cap + 1, size + 1))
    f[:, 1:] = 1.0
    choice = np.zeros((depth_cap, ranks, size + 1), dtype=np.int64)
    idx_a = np.arange(size + 1)[None, :]
    rows = max(1, _DP_CELLS // (size + 1))  # rows of the (n, a) table per chunk (memory bound)
    for d in range(depth_cap - 1, -1, -1):
        g = np.zeros(size + 1)  # g_{R+1}
        for r in range(ranks - 1, -1, -1):
            g_new = np.zeros(size + 1)
            for lo in range(0, size + 1, rows):
                idx_n = np.arange(lo, min(lo + rows, size + 1))[:, None]
                value = m[d, r] * f[d + 1][idx_a] + g[np.clip(idx_n - idx_a, 0, size)]
                cand = np.where((idx_a >= 1) & (idx_a <= idx_n), value, -np.inf)
                best_a = cand.argmax(axis=1)
                best = cand[np.arange(len(idx_n)), best_a]
                use = best > 0.0  # using rank r (its value) vs no child of rank >= r
                choice[d, r, idx_n[:, 0]] = np.where(use, best_a, 0)
                g_new[idx_n[:, 0]] = np.where(use, best, 0.0)
            g = g_new
        f[d, 1:] = 1.0 + g[:-1]
    tree = _rebuild(lambda d, r, n: int(choice[d, r, n]), depth_cap, ranks, size)
    return tree, float(f[0, size])


def _optimal_uniform(m: np.ndarray, budget: int) -> tuple[Tree, float]:
    """Depth-independent marginals with no binding depth cap: f(n) does not depend on depth."""
    ranks = len(m)
    size = budget + 1
    f = np.zeros(size + 1)
    g = np.zeros((ranks + 1, size + 1))  # g[r, n] for rank r (0-based), g[ranks] = 0
    choice = np.zeros((ranks, size + 1), dtype=np.int64)
    for n in range(1, size + 1):
        f[n] = 1.0 + g[0, n - 1]
        a = np.arange(1, n + 1)
        for r in range(ranks - 1, -1, -1):
            vals = m[r] * f[a] + g[r + 1, n - a]
            j = int(vals.argmax())
            if vals[j] > 0.0:
                g[r, n], choice[r, n] = vals[j], a[j]
    tree = _rebuild(lambda d, r, n: int(choice[r, n]), size, ranks, size)
    return tree, float(f[size])


def _rebuild(choose, depth_cap: int, ranks: int, size: int) -> Tree:
    parent, rank = [-1], [0]
    stack = [(0, 0, size)]  # (node, depth, nodes available to its subtree incl. itself)
    while stack:
        node, d, n = stack.pop()
        left = n - 1
        if d >= depth_cap:
            continue
        for r in range(ranks):
            a = choose(d, r, left) if left > 0 else 0
            if a <= 0:
                break
            parent.append(node)
            rank.append(r + 1)
            stack.append((len(parent) - 1, d + 1, a))
            left -= a
    return Tree(tuple(parent), tuple(rank)).canonical()


def greedy_tree(rates: np.ndarray, budget: int) -> Tree:
    """Confidence-shaped tree: add, ``budget`` times, the frontier candidate with the largest
    path probability pi (a frontier candidate is the next-ranked child of an accepted-so-far
    node, or the first child of a node; depth at most ``rates.shape[0]``)."""
    m = marginals(np.asarray(rates, dtype=float))
    depth_cap, ranks = m.shape
    parent, rank, depth, pi = [-1], [0], [0], [1.0]
    heap: list[tuple[float, int, int, int]] = []  # (-value, order, parent, rank)
    order = 0

    def push(p: int, r: int) -> None:
        nonlocal order
        d = depth[p] + 1
        if d <= depth_cap and r <= ranks:
            heapq.heappush(heap, (-pi[p] * m[d - 1, r - 1], order, p, r))
            order += 1

    push(0, 1)
    while heap and len(parent) - 1 < budget:
        neg, _, p, r = heapq.heappop(heap)
        parent.append(p)
        rank.append(r)
        depth.append(depth[p] + 1)
        pi.append(-neg)
        push(p, r + 1)
        push(len(parent) - 1, 1)
    return Tree(tuple(parent), tuple(rank)).canonical()


def hedged_chain(rates: np.ndarray, k: int, hedges: int) -> Tree:
    """A chain of ``k`` drafts plus ``hedges`` alternative continuations at its likeliest
    rejection points (``schedule.hedge_branches`` in the sync schedule).

    The rejection point at depth i has probability S_{i-1} (1 - P_{i,1}) (reach depth i - 1 on
    the spine, then reject the spine's token); the ``hedges`` likeliest depths (ties: shallower
    first) each get the rank-2 candidate under spine node i - 1, continued by its own chain down
    to depth k (k - i + 1 nodes). ``rates``: (>= k, >= 2) design rates.
    """
    rates = np.asarray(rates, dtype=float)
    if not 0 <= hedges <= k:
        raise ValueError(f"hedges must be in 0..k = {k}, got {hedges}")
    p = rates[:k, 0]
    reach = np.concatenate([[1.0], np.cumprod(p)[:-1]])
    reject = reach * (1.0 - p)
    order = sorted(range(k), key=lambda i: (-reject[i], i))[:hedges]
    parent, rank = [-1], [0]
    for d in range(1, k + 1):  # the spine: node d at depth d
        parent.append(d - 1)
        rank.append(1)
    for i in sorted(order):  # 0-based depth index i -> depth i + 1
        prev, r = i, 2  # under spine node i (depth i), as its rank-2 child
        for _ in range(i + 1, k + 1):
            parent.append(prev)
            rank.append(r)
            prev, r = len(parent) - 1, 1
    return Tree(tuple(parent), tuple(rank)).canonical()


# ----------------------------------------------------------------------------- rate matrices
def positional_rates(acceptance: list[float] | tuple[float, ...], depth: int) -> np.ndarray:
    """Sequoia's depth-independent positional vector P_1..P_R repeated over ``depth`` rows."""
    p = np.asarray(acceptance, dtype=float)
    return np.broadcast_to(p, (depth, len(p))).copy()


def rate_matrix(chain_logits: np.ndarray, offsets: np.ndarray, shift: float = 1.0) -> np.ndarray:
    """Conditional rates P_{d,r} (module docstring): in domain P0_{d,r} = sigmoid(chain_logit_d
    - Delta_r) (Delta_1 = 0); a domain shift g scales every rank's *marginal* mass,
    m_{d,r} = g m0_{d,r}, so the chance that the right token is among the top-r candidates
    falls by g for every r (rank 1: P_{d,1} = g P0_{d,1}, the chain model's rate).

    ``chain_logits`` (..., D): logit of each depth's rank-1 rate (difficulty and verifier
    included); ``offsets`` (R - 1,): Delta_2..Delta_R. Returns (..., D, R).
    """
    from scipy.special import expit

    chain_logits = np.asarray(chain_logits, dtype=float)
    delta = np.concatenate([[0.0], np.asarray(offsets, dtype=float)])
    base = expit(chain_logits[..., :, None] - delta)
    if shift == 1.0:
        return base
    return conditional_from_marginals(shift * marginals(base))


def conditional_from_marginals(m: np.ndarray) -> np.ndarray:
    """Inverse of :func:`marginals`: P_r = m_r / (1 - sum_{j<r} m_j) (0 where nothing is left)."""
    m = np.asarray(m, dtype=float)
    left = 1.0 - np.concatenate([np.zeros_like(m[..., :1]), np.cumsum(m, axis=-1)[..., :-1]], -1)
    safe = np.where(left > 0, left, 1.0)
    return np.where(left > 0, np.clip(m / safe, 0.0, 1.0), 0.0)


def parse_acceptance_vector(text: str, flag: str = "--acceptance") -> list[float]:
    """'0.8,0.1,0.05' -> [0.8, 0.1, 0.05] (each in [0, 1]); one-line errors naming the flag."""
    try:
        values = [float(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise WansimInputError(flag, "needs comma-separated numbers", text) from None
    if not values:
        raise WansimInputError(flag, "needs at least one rate", text)
    bad = [v for v in values if not (0.0 <= v <= 1.0) or not np.isfinite(v)]
    if bad:
        raise WansimInputError(flag, "rates must lie in [0, 1]", text)
    return values
