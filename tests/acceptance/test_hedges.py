"""Hedge branches (schedule.hedge_branches, sync schedule): a chain plus alternative
continuations at its likeliest rejection points. Structure against brute force, expectation
against enumeration, costs and savings in both engines, and their agreement."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.acceptance.test_trees import enumerate_expected
from tests.agreement.test_sim_agreement import check_agreement
from tests.conftest import REFERENCE
from wansim import speculation
from wansim.acceptance import trees as tr
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario, scenario_to_dict
from wansim.errors import ScenarioError


@given(
    st.lists(st.floats(0.05, 0.99), min_size=1, max_size=7),
    st.floats(0.05, 0.95),
    st.data(),
)
@settings(max_examples=60)
def test_hedges_sit_at_the_likeliest_rejection_points(p, p2, data):
    k = len(p)
    hedges = data.draw(st.integers(0, k))
    rates = np.stack([np.array(p), np.full(k, p2)], axis=1)
    tree = tr.hedged_chain(rates, k, hedges)
    # brute force: probability of rejecting the spine at depth d (reached d - 1 accepted)
    reject = [np.prod(p[: d - 1]) * (1 - p[d - 1]) for d in range(1, k + 1)]
    chosen = sorted(sorted(range(1, k + 1), key=lambda d: (-reject[d - 1], d))[:hedges])
    alt_depths = sorted(tree.depth[i] for i in range(1, tree.nodes + 1) if tree.rank[i] == 2)
    assert alt_depths == chosen
    assert tree.nodes == k + sum(k - d + 1 for d in chosen)
    assert tree.max_depth == k and tree.max_rank <= 2
    # each hedge hangs off the spine (its parent is a rank-1 node on the root's chain)
    spine = {0}
    node = 0
    while tree.children[node]:
        node = tree.children[node][0]
        spine.add(node)
    assert all(tree.parent[i] in spine for i in range(1, tree.nodes + 1) if tree.rank[i] == 2)
    if k <= 5 and tree.nodes <= 11:
        exact, _ = enumerate_expected(tree, np.vstack([rates, rates[-1:]]))
        assert np.isclose(tr.expected_tokens(tree, rates), exact)
    chain = tr.expected_tokens(tr.Tree.chain(k), rates)
    assert tr.expected_tokens(tree, rates) >= chain - 1e-12


def test_hedges_cost_width_and_save_laps():
    chain = analyze(load_scenario(REFERENCE, ["workload.output_tokens=2001"]))
    prev = chain
    for h in (1, 2, 4):
        hedged = analyze(
            load_scenario(
                REFERENCE, [f"schedule.hedge_branches={h}", "workload.output_tokens=2001"]
            )
        )
        assert hedged.metrics["tau"] > prev.metrics["tau"]
        assert hedged.details["passes_per_request"] < prev.details["passes_per_request"]
        assert hedged.metrics["lap_ms_mean"] > prev.metrics["lap_ms_mean"]
        assert hedged.details["tokens_per_pass"] > prev.details["tokens_per_pass"]
        prev = hedged
    # the hedged chain's tree is the policy's tree: tokens per pass N + 1
    pol = speculation.policy(load_scenario(REFERENCE, ["schedule.hedge_branches=2"]))
    assert pol.kind == "tree" and pol.tree_kind == "hedged-chain"
    assert (
        analyze(load_scenario(REFERENCE, ["schedule.hedge_branches=2"])).details["tokens_per_pass"]
        == pol.tree.nodes + 1
    )


def test_hedge_input_errors():
    with pytest.raises(ScenarioError, match=r"schedule\.hedge_branches.*at most one"):
        analyze(load_scenario(REFERENCE, ["schedule.hedge_branches=8"]))
    with pytest.raises(ScenarioError, match=r"schedule\.hedge_branches.*tree already"):
        analyze(load_scenario(REFERENCE, ["schedule.hedge_branches=1", "speculation.policy=tree"]))
    with pytest.raises(ScenarioError, match=r"schedule\.hedge_branches.*needs speculation"):
        analyze(load_scenario(REFERENCE, ["schedule.hedge_branches=1", "speculation.policy=none"]))
    no_siblings = {"drafter": {"acceptance": {"alpha": 0.7}}, "schedule": {"hedge_branches": 1}}
    with pytest.raises(ScenarioError, match=r"schedule\.hedge_branches.*rank-2"):
        analyze(load_scenario(data=no_siblings))


@pytest.mark.parametrize("hedges", [1, 3])
def test_des_agrees_with_analytical_for_hedges(hedges):
    sc = load_scenario(REFERENCE, [f"schedule.hedge_branches={hedges}", "workload.requests=60"])
    check_agreement(scenario_to_dict(sc), 5)


def test_cli_runs_hedges_on_both_engines(run_cli):
    import json

    code, out, err = run_cli(
        "run",
        REFERENCE,
        "--engine",
        "both",
        "--set",
        "schedule.hedge_branches=2",
        "--set",
        "workload.requests=8",
        "--json",
    )
    assert code == 0, err
    res = json.loads(out)
    assert res["des"]["tau"] > 1 and res["analytical"]["tau"] > 1
