"""How much a cell's acceptance depends on which prompts it happens to decode.

Greedy decoding of fixed prompts repeats exactly, so where a cell's rounds replay one sample
(``--same-prompts``) its run-to-run spread never shows the prompt sample (by default each round
draws its own: :func:`round_prompt_seed`); yet a cell of a few prompts is a small sample of its
workload, and
its tau (decode tokens per verify pass) differs from the workload's by far more than the runs
differ from each other (measured: tau at K = 7 over 4 prompts x 48 tokens ranged 3.0-6.8 across
twelve draws of 4 prompts of the same workload). A prediction made from the workload's profile
cannot be judged closer to a cell than that sample allows.

Model: a request of M = tokens - 1 decode tokens commits min(A + 1, remaining) per verify pass
(the engines' and the reconciled real metrics' rule), so prompt j needs P_j passes, read off
its own trace (the accepted count per step, decoded in process). A cell of n prompts has
tau = n M / sum_j P_j; drawing n of the profile's prompts with replacement gives that tau's
sampling distribution (the bootstrap; prompts are the unit, since steps within a prompt are
correlated). Assumption: the cell's prompts and the profile's are draws from one workload.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

DRAWS = 4000
SEED = 0
TRACE_COLUMNS = ("drafter", "prompt_id", "k", "step", "accepted")
CHAIN_SHAPED = ("chain", "mtp")  # trace kinds whose steps are chains (not the static tree)
CELL_SEED = 0  # held-out prompts, round 0 (round r: CELL_SEED + r; the bundle's: PROFILE_SEED)


def round_prompt_seed(r: int, same_prompts: bool = False) -> int:
    """The seed of round ``r``'s held-out prompts: a sample of its own, or round 0's."""
    return CELL_SEED if same_prompts else CELL_SEED + r


def cell_prompts(n: int, prompt_tokens: int, seed: int) -> list:
    """``n`` held-out prompts drawn with ``seed`` (ids n x (seed - CELL_SEED) on, so the
    samples of several rounds pooled keep distinct ids)."""
    from wansim.real.prompts import builtin_prompts

    return builtin_prompts("code", n, prompt_tokens, seed=seed, first_id=n * (seed - CELL_SEED))


def prompt_seeds(runs: list[dict]) -> list[int]:
    """The distinct prompt samples a cell's runs decoded (runs recorded before rounds had
    samples of their own replayed round 0's)."""
    return sorted({int(r.get("prompt_seed", CELL_SEED)) for r in runs})


def prompts_decoded(cell, runs: list[dict]) -> int:
    """Distinct prompts a cell's runs decoded: its prompts a run x the samples they drew (one
    for a cell not run yet)."""
    return cell.prompts * max(len(prompt_seeds(runs)), 1)


def drafter_kind(cell) -> str:
    """The trace a cell's acceptance comes from: ``mtp``, ``tree`` (the profiled static tree of
    2K nodes) or ``chain``."""
    return "mtp" if cell.drafter == "mtp" else ("tree" if cell.tree_branching else "chain")


def prompt_passes(accepted: Sequence[int], decode_tokens: int) -> int | None:
    """Verify passes that commit ``decode_tokens`` (each commits min(A + 1, remaining));
    None when the trace ends first."""
    if decode_tokens <= 0:
        return 0
    committed = 0
    for passes, a in enumerate(accepted, start=1):
        committed += int(a) + 1
        if committed >= decode_tokens:
            return passes
    return None


def steps_reached(trace: pd.DataFrame, decode_tokens: int) -> pd.DataFrame:
    """The trace's steps a request of ``decode_tokens`` decode tokens reaches: per prompt (and
    K, and drafter), the steps that start before that many tokens are committed (each step
    commits A + 1; the step that crosses the end is kept, it is verified in full). Used to fit
    a workload of shorter requests than the traces (:mod:`wansim.calibrate.length_profile`)."""
    keys = ["drafter", "k", "prompt_id"] if "drafter" in trace.columns else ["k", "prompt_id"]
    ordered = trace.sort_values([*keys, "step"])
    commits = ordered["accepted"] + 1
    before = commits.groupby([ordered[c] for c in keys], sort=False).cumsum() - commits
    return ordered[before < decode_tokens]


def passes_per_prompt(trace: pd.DataFrame, drafter: str, k: int, tokens: int) -> np.ndarray | None:
    """P_j of every prompt the trace holds for (``drafter``, ``k``), at ``tokens`` output tokens
    (M = tokens - 1 decode tokens); None when any prompt's trace is too short or none exists."""
    rows = trace[(trace["drafter"] == drafter) & (trace["k"] == k)]
    if rows.empty:
        return None
    out = []
    for _, g in rows.sort_values(["prompt_id", "step"]).groupby("prompt_id", sort=True):
        p = prompt_passes(g["accepted"].to_numpy(int), tokens - 1)
        if p is None:
            return None
        out.append(p)
    return np.asarray(out, dtype=float)


def sample_tau(
    passes: np.ndarray, prompts: int, tokens: int, draws: int = DRAWS, seed: int = SEED
) -> dict:
    """tau of ``prompts`` prompts drawn with replacement from those of ``passes`` (bootstrap):
    the workload's tau (all prompts pooled), the draws' mean, 2.5 / 97.5 percentiles and
    ``half_width`` = (p97.5 - p2.5) / 2 / workload tau (relative)."""
    m = tokens - 1
    rng = np.random.default_rng(seed)
    idx = rng.integers(len(passes), size=(draws, prompts))
    tau = prompts * m / passes[idx].sum(axis=1)
    pooled = len(passes) * m / passes.sum()
    lo, hi = np.percentile(tau, [2.5, 97.5])
    return {
        "profile_prompts": len(passes),
        "prompts": prompts,
        "tokens": tokens,
        "draws": draws,
        "tau_workload": float(pooled),
        "tau_mean": float(tau.mean()),
        "tau_p2_5": float(lo),
        "tau_p97_5": float(hi),
        "half_width": float((hi - lo) / 2 / pooled),
        "_draws": tau,
    }


def cell_band(trace: pd.DataFrame | None, cell, real_tau: float | None) -> dict | None:
    """The sampling band of ``cell``'s tau (its drafter kind, K, prompts and tokens) from the
    bundle's per-prompt traces, and where the real cell's tau falls in it (``real_quantile``:
    the share of draws below it); None without traces for that drafter and K."""
    if trace is None or cell.k == 0:
        return None
    kind = drafter_kind(cell)
    passes = passes_per_prompt(trace, kind, cell.k, cell.tokens)
    if passes is None:
        return None
    band = sample_tau(passes, cell.prompts, cell.tokens)
    draws = band.pop("_draws")
    band["drafter"] = kind
    band["real_quantile"] = None if real_tau is None else float(np.mean(draws < real_tau))
    return band
