"""Tree verification: which draft tree a pass verifies, and what verifying it costs.

Shapes (``speculation.tree.kind``): ``static`` uses ``speculation.tree.branching`` (children per
node at each depth; ``budget_nodes`` is not used); ``sequoia`` is the optimal tree for the
*pooled* rates, built once (offline, as Sequoia does); ``dynamic`` is the confidence-shaped
greedy tree built per request from that request's own rates. Depth cap: ``tree.max_depth``,
else the positions the acceptance covers (all N with ``extrapolate`` or ``alpha``).

Hedge branches (``schedule.hedge_branches`` = H with policy chain, sync schedule): the chain of K
plus H alternative continuations at its H likeliest rejection points (the rank-2 candidate at
that depth, re-drafted on to depth K; :func:`wansim.acceptance.trees.hedged_chain`), chosen from
the pooled rates. They are verified as a tree and cost what a tree costs.

Cost of verifying a tree of N draft nodes, per sequence and pass (both engines; the real path's
tree mask is :mod:`wansim.real.tree_mask`):

- compute: N + 1 tokens in every stage's verify pass (``Policy.tokens_per_pass``, priced by
  :func:`wansim.stages.compute.stage_ms`);
- drafting: :func:`wansim.stages.compute.drafter_tree_ms` (depth and width of the tree);
- wire: N + 1 tokens of activations plus the parent-index mask,
  :func:`wansim.links.wire_bytes.tree_mask_bytes` = 2 (N + 1) bytes on each forward hop, and
  the next tree's ids and parents on the return hop when the drafter sits on the last stage
  (:func:`wansim.links.wire_bytes.verdict_bytes`).

Work is bounded: at most ``MAX_TREE_NODES`` nodes, and Sequoia's dynamic programme at most
``MAX_SEQUOIA_STEPS`` steps (an error naming the field otherwise).
"""

from __future__ import annotations

from functools import lru_cache

from wansim.acceptance import trees as tr
from wansim.errors import ScenarioError
from wansim.speculation.acceptance_rates import SpecAcceptance
from wansim.speculation.verify_pass import Policy

MAX_TREE_NODES = 4096
# bounded work: Sequoia's dynamic programme costs D R (N+2)^2 steps (~2e7 a second here)
MAX_SEQUOIA_STEPS = 200_000_000


@lru_cache(maxsize=256)
def hedged_policy(acc: SpecAcceptance, k: int, hedges: int) -> Policy:
    if hedges > k:
        raise ScenarioError(
            "schedule.hedge_branches", f"at most one per drafted position (K = {k})", hedges
        )
    if not acc.offsets:
        raise ScenarioError(
            "schedule.hedge_branches",
            "a hedge needs rank-2 rates: a profile with siblings or sibling_logit_offsets, or"
            " drafter.acceptance.sibling_logit_offsets",
            hedges,
        )
    tree = tr.hedged_chain(acc.pooled_rates(k), k, hedges)
    return Policy("tree", "hedged-chain", tree.nodes, tree.max_depth, acc, tree)


@lru_cache(maxsize=512)
def tree_policy(
    acc: SpecAcceptance,
    kind: str,
    budget: int,
    branching: tuple[int, ...],
    max_depth: int | None,
) -> Policy:
    if not acc.offsets and not (kind == "static" and branching and max(branching) == 1):
        raise ScenarioError(
            "speculation.policy",
            "a tree needs sibling rates: a profile with siblings or sibling_logit_offsets, or"
            " drafter.acceptance.sibling_logit_offsets",
            "tree",
        )
    if kind == "static":
        for i, b in enumerate(branching):
            if b > acc.ranks:
                raise ScenarioError(
                    f"speculation.tree.branching[{i}]",
                    f"the acceptance gives sibling rates for ranks 1..{acc.ranks}",
                    b,
                )
        nodes = tr.static_nodes(branching)
        if nodes > MAX_TREE_NODES:
            raise ScenarioError(
                "speculation.tree.branching",
                f"makes {nodes} nodes (at most {MAX_TREE_NODES})",
                list(branching),
            )
        depth = acc.depth_cap(len(branching))
        if depth < len(branching):
            raise ScenarioError(
                "speculation.tree.branching",
                f"is {len(branching)} deep; the acceptance covers positions 1..{depth} (set"
                " drafter.acceptance.extrapolate to hold the last rate)",
                list(branching),
            )
        tree = tr.static_tree(branching)
        return Policy("tree", kind, tree.nodes, tree.max_depth, acc, tree)
    depth = acc.depth_cap(min(budget, max_depth or budget))
    if kind == "sequoia":
        steps = tr.optimal_tree_steps(acc.pooled_rates(depth), budget)
        if steps > MAX_SEQUOIA_STEPS:
            raise ScenarioError(
                "speculation.tree.budget_nodes",
                f"a sequoia tree of {budget} nodes up to depth {depth} over {acc.ranks} ranks"
                f" takes {steps:.2g} steps to optimise (at most {MAX_SEQUOIA_STEPS:.0e}, ~10 s):"
                " lower budget_nodes or tree.max_depth, or use kind: dynamic",
                budget,
            )
        tree, _ = tr.optimal_tree(acc.pooled_rates(depth), budget)
        return Policy("tree", kind, tree.nodes, tree.max_depth, acc, tree)
    # dynamic: the greedy tree always fills min(budget, capacity) nodes
    capacity = sum(acc.ranks**d for d in range(1, depth + 1)) if acc.ranks > 1 else depth
    nodes = int(min(budget, capacity))
    return Policy("tree", kind, nodes, depth, acc, None)
