"""Trees and verifier rules in the DES through the shared speculation module: the DES agrees
with the analytical engine (tokens/s inside the DES interval, tau inside the pass-count interval,
lap quantiles), by the same check as the chain agreement test (tests/agreement/test_sim_agreement.py),
over random tree scenarios; and the DES's sampled acceptance matches the exact tree expectation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.agreement.test_sim_agreement import REQUESTS, check_agreement, jitters
from tests.conftest import REFERENCE
from wansim import speculation
from wansim.config.scenario import load_scenario
from wansim.sim import simulate

FAST_EXAMPLES = 12
SLOW_EXAMPLES = 120
FAMILY_ALPHA = 0.05


def check_tree_agreement(data: dict, examples: int) -> None:
    """``check_agreement``, except where the DES saw no variation at all: trees with near-full
    coverage accept their whole depth almost surely, the DES interval then has zero width and the
    check demands exact equality. There the question is whether never seeing a short pass is
    plausible: P(every pass accepts the full depth) = prod over requests of S_D(Z_r)^passes_r
    must exceed the test's level."""
    try:
        check_agreement(data, examples)
    except AssertionError:
        sc = load_scenario(data=data)
        res = simulate(sc)
        passes = res.details["record"].passes
        if np.ptp(passes) != 0:
            raise
        pol = speculation.policy(sc)
        streams = np.random.SeedSequence(sc.seed).spawn(3 + 2 * sc.stages)
        surv = pol.survival(
            pol.request_rates(np.random.default_rng(streams[1]), sc.workload.requests)
        )
        full = surv[:, -1] if surv.shape[1] else np.ones(len(surv))
        log_p = float(np.sum(passes * np.log(np.maximum(full, 1e-300))))
        assert log_p > np.log(FAMILY_ALPHA / (4 * examples)), (log_p, data)


@st.composite
def tree_scenarios(draw) -> dict:
    stages = draw(st.integers(1, 12))
    kind = draw(st.sampled_from(["sequoia", "dynamic", "static"]))
    ranks = draw(st.integers(1, 4))
    offsets = sorted(draw(st.lists(st.floats(0.2, 4.0), min_size=ranks, max_size=ranks)))
    tree = {"kind": kind}
    if kind == "static":
        depth = draw(st.integers(1, 4))
        tree["branching"] = [draw(st.integers(1, ranks + 1)) for _ in range(depth)]
    else:
        tree["budget_nodes"] = draw(st.integers(1, 40))
        if draw(st.booleans()):
            tree["max_depth"] = draw(st.integers(1, 8))
    if draw(st.booleans()):
        acceptance = {"alpha": draw(st.floats(0.05, 0.97))}
    else:
        acceptance = {
            "per_position": draw(st.lists(st.floats(0.05, 1.0), min_size=1, max_size=8)),
            "extrapolate": True,
        }
    acceptance["dispersion"] = draw(st.sampled_from([0.0, 0.0, 0.1, 0.3]))
    acceptance["domain_shift"] = draw(st.sampled_from([1.0, 1.0, 0.7]))
    acceptance["sibling_logit_offsets"] = offsets
    return {
        "name": "random-tree",
        "seed": draw(st.integers(0, 2**31)),
        "stages": stages,
        "model": {
            "hidden_size": draw(st.sampled_from([256, 4096])),
            "compute": {
                "kind": "linear",
                "base_ms": draw(st.floats(0, 10)),
                "per_token_ms": draw(st.floats(0, 0.2)),
            },
        },
        "network": {
            "latency_ms": draw(st.floats(0, 100)),
            "bandwidth_mbps": 10 ** draw(st.floats(1, 4)),
            "jitter": draw(jitters()),
        },
        "payload": {"activation_bits": draw(st.sampled_from([4, 8, 16]))},
        "drafter": {
            "placement": draw(st.sampled_from(["first_stage", "last_stage"])),
            "parallel": draw(st.booleans()),
            "draft_ms": draw(st.floats(0, 5)),
            "width_ms": draw(st.floats(0, 0.5)),
            "acceptance": acceptance,
        },
        "speculation": {
            "policy": "tree",
            "tree": tree,
            "verifier": draw(st.sampled_from(["lossless", "typical"])),
        },
        "workload": {
            "requests": REQUESTS,
            "prompt_tokens": draw(st.integers(1, 512)),
            "output_tokens": draw(st.integers(33, 129)),
        },
    }


@settings(
    max_examples=FAST_EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(tree_scenarios())
def test_des_agrees_with_analytical_for_trees(data):
    check_tree_agreement(data, FAST_EXAMPLES)


@pytest.mark.slow
@settings(
    max_examples=SLOW_EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(tree_scenarios())
def test_des_agrees_with_analytical_for_trees_many(data):
    check_tree_agreement(data, SLOW_EXAMPLES)


@pytest.mark.parametrize(
    "overrides",
    [
        ["speculation.policy=tree"],
        ["speculation.policy=tree", "speculation.tree.kind=dynamic"],
        [
            "speculation.policy=tree",
            "speculation.tree.kind=static",
            "speculation.tree.branching=[3,2,2,1]",
        ],
        ["speculation.verifier=greedy"],
        ["speculation.verifier=typical", "speculation.policy=tree"],
    ],
)
def test_reference_trees_and_rules_agree(overrides):
    """The reference scenario with trees and verifier rules: analytical inside the DES intervals."""
    data = load_scenario(REFERENCE, [*overrides, "workload.requests=60"])
    from wansim.config.scenario import scenario_to_dict

    report = check_agreement(scenario_to_dict(data), 5)
    assert report["tokens_per_s"][1] < report["tokens_per_s"][2]


def test_des_sampled_acceptance_matches_the_exact_tree():
    """Per request: the DES's pre-drawn accepted counts average to the exact tree expectation."""
    sc = load_scenario(
        REFERENCE,
        [
            "speculation.policy=tree",
            "speculation.tree.kind=dynamic",
            "workload.requests=40",
            "workload.output_tokens=3000",
        ],
    )
    res = simulate(sc, timeline=True)
    log = np.array(res.details["timeline"].verify_log, dtype=float)
    pol = speculation.policy(sc)
    rates = pol.request_rates(
        np.random.default_rng(np.random.SeedSequence(sc.seed).spawn(3 + 2 * sc.stages)[1]), 40
    )
    exact = pol.survival(rates).sum(axis=1)  # E[A] per request
    for rid in range(40):
        rows = log[(log[:, 0] == rid) & (log[:, 5] > log[:, 4])]  # untruncated passes
        a = rows[:, 4]
        half = 4.5 * a.std(ddof=1) / np.sqrt(len(a))
        assert abs(a.mean() - exact[rid]) < half, rid
    assert res.metrics["target_exact"] is True
