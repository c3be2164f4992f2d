"""Vectorised sampling of accepted drafts per verify pass.

One uniform per pass: with survival S_1 >= ... >= S_K, A = #{k : S_k > u}, u ~ U(0, 1), so
P(A >= k) = S_k exactly. :func:`sample_requests` decodes whole requests (one difficulty per
request, steps until M tokens are committed) and returns a per-step trace in the format
:mod:`wansim.acceptance.trace` reads, so a fitted profile can be checked against its source.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wansim.acceptance.closed_form import survival
from wansim.acceptance.model import AcceptanceModel


def sample_accepted(rng: np.random.Generator, rates: np.ndarray, size: int) -> np.ndarray:
    """Accepted drafts for ``size`` passes per row of ``rates`` ((k,) or (R, k) -> (size,) or
    (R, size))."""
    rates = np.asarray(rates, dtype=float)
    surv = survival(rates)
    if rates.ndim == 1:
        u = rng.random(size)
        return (surv[None, :] > u[:, None]).sum(axis=1)
    u = rng.random((rates.shape[0], size))
    return (surv[:, None, :] > u[:, :, None]).sum(axis=2)


def sample_requests(
    model: AcceptanceModel,
    k: int,
    rng: np.random.Generator,
    n_requests: int,
    decode_tokens: int,
    workload: str = "",
) -> pd.DataFrame:
    """Synthetic per-step trace: each request commits ``decode_tokens`` tokens (A + 1 per pass,
    the last pass truncated). Columns: workload, prompt_id, step, k, accepted."""
    rates = model.request_rates(rng, n_requests, k)
    frames = []
    chunk = max(8, int(np.ceil(decode_tokens / max(1.0, model.tau(k)) * 1.3)) + 8)
    for r in range(n_requests):
        accepted = []
        committed = 0
        while committed < decode_tokens:
            a = sample_accepted(rng, rates[r], chunk)
            tokens = np.cumsum(a + 1) + committed
            done = np.searchsorted(tokens, decode_tokens)  # first index reaching the target
            take = min(done + 1, len(a))
            accepted.append(a[:take])
            committed = int(tokens[take - 1])
        acc = np.concatenate(accepted)
        frames.append(
            pd.DataFrame(
                {
                    "workload": workload,
                    "prompt_id": r,
                    "step": np.arange(len(acc)),
                    "k": k,
                    "accepted": acc,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)
