"""Draft trees in the real path: tree attention, KV keep-path, greedy equality with plain
decoding, lossless multi-candidate rejection sampling, the staged pipeline, trace fitting."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from real_helpers import CTX, check_first_two, chi2_pvalue, target_first_two  # noqa: E402

from wansim.acceptance.trees import Tree, static_tree  # noqa: E402
from wansim.real.config import DecodeSpec, PipelineSpec, TreeSpec  # noqa: E402
from wansim.real.errors import RealConfigError  # noqa: E402
from wansim.real.model import StageShard  # noqa: E402
from wansim.real.speculative import Drafter, plain_decode, prompt_generators  # noqa: E402
from wansim.real.tree_speculative import (  # noqa: E402
    DraftTree,
    commit,
    draft_fixed,
    tree_speculative_decode,
    verify_tree_lossless,
)

pytestmark = pytest.mark.real

TREES = [
    TreeSpec("static", branching=(2, 2, 1)),
    TreeSpec("sequoia", budget=8, depth=4, acceptance=(0.8, 0.1, 0.05)),
    TreeSpec("dynamic", budget=8, depth=4, width=2),
]


@pytest.fixture(scope="module")
def models(tiny_models):
    target_dir, drafter_dir, load_lm = tiny_models
    torch.set_num_threads(1)
    return load_lm(target_dir), load_lm(drafter_dir, field="drafter_dir")


def test_tree_pass_equals_one_chain_pass_per_path(models):
    """Every node's logits from one tree-masked pass equal those of its root-to-node path run as
    a plain chain (independent computation: no mask, no tree positions)."""
    target, _ = models
    shape = static_tree((2, 2, 1))
    tokens = [CTX[-1], 10, 32, 61, 40, 101, 115, 58, 116, 59, 97]
    assert len(tokens) == shape.nodes + 1
    pos = len(CTX) - 1
    shard = StageShard(target, 0, 6)
    shard.forward(torch.tensor(CTX[:-1]), 0)
    tree_logits = shard.forward_tree(torch.tensor(tokens), pos, list(shape.parent))
    ref = StageShard(target, 0, 6)
    for node in range(shape.nodes + 1):
        path = [node]
        while shape.parent[path[-1]] >= 0:
            path.append(shape.parent[path[-1]])
        ids = CTX[:-1] + [tokens[n] for n in reversed(path)]
        want = ref.forward(torch.tensor(ids), 0)[-1]
        torch.testing.assert_close(tree_logits[node], want, atol=1e-4, rtol=1e-4)


def test_keep_path_leaves_the_cache_of_the_accepted_path(models):
    """After a tree pass and keep_path(root + path), the next pass's logits equal a clean run
    of the committed tokens."""
    target, _ = models
    shape = static_tree((2, 2))
    tokens = [CTX[-1], 7, 9, 11, 13, 15, 17]
    pos = len(CTX) - 1
    shard = StageShard(target, 0, 6)
    shard.forward(torch.tensor(CTX[:-1]), 0)
    shard.forward_tree(torch.tensor(tokens), pos, list(shape.parent))
    path = (2, 5)  # node 2 (rank 2 at depth 1), then its first child
    assert shape.parent[5] == 2
    shard.keep_path(pos, [0, *path])
    assert shard.cache_len == pos + 3
    nxt = shard.forward(torch.tensor([21, 23]), pos + 3)
    ids = [*CTX, tokens[2], tokens[5], 21, 23]
    want = StageShard(target, 0, 6).forward(torch.tensor(ids), 0)[-2:]
    torch.testing.assert_close(nxt, want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="beyond the cache"):
        shard.keep_path(pos, [0, 99])


@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.kind)
def test_greedy_tree_decoding_equals_plain_greedy(models, code_prompts, tree):
    target, drafter_model = models
    drafter = Drafter(drafter_model)
    walks = []
    for prompt in code_prompts[:2]:
        ref = plain_decode(target, list(prompt.tokens), 30)
        out, rec = tree_speculative_decode(target, drafter, list(prompt.tokens), 30, tree)
        assert out == ref
        walks += rec
    accepted = np.array([w.accepted for w in walks])
    assert 0 < accepted.mean() < tree.max_depth  # a real drafter: some but not all accepted
    for w in walks:
        assert len(w.ranks) == w.accepted and len(w.children) == w.accepted + 1


def _synthetic_tree_draws(n: int, seed: int):
    """Target p(next | token) and drafter q(next | token) over 5 tokens; a tree with 3
    candidates at the root and 2 under its first child. Returns committed first/second counts."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(5, 5, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(5, 5, generator=g) * 1.5, -1)
    shape = Tree((-1, 0, 0, 0, 1, 1), (0, 1, 2, 3, 1, 2))
    vgen = torch.Generator().manual_seed(seed + 1)
    dgen = torch.Generator().manual_seed(seed + 2)
    first = np.zeros(5)
    second = np.zeros((5, 5))
    for _ in range(n):
        from wansim.real.tree_speculative import _without_replacement

        tokens = [0] * 6
        root_kids = _without_replacement(q[0], 3, dgen)
        tokens[1:4] = root_kids
        tokens[4:6] = _without_replacement(q[tokens[1]], 2, dgen)
        qs = torch.zeros(6, 5)
        qs[0], qs[1] = q[0], q[tokens[1]]
        logits = torch.log(p[torch.tensor(tokens)])
        v = verify_tree_lossless(logits, DraftTree(shape, tuple(tokens), qs), 1.0, vgen)
        out = [tokens[i] for i in v.path] + [v.next_token]
        if len(out) < 2:  # continue from the committed token with the target itself
            out.append(int(torch.multinomial(p[out[0]], 1, generator=vgen)))
        first[out[0]] += 1
        second[out[0], out[1]] += 1
    return first, second, p, q


def test_lossless_tree_verification_reproduces_target_on_synthetic_distributions():
    first, second, p, q = _synthetic_tree_draws(6000, seed=3)
    pd_ = p.double().numpy()
    assert chi2_pvalue(first, pd_[0]) > 1e-3
    assert chi2_pvalue(second.ravel(), (pd_[0][:, None] * pd_).ravel()) > 1e-3
    assert chi2_pvalue(first, q.double().numpy()[0]) < 1e-6  # power: the drafter's q is rejected


@pytest.mark.parametrize("n", [pytest.param(400), pytest.param(4000, marks=pytest.mark.slow)])
def test_lossless_tree_first_tokens_match_target_distribution(models, n):
    """Chi-square: the first two tokens committed by tree speculative sampling (static (2, 2, 1),
    T = 1, both from tree verify passes) follow the tiny target's own joint distribution."""
    target, drafter_model = models
    p1, p2, q1 = target_first_two(target, drafter_model)
    shape = static_tree((2, 2, 1))
    drafter = Drafter(drafter_model)
    shard = StageShard(target, 0, 6)
    shard.forward(torch.tensor(CTX[:-1]), 0)
    first = np.zeros(256)
    joint = np.zeros((256, 256))
    for s in range(n):
        dgen, vgen = prompt_generators(s, 0)
        committed = list(CTX)
        while len(committed) < len(CTX) + 2:
            tree = draft_fixed(drafter, committed, shape, 1.0, dgen)
            pos = len(committed) - 1
            logits = shard.forward_tree(torch.tensor(tree.tokens), pos, list(shape.parent))
            commit(committed, tree, verify_tree_lossless(logits, tree, 1.0, vgen))
        first[committed[len(CTX)]] += 1
        joint[committed[len(CTX)], committed[len(CTX) + 1]] += 1
    check_first_two(first, joint, p1, p2, q1)


def test_staged_tree_runs_equal_plain_and_the_in_process_reference(models, tiny_dirs, tmp_path):
    """P = 3 stages: a greedy static tree gives plain greedy output; a lossless sequoia tree
    commits exactly the tokens of the in-process reference (same random streams); the trace
    records ranks and fits sibling rates."""
    from wansim.acceptance.trace import read_trace
    from wansim.real.prompts import builtin_prompts
    from wansim.real.runner import Pipeline

    target, drafter_model = models
    target_dir, drafter_dir = tiny_dirs
    prompts = builtin_prompts("code", n=2, prompt_tokens=40, seed=2)
    spec = PipelineSpec(target_dir=target_dir, drafter_dir=drafter_dir, stages=3)
    sequoia = TREES[1]
    with Pipeline(spec, tmp_path) as pipe:
        greedy = pipe.generate(prompts, DecodeSpec(max_new_tokens=24, tree=TREES[0]), "greedy")
        lossless = pipe.generate(
            prompts,
            DecodeSpec(verifier="lossless", temperature=1.0, max_new_tokens=24, tree=sequoia),
            "lossless",
        )
    drafter = Drafter(drafter_model)
    for j, p in enumerate(prompts):
        assert greedy.outputs[p.prompt_id] == plain_decode(target, list(p.tokens), 24)
        ref, _ = tree_speculative_decode(
            target, drafter, list(p.tokens), 24, sequoia, "lossless", 1.0, 0, j
        )
        assert lossless.outputs[p.prompt_id] == ref
    frame, meta = read_trace(greedy.paths["trace"])
    assert set(frame["k"]) == {3} and "accepted_ranks" in frame.columns
    assert meta["tree"] != "none"
    assert greedy.summary["wasted_token_fraction"] > 0
    assert "profile" in greedy.paths


def _simulated_tree_trace(rates: np.ndarray, shape: Tree, steps: int, seed: int):
    """Walks on ``shape`` with known conditional rates P_{d,r} (each candidate an independent
    Bernoulli tried in rank order), written as trace rows."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    for s in range(steps):
        node, ranks, kids = 0, [], []
        while True:
            children = shape.children[node]
            kids.append(len(children))
            nxt = None
            for c in children:
                if rng.random() < rates[shape.depth[c] - 1, shape.rank[c] - 1]:
                    nxt = c
                    break
            if nxt is None:
                break
            ranks.append(shape.rank[nxt])
            node = nxt
        rows.append(
            {
                "workload": "w",
                "prompt_id": s % 10,
                "step": s,
                "k": shape.max_depth,
                "accepted": len(ranks),
                "accepted_ranks": ";".join(map(str, ranks)),
                "walk_children": ";".join(map(str, kids)),
            }
        )
    return pd.DataFrame(rows)


def test_tree_trace_fit_recovers_rank_rates_and_traces_fit_learns_siblings(tmp_path):
    """The fitted rates of walks simulated with known rates are within 4 binomial standard
    errors (seeded); ``wansim traces fit`` writes them as per_position + siblings."""
    import yaml

    from wansim.acceptance.trace import fit_tree_rates, write_trace
    from wansim.cli import main as cli_main

    rates = np.array([[0.7, 0.4, 0.2], [0.8, 0.5, 0.3], [0.6, 0.3, 0.1]])
    shape = static_tree((3, 2, 2))
    frame = _simulated_tree_trace(rates, shape, 20000, seed=5)
    fitted, tries = fit_tree_rates(frame)
    for d, r in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1)]:
        se = np.sqrt(rates[d, r] * (1 - rates[d, r]) / tries[d, r])
        assert abs(fitted[d, r] - rates[d, r]) < 4 * se, (d, r)
    assert np.isnan(fitted[1, 2])  # depth 2 has only two candidates: rank 3 never tried
    path = tmp_path / "trace.csv"
    write_trace(frame, path, {"verifier": "greedy", "temperature": 0.0})
    out = tmp_path / "profile.yaml"
    assert cli_main(["traces", "fit", str(path), "--out", str(out)]) == 0
    wl = yaml.safe_load(out.read_text())["workloads"]["w"]
    assert wl["per_position"] == pytest.approx(list(fitted[:, 0]), abs=1e-6)
    assert wl["siblings"] == pytest.approx(list(fitted[0, 1:]), abs=1e-6)


def test_tree_fit_on_a_hand_worked_trace():
    import pandas as pd

    from wansim.acceptance.trace import fit_tree_rates

    frame = pd.DataFrame(
        {
            "workload": ["w"] * 3,
            "prompt_id": [0, 0, 0],
            "step": [0, 1, 2],
            "k": [2, 2, 2],
            "accepted": [2, 1, 0],
            "accepted_ranks": ["1;2", "2", ""],
            "walk_children": ["2;2;0", "2;2", "2"],
        }
    )
    rates, tries = fit_tree_rates(frame)
    # depth 1: rank 1 tried 3 times (won once); rank 2 tried twice (after rank-1 misses), won once
    assert tries[0].tolist() == [3, 2] and rates[0].tolist() == [1 / 3, 1 / 2]
    # depth 2: step 0 tried ranks 1, 2 (won at 2); step 1 tried 1, 2 and lost both
    assert tries[1].tolist() == [2, 2] and rates[1].tolist() == [0.0, 0.5]


def test_tree_bad_input_is_one_line():
    with pytest.raises(RealConfigError, match=r"tree\.branching: makes 900 draft nodes"):
        TreeSpec("static", branching=(300, 2))
    with pytest.raises(RealConfigError, match=r"tree\.kind: dynamic trees need the greedy"):
        DecodeSpec(verifier="lossless", temperature=1.0, tree=TREES[2])
    with pytest.raises(RealConfigError, match=r"tree\.budget"):
        TreeSpec("sequoia", budget=0, depth=3, acceptance=(0.5,))
    with pytest.raises(RealConfigError, match="--tree"):
        TreeSpec.parse("sequoia:8")
    assert DecodeSpec(tree=TREES[0]).k == 3
