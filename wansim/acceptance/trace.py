"""Acceptance traces (raw per-step records) and fitting profiles from them.

Trace file: CSV with optional ``# key: value`` metadata lines first, then a header row and one
row per verify step with columns ``workload, prompt_id, step, k, accepted`` (accepted drafts,
0..k). The real execution path writes traces; importers turn serving engines' metrics into the
same profile format.

Fitting (per workload):
- conditional rate at position i: p_i = #(k >= i and A >= i) / #(k >= i and A >= i - 1), the
  maximum-likelihood estimate under the conditional model, valid for traces mixing block sizes;
- histogram: counts of A at the largest block size in the trace;
- trees (optional ``accepted_ranks, walk_children`` columns): per_position = the rank-1 rate at
  each depth and ``siblings`` = the rank-2, 3... rates at depth 1, each successes / tries of
  :func:`fit_tree_rates`; no histogram;
- dispersion: one-way random-effects ANOVA on A grouped by prompt, between-prompt variance
  sigma_b^2 = (MSB - MSW) / n0 over total sigma_b^2 + MSW, clipped to [0, 0.99].
"""

from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from wansim.acceptance.profile import Profile, ProfileHeader, WorkloadProfile
from wansim.config.user_yaml import read_text
from wansim.data import is_file
from wansim.errors import ProfileError

COLUMNS = ("workload", "prompt_id", "step", "k", "accepted")
# Optional, for draft trees: the sibling rank accepted at each depth of the walk ("1;2;1"), and
# the candidates at each node the walk reached, root first ("2;2;1;0"; the last were all tried
# and rejected). ``k`` is then the tree's depth (the most drafts a pass can accept).
TREE_COLUMNS = ("accepted_ranks", "walk_children")


def write_trace(frame: pd.DataFrame, path: str | os.PathLike, meta: dict | None = None) -> None:
    lines = [f"# {k}: {v}" for k, v in (meta or {}).items()]
    buf = io.StringIO()
    cols = list(COLUMNS) + [c for c in TREE_COLUMNS if c in frame.columns]
    frame.loc[:, cols].to_csv(buf, index=False)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(line + "\n" for line in lines) + buf.getvalue())


def read_trace(path: str | os.PathLike) -> tuple[pd.DataFrame, dict]:
    """(frame, metadata). Errors name the file, the column and the problem."""
    p = Path(path)
    if not is_file(p):
        raise ProfileError("trace", "file not found", str(path))
    meta: dict[str, str] = {}
    body = []
    for line in read_text(p, "trace").splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
        elif line.strip():
            body.append(line)
    if not body:
        raise ProfileError(str(path), "trace has no rows", None)
    frame = pd.read_csv(io.StringIO("\n".join(body)), dtype=dict.fromkeys(TREE_COLUMNS, str))
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ProfileError(str(path), f"missing columns {', '.join(missing)}", list(frame.columns))
    for col in ("prompt_id", "step", "k", "accepted"):
        if not pd.api.types.is_integer_dtype(frame[col]):
            raise ProfileError(f"{path}: {col}", "must be integers", str(frame[col].dtype))
    bad = frame[(frame.accepted < 0) | (frame.accepted > frame.k) | (frame.k < 1)]
    if len(bad):
        row = bad.iloc[0]
        raise ProfileError(
            f"{path}: accepted", "must be in 0..k with k >= 1", f"k={row.k} accepted={row.accepted}"
        )
    frame["workload"] = frame["workload"].astype(object).fillna("").astype(str)
    if any(c in frame.columns for c in TREE_COLUMNS):
        try:
            tree_walks(frame)
        except ValueError as e:
            raise ProfileError(f"{path}: accepted_ranks/walk_children", str(e), None) from None
    return frame, meta


def tree_walks(frame: pd.DataFrame) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(accepted ranks, candidates per walked node) per step of a tree trace, checked: one rank
    per accepted draft, one count more than ranks, each rank within its node's candidates."""
    for c in TREE_COLUMNS:
        if c not in frame.columns:
            raise ValueError(f"a tree trace needs both {' and '.join(TREE_COLUMNS)}")

    def ints(text) -> tuple[int, ...]:
        text = "" if pd.isna(text) else str(text)
        return tuple(int(x) for x in text.split(";") if x != "")

    out = []
    for acc, r, c in zip(
        frame["accepted"], frame["accepted_ranks"], frame["walk_children"], strict=True
    ):
        ranks, kids = ints(r), ints(c)
        if len(ranks) != int(acc) or len(kids) != len(ranks) + 1:
            raise ValueError(f"step with {acc} accepted has ranks {ranks} and children {kids}")
        if any(not 1 <= rk <= n for rk, n in zip(ranks, kids, strict=False)):
            raise ValueError(f"an accepted rank exceeds its node's candidates: {ranks} {kids}")
        out.append((ranks, kids))
    return out


def fit_tree_rates(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Conditional rates P_{d,r} (positional model of ``wansim.acceptance.trees``) from tree
    walks: the rank-r candidate at depth d was tried when the walk reached depth d - 1 and ranks
    1..r-1 there were rejected; it succeeded when the walk went on through it. Returns (rates,
    trials), both (depth, rank); rates are NaN where nothing was tried (the MLE: successes /
    trials, each try a Bernoulli)."""
    walks = tree_walks(frame)
    depth = max((len(k) for _, k in walks), default=1)
    ranks = max((max(k) for _, k in walks if k), default=1) or 1
    wins = np.zeros((depth, ranks))
    tries = np.zeros((depth, ranks))
    for acc_ranks, kids in walks:
        for d, n in enumerate(kids):  # node at depth d with n candidates for depth d + 1
            if d < len(acc_ranks):
                r = acc_ranks[d]
                tries[d, :r] += 1
                wins[d, r - 1] += 1
            else:
                tries[d, :n] += 1
    used = np.flatnonzero(tries.sum(axis=1) > 0)  # leaves' depth: no candidates tried
    depth = int(used[-1]) + 1 if len(used) else 1
    wins, tries = wins[:depth], tries[:depth]
    rates = np.where(tries > 0, wins / np.where(tries > 0, tries, 1), np.nan)
    return rates, tries


def _leading(values) -> tuple[float, ...]:
    """Entries up to the first NaN."""
    out = []
    for v in values:
        if np.isnan(v):
            break
        out.append(float(v))
    return tuple(out)


def fit_per_position(k: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """Pooled conditional rates p_1..p_Kmax (MLE, mixed block sizes allowed)."""
    kmax = int(k.max())
    rates = np.empty(kmax)
    for i in range(1, kmax + 1):
        at_risk = (k >= i) & (accepted >= i - 1)
        n = int(at_risk.sum())
        rates[i - 1] = ((accepted >= i) & at_risk).sum() / n if n else np.nan
    if np.isnan(rates).any():
        last = np.flatnonzero(~np.isnan(rates))
        rates = rates[: last[-1] + 1] if len(last) else rates[:1]
    return rates


def between_prompt_fraction(prompt_id: np.ndarray, accepted: np.ndarray) -> float:
    """One-way random-effects ANOVA estimate of the between-prompt share of Var(A)."""
    frame = pd.DataFrame({"g": prompt_id, "a": accepted.astype(float)})
    groups = frame.groupby("g")["a"]
    n_i = groups.size().to_numpy(dtype=float)
    g = len(n_i)
    n = n_i.sum()
    if g < 2 or n <= g:
        return 0.0
    means = groups.mean().to_numpy()
    grand = frame["a"].mean()
    ssb = float((n_i * (means - grand) ** 2).sum())
    ssw = float(((frame["a"] - groups.transform("mean")) ** 2).sum())
    msb = ssb / (g - 1)
    msw = ssw / (n - g)
    n0 = (n - (n_i**2).sum() / n) / (g - 1)
    between = max(0.0, (msb - msw) / n0)
    total = between + msw
    return float(min(0.99, between / total)) if total > 0 else 0.0


def fit_profile(
    frame: pd.DataFrame,
    *,
    drafter: str = "unknown",
    target: str = "unknown",
    temperature: float = 1.0,
    verifier: str = "lossless",
    provenance: str = "",
    source: str = "measured",
) -> Profile:
    """Fit a profile (one workload per distinct ``workload`` value) from a trace frame."""
    workloads = {}
    kmax_all = int(frame["k"].max())
    for name, sub in frame.groupby("workload", sort=False):
        k = sub["k"].to_numpy()
        a = sub["accepted"].to_numpy()
        kmax = int(k.max())
        at_kmax = a[k == kmax]
        disp = between_prompt_fraction(sub["prompt_id"].to_numpy()[k == kmax], at_kmax)
        if all(c in sub.columns for c in TREE_COLUMNS):  # trees: rank-1 chain rates + siblings
            tree_rates, _ = fit_tree_rates(sub)
            siblings = _leading(tree_rates[0, 1:])
            workloads[str(name) or "default"] = WorkloadProfile(
                per_position=_leading(tree_rates[:, 0]),
                siblings=siblings or None,
                dispersion=disp,
                steps=len(sub),
            )
            continue
        rates = fit_per_position(k, a)
        hist = np.bincount(at_kmax, minlength=kmax + 1)[: kmax + 1]
        workloads[str(name) or "default"] = WorkloadProfile(
            per_position=tuple(float(x) for x in rates),
            histogram=tuple(int(x) for x in hist) if len(rates) == kmax else None,
            dispersion=disp,
            steps=len(sub),
        )
    header = ProfileHeader(
        drafter=drafter,
        target=target,
        k=kmax_all,
        temperature=temperature,
        verifier=verifier,
        source=source,
        provenance=provenance,
    )
    return Profile(header=header, workloads=workloads)


def guess_rate(frame: pd.DataFrame, k: int) -> tuple[float, int] | None:
    """The rate at position ``k + 1`` measured by the steps of block size larger than ``k``:
    P(A >= k + 1 | A >= k) over them, pooled (:func:`fit_per_position`'s estimator at that
    position), and the steps it rests on; None where no such step accepted ``k``."""
    deeper = frame[frame["k"] > k]
    at_risk = deeper["accepted"] >= k
    n = int(at_risk.sum())
    if n == 0:
        return None
    return float((deeper["accepted"] >= k + 1).sum() / n), n


def fit_profile_at_k(frame: pd.DataFrame, k: int, **header) -> Profile:
    """The profile of block size ``k`` from a trace mixing block sizes: positions 1..k, the
    dispersion and the histogram from the steps at ``k`` (:func:`fit_profile` of those rows),
    and ``guess_rate`` -- position k + 1, the async bet's guess, the drafter's token after its
    k drafts (:mod:`wansim.acceptance.bet`) -- from the steps at larger block sizes where there
    are any (:func:`guess_rate`). Without them the engines hold the last rate for the guess."""
    if any(c in frame.columns and frame[c].notna().any() for c in TREE_COLUMNS):
        raise ValueError("fit_profile_at_k: chain traces only (a tree's guess is not a chain's)")
    prof = fit_profile(frame[frame["k"] == k], **header)
    workloads = dict(prof.workloads)
    for name, sub in frame.groupby("workload", sort=False):
        key = str(name) or "default"
        rate = guess_rate(sub, k)
        if key in workloads and rate is not None and len(workloads[key].per_position) == k:
            workloads[key] = dataclasses.replace(workloads[key], guess_rate=rate[0])
    return Profile(header=prof.header, workloads=workloads)
