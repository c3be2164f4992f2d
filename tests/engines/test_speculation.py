"""The shared speculation module and the analytical engine's tree / verifier / batch support,
against hand-worked laps, enumeration and Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from scipy.special import expit, logit

from tests.acceptance.test_trees import enumerate_expected
from tests.conftest import PROFILE, REFERENCE
from wansim import speculation
from wansim.acceptance import trees as tr
from wansim.acceptance.model import acceptance_model
from wansim.analytical import analyze, evaluate_grid
from wansim.config.drafter import Drafter
from wansim.config.payload import Payload
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.links.wire_bytes import activation_bytes_per_token, tree_mask_bytes, verdict_bytes
from wansim.stages.compute import drafter_ms, drafter_tree_ms, stage_ms

OFFSETS = [1.0, 2.0]
SMALL_TREE = {
    "stages": 3,
    "model": {
        "hidden_size": 1024,
        "compute": {"kind": "linear", "base_ms": 2.0, "per_token_ms": 0.1},
    },
    "network": {"latency_ms": 10, "bandwidth_mbps": 100},
    "payload": {"activation_bits": 16, "header_bytes": 64, "return_bytes": 50},
    "drafter": {
        "draft_ms": 1.0,
        "width_ms": 0.25,
        "parallel": False,
        "acceptance": {"alpha": 0.6, "sibling_logit_offsets": OFFSETS},
    },
    "speculation": {"policy": "tree", "tree": {"kind": "static", "branching": [3, 2, 1]}},
    "workload": {"prompt_tokens": 16, "output_tokens": 1_000_001},
}


# ----------------------------------------------------------------------------- costs
def test_tree_mask_and_verdict_bytes():
    assert tree_mask_bytes(0) == 0
    assert tree_mask_bytes(32) == 2 * 33
    p = Payload(return_bytes=50)
    assert verdict_bytes(p, 0) == 50
    assert verdict_bytes(p, 10, True) == 50 + 6 * 10
    assert verdict_bytes(p, 10, False) == 50


def test_drafter_tree_cost():
    ar = Drafter(parallel=False, draft_ms=2.0, width_ms=0.1)
    block = Drafter(parallel=True, draft_ms=2.0, width_ms=0.1)
    for k in range(1, 9):  # a chain costs what drafter_ms says
        assert drafter_tree_ms(ar, k, k) == drafter_ms(ar, k)
        assert drafter_tree_ms(block, k, k) == drafter_ms(block, k)
    # tree of 20 nodes, depth 4, batch 3: 4 passes + 16 extra candidates per sequence
    assert drafter_tree_ms(ar, 4, 20, 3) == pytest.approx(4 * 2.0 + 0.1 * 16 * 3)
    assert drafter_tree_ms(block, 4, 20, 3) == pytest.approx(2.0 + 0.1 * 16 * 3)
    assert drafter_tree_ms(block, 0, 0) == 0


def test_hand_worked_tree_lap_and_rate():
    """Static tree [3, 2, 1] with alpha 0.6 and offsets [1, 2]: lap by hand, tau by
    enumeration, tokens/s = tau / lap (long output, no difficulty)."""
    r = analyze(load_scenario(data=SMALL_TREE))
    tree = tr.static_tree([3, 2, 1])
    nodes = tree.nodes
    assert nodes == 3 + 6 + 6
    n = nodes + 1
    stage = 2.0 + 0.1 * n
    fwd = 10 + (64 + n * 2048 + 2 * n) * 8 / (100 * 1000)
    ret = 10 + (50 + 6 * nodes) * 8 / (100 * 1000)
    draft = 3 * 1.0 + 0.25 * (nodes - 3)
    lap = draft + 3 * stage + 2 * fwd + ret
    rates = np.array([[0.6, expit(logit(0.6) - 1.0), expit(logit(0.6) - 2.0)]] * 3)
    tau, _ = enumerate_expected(tree, rates)
    assert r.metrics["lap_ms_mean"] == pytest.approx(lap, rel=1e-12)
    assert r.metrics["tau"] == pytest.approx(tau, rel=1e-5)
    assert r.metrics["tokens_per_s"] == pytest.approx(1000 * tau / lap, rel=1e-5)
    assert r.metrics["wasted_token_fraction"] == pytest.approx(1 - tau / n, rel=1e-5)
    assert r.metrics["bytes_per_token"] == pytest.approx(
        (2 * (64 + n * 2048 + 2 * n) + 50 + 6 * nodes) / tau, rel=1e-5
    )
    assert r.metrics["target_exact"] is True


def test_lockstep_batch_hand_worked():
    data = dict(SMALL_TREE, schedule={"batching": "continuous"})
    data["workload"] = dict(SMALL_TREE["workload"], concurrency=4)
    r = analyze(load_scenario(data=data))
    single = analyze(load_scenario(data=SMALL_TREE))
    nodes, b = 15, 4
    n = b * (nodes + 1)
    stage = 2.0 + 0.1 * n
    fwd = 10 + (64 + b * ((nodes + 1) * 2048 + 2 * (nodes + 1))) * 8 / (100 * 1000)
    ret = 10 + b * (50 + 6 * nodes) * 8 / (100 * 1000)
    draft = 3 * 1.0 + 0.25 * (nodes - 3) * b
    lap = draft + 3 * stage + 2 * fwd + ret
    # a 16-token prefill is no slower than the batch anywhere: admissions never delay it
    assert r.details["lockstep_lap_ms"] == pytest.approx(lap, rel=1e-12)
    assert r.details["convoy_ms_per_lap"] == 0.0
    assert r.metrics["lap_ms_mean"] == pytest.approx(lap, rel=1e-12)
    assert r.metrics["tau"] == pytest.approx(single.metrics["tau"], rel=1e-9)
    assert r.metrics["tokens_per_s"] == pytest.approx(1000 * r.metrics["tau"] / lap, rel=1e-5)
    # throughput counts every sequence of the batch
    ratio = r.metrics["throughput_tokens_per_s"] / r.metrics["tokens_per_s"]
    assert ratio == pytest.approx(b, rel=1e-3)


def test_batch_needs_continuous_batching():
    # without batching the 8 requests are a closed network (wansim.analytical.concurrent),
    # not a lockstep batch
    apart = analyze(load_scenario(REFERENCE, ["workload.concurrency=8"]))
    assert "closed network" in apart.details["approximation"]
    sc = load_scenario(REFERENCE, ["workload.concurrency=8", "schedule.batching=continuous"])
    batch = analyze(sc)
    assert batch.metrics["tokens_per_s"] > 0
    assert "continuous batching" in batch.details["approximation"]
    assert batch.metrics["lap_ms_mean"] != pytest.approx(apart.metrics["lap_ms_mean"])


# ----------------------------------------------------------------------------- acceptance
def test_rank_one_column_is_the_chain_model():
    sc = load_scenario(REFERENCE, ["speculation.policy=tree"])
    acc = speculation.acceptance(sc.drafter.acceptance, "lossless")
    a = acc.request_rates(np.random.default_rng(5), 50, 7)
    b = acceptance_model(sc.drafter.acceptance).request_rates(np.random.default_rng(5), 50, 7)
    assert np.allclose(a[:, :, 0], b)
    # rank r = sigmoid(logit rank-1 - offset_r) at every depth and difficulty
    offs = np.array(acc.offsets)
    assert np.allclose(logit(a[:, :, 0:1]) - logit(a[:, :, 1:]), offs, atol=1e-9)


def test_verifier_rules_shift_the_profile_rates():
    lossless = analyze(load_scenario(REFERENCE)).metrics
    greedy = analyze(load_scenario(REFERENCE, ["speculation.verifier=greedy"])).metrics
    typical = analyze(load_scenario(REFERENCE, ["speculation.verifier=typical"])).metrics
    assert lossless["tau"] < greedy["tau"] < typical["tau"]
    assert lossless["target_exact"] and greedy["target_exact"] and not typical["target_exact"]
    # the greedy model is the lossless one with every median rate shifted by the profile's +0.5
    base = acceptance_model(load_scenario(REFERENCE).drafter.acceptance)
    acc = speculation.acceptance(load_scenario(REFERENCE).drafter.acceptance, "greedy")
    assert acc.verifier_shift == 0.5
    assert np.allclose(logit(acc.model.rates), logit(base.rates) + 0.5)


def test_verifier_without_conversion_is_an_error(tmp_path):
    raw = yaml.safe_load(PROFILE.read_text())
    del raw["verifier_logit_shift"]
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(raw))
    sc = load_scenario(
        REFERENCE, [f"drafter.acceptance.profile={prof}", "speculation.verifier=typical"]
    )
    with pytest.raises(ScenarioError, match=r"speculation\.verifier.*typical"):
        analyze(sc)


def test_alpha_rates_are_the_scenarios_rule():
    data = dict(SMALL_TREE, speculation={"policy": "chain", "k": 4, "verifier": "typical"})
    typ = analyze(load_scenario(data=data)).metrics
    data["speculation"] = {"policy": "chain", "k": 4, "verifier": "lossless"}
    los = analyze(load_scenario(data=data)).metrics
    assert typ["tau"] == los["tau"] and typ["target_exact"] is False


def test_tree_errors_name_the_field():
    no_sib = dict(SMALL_TREE, drafter={"acceptance": {"alpha": 0.6}})
    with pytest.raises(ScenarioError, match=r"speculation\.policy.*sibling"):
        analyze(load_scenario(data=no_sib))
    wide = dict(
        SMALL_TREE, speculation={"policy": "tree", "tree": {"kind": "static", "branching": [4]}}
    )
    with pytest.raises(ScenarioError, match=r"branching\[0\].*ranks 1..3"):
        analyze(load_scenario(data=wide))
    with pytest.raises(ScenarioError, match=r"speculation\.tree\.branching"):
        load_scenario(REFERENCE, ["speculation.policy=tree", "speculation.tree.kind=static"])
    with pytest.raises(ScenarioError, match=r"speculation\.tree\.max_depth"):
        load_scenario(REFERENCE, ["speculation.policy=tree", "speculation.tree.max_depth=9"])


def test_difficulty_nodes_match_monte_carlo_over_requests():
    """Step-weighted tokens per pass from the quadrature vs sampled requests (difficulty drawn
    per request, passes drawn from each request's own tree)."""
    for kind in ("sequoia", "dynamic"):
        sc = load_scenario(
            REFERENCE,
            [
                "speculation.policy=tree",
                f"speculation.tree.kind={kind}",
                "speculation.tree.budget_nodes=24",
            ],
        )
        pol = speculation.policy(sc)
        w, surv = pol.difficulty_nodes()
        tau_nodes = 1 + surv.sum(axis=1)
        step_weighted = 1.0 / (w @ (1.0 / tau_nodes))
        rng = np.random.default_rng(11)
        rates = pol.request_rates(rng, 3000)
        per_request_tau = 1 + pol.survival(rates).sum(axis=1)
        a = pol.draw(rng, rates, 64)
        mc_mean_tau = (a + 1).mean(axis=1)
        # each request's sampled mean agrees with its exact tau ...
        assert abs((mc_mean_tau - per_request_tau).mean()) < 0.02
        # ... and the step-weighted mean over requests agrees with the quadrature
        mc = 1.0 / np.mean(1.0 / per_request_tau)
        assert mc == pytest.approx(step_weighted, rel=0.01)


def test_dynamic_trees_adapt_to_each_request():
    sc = load_scenario(REFERENCE, ["speculation.policy=tree", "speculation.tree.budget_nodes=16"])
    seq = speculation.policy(sc)
    dyn = speculation.policy(
        load_scenario(
            REFERENCE,
            [
                "speculation.policy=tree",
                "speculation.tree.kind=dynamic",
                "speculation.tree.budget_nodes=16",
            ],
        )
    )
    rates = seq.request_rates(np.random.default_rng(2), 200)
    t_seq = 1 + seq.survival(rates).sum(axis=1)
    t_dyn = 1 + dyn.survival(rates).sum(axis=1)
    assert np.all(t_dyn >= t_seq - 1e-9)
    assert (t_dyn > t_seq + 1e-6).mean() > 0.2


def test_walk_and_survival_draws_agree_for_policies():
    sc = load_scenario(REFERENCE, ["speculation.policy=tree", "speculation.tree.budget_nodes=20"])
    pol = speculation.policy(sc)
    rates = pol.request_rates(np.random.default_rng(0), 4)
    a = pol.draw(np.random.default_rng(1), rates, 30_000).mean(axis=1)
    b = pol.walk(np.random.default_rng(2), rates, 30_000).mean(axis=1)
    exact = pol.survival(rates).sum(axis=1)
    assert np.allclose(a, exact, atol=0.04) and np.allclose(b, exact, atol=0.04)


def test_chain_policy_unchanged_by_the_module():
    """The chain through the speculation module is the foundation's chain: tau from the
    closed form over the same difficulty nodes."""
    sc = load_scenario(REFERENCE)
    pol = speculation.policy(sc)
    w, surv = pol.difficulty_nodes()
    model = acceptance_model(sc.drafter.acceptance)
    w2, rates = model.nodes(7)
    assert np.allclose(w, w2) and np.allclose(surv, np.cumprod(rates, axis=1))
    assert pol.tokens_per_pass() == 8


# ----------------------------------------------------------------------------- grid
def test_grid_over_tree_budget_matches_one_at_a_time():
    sc = load_scenario(REFERENCE, ["speculation.policy=tree"])
    budgets = [4, 8, 16, 32]
    frame = evaluate_grid(
        sc, {"speculation.tree.budget_nodes": budgets, "network.bandwidth_mbps": [100, 1000]}
    )
    for _, row in frame.iterrows():
        one = analyze(
            load_scenario(
                REFERENCE,
                [
                    "speculation.policy=tree",
                    f"speculation.tree.budget_nodes={int(row['speculation.tree.budget_nodes'])}",
                    f"network.bandwidth_mbps={row['network.bandwidth_mbps']}",
                ],
            )
        ).metrics
        assert row["tokens_per_s"] == pytest.approx(one["tokens_per_s"], rel=1e-9)
        assert row["tau"] == pytest.approx(one["tau"], rel=1e-9)


def test_stage_cost_counts_every_verified_token():
    sc = load_scenario(
        REFERENCE,
        [
            "speculation.policy=tree",
            "speculation.tree.budget_nodes=32",
            "workload.concurrency=4",
            "schedule.batching=continuous",
        ],
    )
    r = analyze(sc)
    stage = r.details["lap_breakdown_ms"]["stage_compute"] / sc.stages
    assert r.details["tokens_per_pass"] == 33
    assert stage == pytest.approx(float(stage_ms(sc.model.compute, 4 * 33)))
    s_act = float(activation_bytes_per_token(7168, 16))
    assert s_act == 7168 * 2
