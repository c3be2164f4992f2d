"""Acceptance traces (raw per-step records) and fitting profiles from them.

Trace file: CSV with optional ``# key: value`` metadata lines first, then a header row and one
row per verify step with columns ``workload, prompt_id, step, k, accepted`` (accepted drafts,
0..k). The real execution path writes traces; importers turn serving engines' metrics into the
same profile format.

Fitting (per workload):
- conditional rate at position i: p_i = #(k >= i and A >= i) / #(k >= i and A >= i - 1), the
  maximum-likelihood estimate under the conditional model, valid for traces mixing block sizes;
- histogram: counts of A at the largest block size in the trace;
- dispersion: one-way random-effects ANOVA on A grouped by prompt, between-prompt variance
  sigma_b^2 = (MSB - MSW) / n0 over total sigma_b^2 + MSW, clipped to [0, 0.99].
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from wansim.acceptance.profile import Profile, ProfileHeader, WorkloadProfile
from wansim.errors import ProfileError

COLUMNS = ("workload", "prompt_id", "step", "k", "accepted")


def write_trace(frame: pd.DataFrame, path: str | os.PathLike, meta: dict | None = None) -> None:
    lines = [f"# {k}: {v}" for k, v in (meta or {}).items()]
    buf = io.StringIO()
    frame.loc[:, list(COLUMNS)].to_csv(buf, index=False)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(line + "\n" for line in lines) + buf.getvalue())


def read_trace(path: str | os.PathLike) -> tuple[pd.DataFrame, dict]:
    """(frame, metadata). Errors name the file, the column and the problem."""
    p = Path(path)
    if not p.is_file():
        raise ProfileError("trace", "file not found", str(path))
    meta: dict[str, str] = {}
    body = []
    for line in p.read_text().splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
        elif line.strip():
            body.append(line)
    if not body:
        raise ProfileError(str(path), "trace has no rows", None)
    frame = pd.read_csv(io.StringIO("\n".join(body)))
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
    frame["workload"] = frame["workload"].fillna("").astype(str)
    return frame, meta


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
        rates = fit_per_position(k, a)
        kmax = int(k.max())
        at_kmax = a[k == kmax]
        hist = np.bincount(at_kmax, minlength=kmax + 1)[: kmax + 1]
        disp = between_prompt_fraction(sub["prompt_id"].to_numpy()[k == kmax], at_kmax)
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
