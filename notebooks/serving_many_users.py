# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Serving many users: micro-batched pipelines
#
# *My 10-stage WAN ring serves one user at 14 tokens/s. How many users can share it, what
# throughput do I get, and what does each user's tail time per token become? Does keeping
# several batches in flight (micro-batching) help?*
#
# One continuous batch rides the ring like a single request: only the stage holding it works,
# so at 64 users the stages are still over 90% idle. With `schedule.micro_batches: N` the
# users are split into N batches that circulate at once, and `prefill_chunk_tokens` lets
# new users' prompts ride the batches' passes in chunks. A micro-batch's lap is then
# max(L, N s_max): the lap of a lone batch, or N times the slowest station once the batches
# queue for it (`docs/schedules.md`, "Micro-batched pipeline parallelism").
#
# Plan: the reference scenario, 1..128 users; chain K = 7 and a Sequoia tree of 16 nodes, each
# with one batch and with 10 micro-batches, and async in-pipe speculation (4 blocks in flight;
# async refuses micro-batches: README, "Scheduling levers"); the analytical engine for every
# point (it says where it is validated), the DES for a few, both on the same axes. The figure
# with more DES points is `wansim figures serving_many_users`.

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

import wansim
from wansim.analytical import analyze
from wansim.sim import simulate

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "scenarios").is_dir())
REFERENCE = ROOT / "scenarios" / "v4pro-dspark-10stage-wan.yaml"
ONE_BATCH = {"schedule.batching": "continuous"}
MICRO = {**ONE_BATCH, "schedule.micro_batches": 10, "schedule.prefill_chunk_tokens": 256}
TREE = {"speculation.policy": "tree", "speculation.tree.budget_nodes": 16}
ASYNC = {
    "schedule.kind": "async",
    "schedule.max_inflight_blocks": 4,
    "drafter.placement": "first_stage",
    "drafter.kind": "draft_model",
}
# (policy, micro-batches, overrides)
LINES = [
    ("chain", "off", ONE_BATCH),
    ("chain", "on", MICRO),
    ("tree", "off", {**TREE, **ONE_BATCH}),
    ("tree", "on", {**TREE, **MICRO}),
    ("async", "off", ASYNC),
]
USERS = [1, 2, 4, 8, 16, 32, 64, 128]
DES_USERS = [8, 64]  # a few DES points keep the notebook quick


def scenario(overrides, users):
    return wansim.load_scenario(
        REFERENCE,
        {
            **overrides,
            "workload.concurrency": users,
            "workload.requests": 2 * users + 8,
            "workload.output_tokens": 64,
        },
    )


def row(engine, policy, mode, users, result):
    m = result.metrics
    appr = result.approximation or {}
    return {
        "engine": engine,
        "policy": policy,
        "micro-batches": mode,
        "users": users,
        "throughput tok/s": m["throughput_tokens_per_s"],
        "TPOT p99 ms": m["tpot_ms_p99"],
        "bubble": m["bubble_fraction"],
        "validated": appr.get("validated", True),
    }


rows = []
for policy, mode, over in LINES:
    rows += [row("analytical", policy, mode, u, analyze(scenario(over, u))) for u in USERS]
    rows += [row("des", policy, mode, u, simulate(scenario(over, u))) for u in DES_USERS]
table = pd.DataFrame(rows)
print(f"{len(table)} points")
table.round(3)

# %% [markdown]
# ## Throughput against each user's TPOT p99
#
# One colour per policy; solid: micro-batching on; dashed: one batch. Lines are the analytical
# engine, markers the DES. Moving up means more tokens for everyone; moving right, a slower
# tail for each user.

# %%
COLOR = {"chain": "#1b6ca8", "tree": "#d1495b", "async": "#3a7d44"}
fig, ax = plt.subplots(figsize=(7.5, 4.6))
for policy, mode, _ in LINES:
    pick = (table.policy == policy) & (table["micro-batches"] == mode)
    a, d = table[pick & (table.engine == "analytical")], table[pick & (table.engine == "des")]
    ls, color, name = ("-" if mode == "on" else "--"), COLOR[policy], f"{policy}, mb {mode}"
    ax.plot(a["TPOT p99 ms"], a["throughput tok/s"], ls, color=color, label=f"{name} (analytical)")
    ax.plot(
        d["TPOT p99 ms"],
        d["throughput tok/s"],
        "o",
        color=color,
        mfc=color if mode == "on" else "white",
        label=f"{name} (DES)",
    )
    for _, r in a[a.users.isin([1, 8, 128])].iterrows():
        ax.annotate(int(r.users), (r["TPOT p99 ms"], r["throughput tok/s"]), fontsize=7)
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("TPOT p99 per user (ms)")
ax.set_ylabel("throughput (tokens/s, all users)")
ax.legend(frameon=False, fontsize=6.5, ncol=2)
plt.show()

# %% [markdown]
# ## What micro-batching changed, and the check against the DES
#
# At the DES points: throughput with and without micro-batches, and how far the analytical
# engine is from the DES (its result says whether it is validated there).

# %%
des = table[table.engine == "des"].set_index(["policy", "micro-batches", "users"])
ana = table[table.engine == "analytical"].set_index(["policy", "micro-batches", "users"])
for u in DES_USERS:
    for policy in ("chain", "tree"):
        on, off = (des.loc[(policy, m, u), "throughput tok/s"] for m in ("on", "off"))
        print(f"{u} users, {policy}: micro-batches deliver {on / off:.2f}x one batch (DES)")
    for policy, mode, _ in LINES:
        key = (policy, mode, u)
        err = ana.loc[key, "throughput tok/s"] / des.loc[key, "throughput tok/s"] - 1
        tail = ana.loc[key, "TPOT p99 ms"] / des.loc[key, "TPOT p99 ms"] - 1
        valid = "validated" if ana.loc[key, "validated"] else "not validated"
        print(
            f"  {policy}, micro-batches {mode}: analytical {err:+.1%} throughput,"
            f" {tail:+.1%} TPOT p99 from the DES ({valid})"
        )
