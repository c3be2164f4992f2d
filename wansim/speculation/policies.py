"""A scenario's speculation policy: :func:`policy` builds the :class:`Policy` of a scalar
scenario (chain, tree, hedged chain or none), with the activation width's acceptance factor
applied; :func:`target_exact` says whether the output is the target's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.acceptance.activation_quality import BitQuality
from wansim.acceptance.model import quality_for
from wansim.config.drafter import AcceptanceSpec
from wansim.config.scenario import Scenario
from wansim.errors import ScenarioError
from wansim.speculation.acceptance_rates import acceptance
from wansim.speculation.tree_verification import hedged_policy, tree_policy
from wansim.speculation.verify_pass import Policy


def bit_quality(scenario: Scenario) -> BitQuality:
    """What the scenario's activation width costs (scalar ``payload.activation_bits``):
    :mod:`wansim.acceptance.activation_quality`."""
    return quality_for(scenario.drafter.acceptance, int(scenario.payload.activation_bits))


def effective_acceptance(scenario: Scenario) -> AcceptanceSpec:
    """The scenario's acceptance with the activation width's factor f_b composed into the
    domain shift (p_i -> g f_b p_i; the factor of the scenario's verifier rule)."""
    acc = scenario.drafter.acceptance
    if scenario.speculation.policy == "none":
        return acc
    f = bit_quality(scenario).factor(scenario.speculation.verifier)
    return acc if f == 1.0 else dataclasses.replace(acc, domain_shift=acc.domain_shift * f)


def policy(scenario: Scenario) -> Policy:
    """The speculation policy of a scenario whose fields are scalars (the activation width's
    acceptance factor applied: :func:`effective_acceptance`)."""
    spec = scenario.speculation
    if spec.policy == "none":
        if scenario.schedule.hedge_branches:
            raise ScenarioError(
                "schedule.hedge_branches",
                "needs speculation (policy chain)",
                scenario.schedule.hedge_branches,
            )
        return Policy("none", None, 0, 0, None)
    acc = acceptance(effective_acceptance(scenario), spec.verifier)
    hedges = int(scenario.schedule.hedge_branches)
    if spec.policy == "chain" and hedges:
        return hedged_policy(acc, int(spec.k), hedges)
    if spec.policy == "chain":
        return Policy("chain", None, int(spec.k), int(spec.k), acc)
    if hedges:
        raise ScenarioError(
            "schedule.hedge_branches",
            "hedges a chain (policy chain); a tree already branches",
            hedges,
        )
    return tree_policy(
        acc, spec.tree.kind, spec.tree.budget_nodes, spec.tree.branching, spec.tree.max_depth
    )


def target_exact(scenario: Scenario):
    """Whether the output is the trained target's: not with typical acceptance (a lossy rule),
    not with activations below 16 bits on the wire (a lossy codec perturbs the target; see
    :mod:`wansim.acceptance.activation_quality`). ``payload.activation_bits`` may be an array
    (the analytical grid): the answer is then an array of the same shape."""
    rule = scenario.speculation.policy == "none" or scenario.speculation.verifier != "typical"
    bits = np.asarray(scenario.payload.activation_bits)
    acc = scenario.drafter.acceptance
    exact = np.vectorize(lambda b: quality_for(acc, int(b)).target_exact, otypes=[bool])(bits)
    out = np.logical_and(rule, exact)
    return bool(out) if out.ndim == 0 else out
