"""Token trees: exact expectation vs brute-force enumeration, optimal trees vs exhaustive search,
greedy (dynamic) trees, the verification-walk sampler vs the closed form, encodings."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from wansim.acceptance import closed_form as cf
from wansim.acceptance import trees as tr


# ----------------------------------------------------------------------------- strategies
@st.composite
def trees(draw, max_nodes=8, max_rank=3, max_depth=4):
    """A random valid tree: each new node is the next-ranked child of an earlier node."""
    n = draw(st.integers(0, max_nodes))
    parent, rank, depth, kids = [-1], [0], [0], [0]
    for _ in range(n):
        options = [i for i in range(len(parent)) if kids[i] < max_rank and depth[i] < max_depth]
        p = draw(st.sampled_from(options))
        kids[p] += 1
        parent.append(p)
        rank.append(kids[p])
        depth.append(depth[p] + 1)
        kids.append(0)
    return tr.Tree(tuple(parent), tuple(rank))


def rate_matrices(depth, ranks):
    return st.lists(
        st.lists(st.floats(0.0, 1.0), min_size=ranks, max_size=ranks),
        min_size=depth,
        max_size=depth,
    ).map(np.array)


# ----------------------------------------------------------------------------- brute force
def enumerate_expected(tree: tr.Tree, rates: np.ndarray) -> tuple[float, np.ndarray]:
    """E[tokens] and P(A = a) by enumerating every accept/reject pattern of every candidate
    (each candidate an independent Bernoulli), walking the tree deterministically per pattern."""
    n = tree.nodes
    p = np.array([rates[tree.depth[i] - 1, tree.rank[i] - 1] for i in range(1, n + 1)])
    pmf = np.zeros(tree.max_depth + 1)
    for bits in itertools.product([0, 1], repeat=n):
        prob = float(np.prod(np.where(bits, p, 1 - p))) if n else 1.0
        node, accepted = 0, 0
        while True:
            nxt = next((c for c in tree.children[node] if bits[c - 1]), None)
            if nxt is None:
                break
            node, accepted = nxt, accepted + 1
        pmf[accepted] += prob
    return 1.0 + float(np.arange(len(pmf)) @ pmf), pmf


def all_trees(max_nodes: int, max_rank: int, max_depth: int) -> list[tr.Tree]:
    """Every tree with at most ``max_nodes`` nodes (rank/depth capped), canonical, deduplicated."""
    seen = {(): tr.Tree((-1,), (0,))}
    frontier = [tr.Tree((-1,), (0,))]
    for _ in range(max_nodes):
        nxt = []
        for t in frontier:
            for p in range(t.nodes + 1):
                if len(t.children[p]) >= max_rank or t.depth[p] >= max_depth:
                    continue
                grown = tr.Tree((*t.parent, p), (*t.rank, len(t.children[p]) + 1)).canonical()
                key = tuple(grown.branching())
                if key not in seen:
                    seen[key] = grown
                    nxt.append(grown)
        frontier = nxt
    return list(seen.values())


# ----------------------------------------------------------------------------- representation
@given(trees())
def test_branching_round_trip(tree):
    rebuilt = tr.Tree.from_branching(tree.branching())
    assert rebuilt == tree.canonical()
    assert rebuilt.branching() == tree.branching()
    assert sum(tree.branching()) == tree.nodes
    assert sum(tree.level_widths) == tree.nodes


def test_invalid_trees_are_refused():
    with pytest.raises(ValueError, match=r"ranks must be 1\.\.c"):
        tr.Tree((-1, 0), (0, 2))
    with pytest.raises(ValueError, match="earlier node"):
        tr.Tree((-1, 2, 0), (0, 1, 1))
    with pytest.raises(ValueError, match="root"):
        tr.Tree((0,), (0,))
    with pytest.raises(ValueError):
        tr.Tree.from_branching([2, 0])  # two children promised, one count given


def test_static_tree_node_count():
    for branching in ([1], [3], [2, 2], [4, 2, 1], [3, 1, 2, 1]):
        t = tr.static_tree(branching)
        assert t.nodes == tr.static_nodes(branching) == sum(np.cumprod(branching))
        assert t.level_widths == tuple(int(x) for x in np.cumprod(branching))
        assert t.max_rank == max(branching)


# ----------------------------------------------------------------------------- exact expectation
@given(trees(max_nodes=9), st.data())
@settings(max_examples=60)
def test_expected_tokens_matches_enumeration(tree, data):
    rates = data.draw(rate_matrices(4, 3))
    exact, pmf = enumerate_expected(tree, rates)
    assert np.isclose(tr.expected_tokens(tree, rates), exact, atol=1e-12)
    surv = tr.survival(tree, rates)
    # P(A >= d) from the enumerated pmf
    assert np.allclose(surv, pmf[::-1].cumsum()[::-1][1:], atol=1e-12)


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10))
def test_chain_reduces_to_chain_closed_form(p):
    p = np.array(p)
    rates = np.stack([p, np.zeros_like(p)], axis=1)  # rank 2 never used by a chain
    chain = tr.Tree.chain(len(p))
    assert np.isclose(tr.expected_tokens(chain, rates), cf.tau(p), atol=1e-12)
    assert np.allclose(tr.survival(chain, rates), cf.survival(p), atol=1e-12)


def test_hand_worked_two_level_tree():
    # root with two children (ranks 1, 2); the rank-1 child has one child
    tree = tr.Tree((-1, 0, 0, 1), (0, 1, 2, 1))
    rates = np.array([[0.6, 0.5], [0.3, 0.0]])
    m1, m2 = 0.6, 0.4 * 0.5
    assert np.isclose(tr.expected_tokens(tree, rates), 1 + m1 + m2 + m1 * 0.3)


def test_leading_dimensions_broadcast():
    tree = tr.static_tree([2, 2])
    rates = np.random.default_rng(0).random((5, 3, 2, 2))
    out = tr.expected_tokens(tree, rates)
    assert out.shape == (5, 3)
    assert np.isclose(out[2, 1], tr.expected_tokens(tree, rates[2, 1]))


# ----------------------------------------------------------------------------- optimal trees
@given(st.integers(1, 6), st.integers(1, 3), st.integers(1, 4), st.data())
@settings(max_examples=40)
def test_optimal_tree_beats_every_tree(budget, ranks, depth, data):
    rates = data.draw(rate_matrices(depth, ranks))
    tree, value = tr.optimal_tree(rates, budget)
    assert tree.nodes <= budget and tree.max_depth <= depth and tree.max_rank <= ranks
    exact, _ = enumerate_expected(tree, rates)
    assert np.isclose(value, exact, atol=1e-10)
    best = max(enumerate_expected(t, rates)[0] for t in all_trees(budget, ranks, depth) if t.nodes)
    assert np.isclose(value, max(best, 1.0), atol=1e-10)


@given(st.lists(st.floats(0.01, 0.99), min_size=1, max_size=4), st.integers(1, 40))
@settings(max_examples=40)
def test_uniform_fast_path_equals_general_dp(p, budget):
    rates = tr.positional_rates(p, budget)
    t_fast, v_fast = tr.optimal_tree(rates, budget, method="uniform")
    _, v_gen = tr.optimal_tree(rates, budget, method="general")
    assert np.isclose(v_fast, v_gen, rtol=1e-12)
    assert np.isclose(tr.expected_tokens(t_fast, rates), v_fast, rtol=1e-12)


def test_cli_contract_chain_value():
    """A single-rank vector makes the optimal tree a chain: F = sum_{i=0..N} P^i."""
    for p, n in [(0.8, 5), (0.5, 12), (0.95, 30)]:
        tree, value = tr.optimal_tree(tr.positional_rates([p], n), n)
        assert tree.branching() == [1] * n + [0]
        assert np.isclose(value, sum(p**i for i in range(n + 1)))


# ----------------------------------------------------------------------------- greedy (dynamic)
@st.composite
def monotone_rates(draw, depth, ranks):
    """Rates whose marginals m_{d,r} do not increase with r (the greedy optimality condition)."""
    rows = []
    for _ in range(depth):
        m = sorted(
            draw(st.lists(st.floats(0.0, 1.0), min_size=ranks, max_size=ranks)), reverse=True
        )
        m = np.array(m) / max(1.0, sum(m) * 1.0001)
        left = np.concatenate([[1.0], 1.0 - np.cumsum(m)[:-1]])
        rows.append(np.where(left > 0, m / np.maximum(left, 1e-300), 0.0))
    return np.clip(np.array(rows), 0.0, 1.0)


@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 30), st.data())
@settings(max_examples=60)
def test_greedy_is_optimal_for_rank_monotone_marginals(ranks, depth, budget, data):
    rates = data.draw(monotone_rates(depth, ranks))
    assert np.all(np.diff(tr.marginals(rates), axis=1) <= 1e-12)
    g = tr.greedy_tree(rates, budget)
    _, best = tr.optimal_tree(rates, budget)
    assert g.max_depth <= depth and g.max_rank <= ranks and g.nodes <= budget
    assert np.isclose(tr.expected_tokens(g, rates), best, rtol=1e-9, atol=1e-12)


def test_greedy_follows_path_probability():
    rates = tr.positional_rates([0.6, 0.5], 10)  # m = 0.6, 0.2
    g = tr.greedy_tree(rates, 3)
    # pi: first child 0.6, its child 0.36, rank-2 of root 0.2 -> the chain of 3? (0.216 > 0.2)
    assert g.level_widths == (1, 1, 1)
    g4 = tr.greedy_tree(rates, 4)
    assert g4.level_widths == (2, 1, 1)  # 0.2 beats 0.6^4 = 0.1296


# ----------------------------------------------------------------------------- sampling
def exact_pmf(tree, rates):
    surv = tr.survival(tree, rates)
    s = np.concatenate([[1.0], surv, [0.0]])
    return s[:-1] - s[1:]


@given(trees(max_nodes=12, max_rank=3, max_depth=5), st.integers(0, 2**32 - 1))
@settings(max_examples=25)
def test_walk_sampler_matches_exact_law(tree, seed):
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0.05, 0.95, size=(5, 3))
    size = 20_000
    a = tr.sample_walk(rng, tree, rates, size)
    pmf = exact_pmf(tree, rates)
    mean = float(np.arange(len(pmf)) @ pmf)
    var = float(np.arange(len(pmf)) ** 2 @ pmf) - mean**2
    assert abs(a.mean() - mean) <= 5 * np.sqrt(max(var, 1e-12) / size) + 1e-9
    counts = np.bincount(a, minlength=len(pmf))
    keep = pmf * size >= 5
    if keep.sum() >= 2:
        expected = pmf[keep] * size
        observed = counts[keep]
        chi2 = (((observed - expected) ** 2) / expected).sum()
        assert stats.chi2.sf(chi2, keep.sum() - 1) > 1e-4


def test_walk_sampler_per_request_rates():
    rng = np.random.default_rng(7)
    tree = tr.static_tree([3, 2, 1])
    rates = rng.uniform(0.1, 0.9, size=(4, 3, 3))
    a = tr.sample_walk(rng, tree, rates, 40_000)
    assert a.shape == (4, 40_000)
    for i in range(4):
        pmf = exact_pmf(tree, rates[i])
        mean = float(np.arange(len(pmf)) @ pmf)
        sd = np.sqrt(float(np.arange(len(pmf)) ** 2 @ pmf) - mean**2)
        assert abs(a[i].mean() - mean) < 5 * sd / np.sqrt(40_000)


def test_survival_sampler_matches_walk_in_law():
    rng = np.random.default_rng(3)
    rates = tr.positional_rates([0.7, 0.4, 0.2], 6)
    tree, _ = tr.optimal_tree(rates, 20)
    size = 100_000
    walk = np.bincount(tr.sample_walk(rng, tree, rates, size), minlength=tree.max_depth + 1)
    surv = np.bincount(
        tr.sample_survival(rng, tr.survival(tree, rates), size), minlength=tree.max_depth + 1
    )
    _, p = stats.chisquare(
        walk + 1, (surv + 1) * (walk.sum() + len(walk)) / (surv.sum() + len(surv))
    )
    assert p > 1e-4


# ----------------------------------------------------------------------------- growth with N
def test_accepted_length_grows_like_log_n():
    """With a depth-unbounded positional model, doubling the budget adds a near-constant number
    of tokens (log growth): the increments per doubling stay within 25% of their mean for
    N = 16..512, and a log fit explains > 99% of the variance while a linear fit in N does not."""
    rates = tr.rate_matrix(np.full(600, 1.7346), 2.0 + np.log(np.arange(2, 9) - 1))  # p = 0.85
    ns = 2 ** np.arange(4, 10)
    values = np.array([tr.optimal_tree(rates, int(n))[1] for n in ns])
    inc = np.diff(values)
    assert np.all(inc > 0)
    assert np.all(np.abs(inc - inc.mean()) < 0.25 * inc.mean())
    slope, icept = np.polyfit(np.log(ns), values, 1)
    r2_log = 1 - np.var(values - (icept + slope * np.log(ns))) / np.var(values)
    lin = np.polyfit(ns, values, 1)
    r2_lin = 1 - np.var(values - np.polyval(lin, ns)) / np.var(values)
    assert r2_log > 0.99 and r2_lin < 0.9


@given(st.floats(0.01, 1.0), st.integers(0, 2**32 - 1))
def test_domain_shift_scales_every_ranks_marginal(g, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(1.5, 1.0, size=(3, 5))
    offsets = np.sort(rng.uniform(0.5, 4.0, size=3))
    base = tr.rate_matrix(logits, offsets)
    shifted = tr.rate_matrix(logits, offsets, g)
    assert np.allclose(tr.marginals(shifted), g * tr.marginals(base), atol=1e-12)
    assert np.allclose(shifted[..., 0], g * base[..., 0], atol=1e-12)
    assert np.all((shifted >= 0) & (shifted <= 1))


def test_chunked_dp_equals_one_table(monkeypatch):
    rates = tr.rate_matrix(np.linspace(2.0, 0.5, 6), [1.0, 2.0])
    tree, value = tr.optimal_tree(rates, 50)
    monkeypatch.setattr(tr, "_DP_CELLS", 7)  # a few rows per chunk
    tree2, value2 = tr.optimal_tree(rates, 50)
    assert value2 == value and tree2 == tree
