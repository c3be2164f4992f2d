"""Bandwidth-aware tree sizing and the tree / domain-shift comparisons built on it.

The literature review's ("Literature review, Pluralis, compiled August–October 2026") sizing model (Part III): a tree of N nodes commits tau(N) tokens per lap, and each
node costs every forward hop s_act / B (plus the mask) and every stage its share of a pass of
b (N + 1) tokens, so the best N maximises

    tokens_per_s(N) = tau(N) / T_lap(N),
    T_lap(N) = t_draft(N) + P t_stage(b (N + 1)) + sum_fwd (L + header + b (N + 1) s_act / B) + ...

tau(N) grows roughly like log N while T_lap(N) grows linearly in N with slope b s_act / B per
hop: the optimum falls as bandwidth falls and as the batch grows. :func:`best_tree` evaluates
tau(N) / T_lap(N) with the analytical engine over a list of budgets (one vectorised call).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from wansim.analytical.engine import analyze
from wansim.analytical.grid import evaluate_grid
from wansim.config.scenario import Scenario, load_scenario, scenario_to_dict

DEFAULT_BUDGETS = (2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)


def _with(scenario: Scenario, overrides: dict) -> Scenario:
    return load_scenario(data=scenario_to_dict(scenario), overrides=overrides)


def budget_curve(
    scenario: Scenario, budgets: Iterable[int] = DEFAULT_BUDGETS, kind: str = "sequoia"
):
    """Analytical metrics of ``kind`` trees over ``budgets`` (a DataFrame, one row per N)."""
    tree = _with(scenario, {"speculation.policy": "tree", "speculation.tree.kind": kind})
    return evaluate_grid(tree, {"speculation.tree.budget_nodes": list(budgets)})


def best_tree(
    scenario: Scenario,
    budgets: Iterable[int] = DEFAULT_BUDGETS,
    metric: str = "tokens_per_s",
    kind: str = "sequoia",
) -> dict:
    """The budget with the best ``metric`` and its row (dict)."""
    frame = budget_curve(scenario, budgets, kind)
    row = frame.loc[frame[metric].idxmax()]
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


def best_chain(scenario: Scenario, ks: Sequence[int] | None = None) -> dict:
    """The chain K with the best tokens/s (K up to what the acceptance covers)."""
    chain = _with(scenario, {"speculation.policy": "chain"})
    if ks is None:
        from wansim.speculation import acceptance

        acc = acceptance(chain.drafter.acceptance, chain.speculation.verifier)
        ks = range(1, acc.depth_cap(16) + 1)
    frame = evaluate_grid(chain, {"speculation.k": list(ks)})
    row = frame.loc[frame["tokens_per_s"].idxmax()]
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


def tree_vs_chain(scenario: Scenario, budgets: Iterable[int] = DEFAULT_BUDGETS) -> dict:
    """The scenario's chain against its tokens/s-optimal Sequoia tree (same everything else)."""
    chain = analyze(_with(scenario, {"speculation.policy": "chain"})).metrics
    tree = best_tree(scenario, budgets)
    return {
        "chain_tau": chain["tau"],
        "chain_tokens_per_s": chain["tokens_per_s"],
        "best_budget": int(tree["speculation.tree.budget_nodes"]),
        "tree_tau": tree["tau"],
        "tree_tokens_per_s": tree["tokens_per_s"],
        "extra_tokens_per_step": tree["tau"] - chain["tau"],
        "speedup": tree["tokens_per_s"] / chain["tokens_per_s"],
    }


def domain_shift_for(scenario: Scenario, loss: float, reading: str = "tau") -> float:
    """The ``drafter.acceptance.domain_shift`` g that loses ``loss`` of the acceptance.

    reading ``tau``: tokens per pass fall to (1 - loss) tau; ``accepted``: accepted drafts per
    pass (tau - 1, the per-draft acceptance rate times K) fall to (1 - loss)(tau - 1);
    ``to_tau``: tau falls to ``loss`` itself (e.g. 1.2 on a fine-tuned target).
    """
    field = "drafter.acceptance.domain_shift"

    def tau(g: float) -> float:
        return float(evaluate_grid(scenario, {field: [g]}, validate=False)["tau"].iloc[0])

    base = tau(1.0)

    if reading == "tau":
        target = (1 - loss) * base
    elif reading == "accepted":
        target = 1 + (1 - loss) * (base - 1)
    elif reading == "to_tau":
        target = loss
    else:
        raise ValueError(f"unknown reading {reading!r}")
    from wansim.numerics.brentq import (
        brentq,
    )  # scipy.optimize.brentq to the bit, without its import

    return float(brentq(lambda g: tau(g) - target, 1e-3, 1.0, xtol=1e-6))


def loglinear_fit(ns: Sequence[float], values: Sequence[float]) -> tuple[float, float, float]:
    """(slope per ln N, intercept, R^2) of values = a + b ln N."""
    x = np.log(np.asarray(ns, dtype=float))
    y = np.asarray(values, dtype=float)
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    return float(b), float(a), float(1 - resid.var() / y.var())
