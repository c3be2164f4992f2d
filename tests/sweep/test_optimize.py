"""``wansim trees best`` and ``wansim optimize``: contracts, brute-force agreement, bad input, and
the bandwidth-aware tree sizing (the best N falls with bandwidth and with batch)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REFERENCE
from wansim.acceptance import trees as tr
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.studies.optimize import optimize, parse_over

BUDGETS = [4, 6, 8, 12, 16, 24, 32, 48, 64]


# ----------------------------------------------------------------------------- trees best
def test_trees_best_chain_contract(run_cli):
    code, out, _ = run_cli("trees", "best", "--acceptance", "0.8", "--budget-nodes", "6", "--json")
    res = json.loads(out)
    assert code == 0 and set(res) == {"expected_tokens", "nodes", "depth", "branching"}
    assert res["expected_tokens"] == pytest.approx(sum(0.8**i for i in range(7)))
    assert (res["nodes"], res["depth"], res["branching"]) == (6, 6, [1] * 6 + [0])


def test_trees_best_branching_rebuilds_the_tree(run_cli):
    args = ["--acceptance", "0.7,0.2,0.1", "--budget-nodes", "20", "--max-depth", "4", "--json"]
    res = json.loads(run_cli("trees", "best", *args)[1])
    tree = tr.Tree.from_branching(res["branching"])
    rates = tr.positional_rates([0.7, 0.2, 0.1], 4)
    assert tree.nodes == res["nodes"] == 20 and tree.max_depth == res["depth"] <= 4
    assert float(tr.expected_tokens(tree, rates)) == pytest.approx(res["expected_tokens"])
    # the DP's answer is at least the static and greedy trees' of the same size
    greedy = tr.greedy_tree(rates, 20)
    assert res["expected_tokens"] >= float(tr.expected_tokens(greedy, rates)) - 1e-12


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--acceptance", "0.7,1.5", "--budget-nodes", "4"], "--acceptance"),
        (["--acceptance", "a,b", "--budget-nodes", "4"], "--acceptance"),
        (["--acceptance", "0.7", "--budget-nodes", "four"], "--budget-nodes"),
        (["--acceptance", "0.7", "--budget-nodes", "0"], "--budget-nodes"),
        (["--acceptance", "0.7", "--budget-nodes", "4", "--max-depth", "0"], "--max-depth"),
        (["--budget-nodes", "4"], "--acceptance"),
        (["--acceptance", "0.7"], "--budget-nodes"),
    ],
)
def test_trees_best_bad_input(run_cli, args, flag):
    code, out, err = run_cli("trees", "best", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and flag in err


# ----------------------------------------------------------------------------- optimize
def test_parse_over():
    assert parse_over("speculation.k=1..4") == ("speculation.k", [1, 2, 3, 4])
    assert parse_over("a.b=4,8,16") == ("a.b", [4, 8, 16])
    assert parse_over("speculation.policy=chain,tree") == ("speculation.policy", ["chain", "tree"])


def test_optimize_matches_brute_force_and_skips_infeasible(run_cli):
    code, out, _ = run_cli(
        "optimize",
        REFERENCE,
        "--over",
        "speculation.k=1..9",
        "--over",
        "network.bandwidth_mbps=100,1000",
        "--top",
        "3",
        "--json",
    )
    res = json.loads(out)
    assert code == 0 and res["points"] == 18 and res["evaluated"] == 14  # K 8, 9 infeasible
    best = max(
        (
            analyze(
                load_scenario(REFERENCE, [f"speculation.k={k}", f"network.bandwidth_mbps={bw}"])
            ).metrics["tokens_per_s"],
            k,
            bw,
        )
        for k in range(1, 8)
        for bw in (100, 1000)
    )
    assert res["best"]["tokens_per_s"] == pytest.approx(best[0], rel=1e-9)
    assert res["best"]["config"] == {"speculation.k": best[1], "network.bandwidth_mbps": best[2]}
    values = [row["tokens_per_s"] for row in res["top"]]
    assert values == sorted(values, reverse=True) and len(values) == 3


def test_optimize_categorical_fields_and_min_metrics(run_cli):
    code, out, _ = run_cli(
        "optimize",
        REFERENCE,
        "--over",
        "speculation.policy=chain,tree",
        "--over",
        "speculation.tree.budget_nodes=8,16,32",
        "--json",
    )
    res = json.loads(out)
    assert code == 0 and res["evaluated"] == 6
    assert res["best"]["config"]["speculation.policy"] == "tree"
    code, out, _ = run_cli(
        "optimize",
        REFERENCE,
        "--over",
        "speculation.k=1..7",
        "--metric",
        "bytes_per_token",
        "--json",
    )
    res = json.loads(out)
    assert res["direction"] == "min"
    # every rejected draft's activations are wasted bytes: the shortest block wastes least
    assert res["best"]["config"] == {"speculation.k": 1}


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--over", "speculation.k"], "--over"),
        (["--over", "speculation.k=5..1"], "--over speculation.k"),
        (["--over", "speculation.k=1..3", "--metric", "speed"], "--metric"),
        (["--over", "speculation.k=1..3", "--top", "0"], "--top"),
        (["--over", "speculation.k=1..3", "--confirm", "maybe"], "--confirm"),
        (["--over", "speculation.k=20..30"], "--over"),
        ([], "--over"),
    ],
)
def test_optimize_bad_input(run_cli, args, flag):
    code, out, err = run_cli("optimize", REFERENCE, *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and flag in err


def _best_budget(*overrides: str) -> int:
    res = optimize(
        str(REFERENCE),
        [("speculation.tree.budget_nodes", BUDGETS)],
        sets=["speculation.policy=tree", *overrides],
    )
    return int(res["table"].iloc[0]["speculation.tree.budget_nodes"])


def test_best_tree_shrinks_as_bandwidth_falls():
    """Bandwidth-aware sizing: each node costs s_act / B per forward hop."""
    best = [_best_budget(f"network.bandwidth_mbps={bw}") for bw in (100, 300, 1000, 10_000)]
    assert best == sorted(best) and best[0] < best[-1]
    assert best[0] <= 8 and best[-1] >= 48


def test_best_tree_shrinks_as_batch_grows():
    """A batch of b sequences pays b (N + 1) tokens per stage and b (N + 1) activations per hop."""
    best = [
        _best_budget(
            f"workload.concurrency={b}",
            "schedule.batching=continuous",
            "network.bandwidth_mbps=10000",
        )
        for b in (1, 4, 16, 64)
    ]
    assert best == sorted(best, reverse=True) and best[0] > best[-1]


def test_optimize_is_one_vectorised_grid(run_cli, monkeypatch):
    """The 63-point grid of numeric fields is one vectorised ``evaluate_grid`` call, not 63
    scenario runs: the work bound that makes ``optimize`` answer in seconds, checked without a
    wall clock (a timed assert fails by chance under load)."""
    import wansim.analytical as analytical

    calls = []
    real = analytical.evaluate_grid

    def counted(*args, **kwargs):
        calls.append(args[1] if len(args) > 1 else kwargs.get("grid"))
        return real(*args, **kwargs)

    monkeypatch.setattr(analytical, "evaluate_grid", counted)
    code, out, err = run_cli(
        "optimize",
        REFERENCE,
        "--over",
        "speculation.k=1..7",
        "--over",
        "network.bandwidth_mbps=100,1000,10000",
        "--over",
        "network.latency_ms=5,25,80",
        "--json",
    )
    assert code == 0, err
    assert len(calls) == 1 and {k: len(v) for k, v in calls[0].items()} == {
        "speculation.k": 7,
        "network.bandwidth_mbps": 3,
        "network.latency_ms": 3,
    }
    result = json.loads(out)
    assert result["points"] == 63


def test_optimize_confirm_des(run_cli):
    """The analytical best tree budget, re-run with the DES: the analytical values lie inside the
    DES intervals, and the DES ranks the configurations the same way where they differ."""
    code, out, err = run_cli(
        "optimize",
        REFERENCE,
        "--set",
        "speculation.policy=tree",
        "--set",
        "workload.requests=60",
        "--over",
        "speculation.tree.budget_nodes=2,8,32",
        "--top",
        "3",
        "--confirm",
        "des",
        "--json",
    )
    assert code == 0, err
    res = json.loads(out)
    assert res["confirm"] == "des" and len(res["top"]) == 3
    for row in res["top"]:
        lo, hi = row["des"]["ci95"]
        assert lo < row["des"]["value"] < hi
        assert row["des"]["analytical_inside_ci95"], row
    assert res["best"]["config"] == {"speculation.tree.budget_nodes": 32}
    assert res["des_best_rank"] == 1
    worst = res["top"][-1]
    assert worst["des"]["ci95"][1] < res["top"][0]["des"]["ci95"][0]  # N = 2 clearly slower


def test_optimize_rechecks_an_unvalidated_winner_with_the_des_by_default(run_cli):
    """Loss with 4 concurrent requests lies outside every measured regime: the default
    (--confirm auto) re-runs the winner with the DES; a validated point is not re-run."""
    base = ["--set", "workload.requests=8", "--set", "workload.output_tokens=32"]
    over = ["--over", "speculation.k=3,5", "--top", "1", "--json"]
    lossy = ["--set", "workload.concurrency=4", "--set", "network.loss_rate=0.01"]
    code, out, err = run_cli("optimize", REFERENCE, *base, *lossy, *over)
    assert code == 0, err
    best = json.loads(out)["best"]
    assert best["approximation"]["validated"] is False
    assert best["des"]["value"] > 0
    code, out, err = run_cli("optimize", REFERENCE, *base, *over)
    assert code == 0, err
    best = json.loads(out)["best"]
    assert best["approximation"] == {
        "regime": "sync",
        "validated": True,
        "error_band": best["approximation"]["error_band"],
    }
    assert "des" not in best
