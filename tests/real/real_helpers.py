"""Helpers shared by the real-path tests: chi-square goodness of fit and the tiny pair's exact
next-token distributions after a fixed context."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit, pooling bins with expected count < min_expected."""
    n = counts.sum()
    exp = probs / probs.sum() * n
    big = exp >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp[big], exp[~big].sum())
    keep = ex > 0
    return float(stats.chisquare(obs[keep], ex[keep]).pvalue)


CTX = list(b"import os\nimport sys\n\ndef main():\n    ")


def target_first_two(target, drafter_model):
    """Exact p(t1 | ctx), p(t2 | ctx, t1) for every t1, and the drafter's q(t1 | ctx)."""
    with torch.no_grad():
        p1 = torch.softmax(target(input_ids=torch.tensor([CTX])).logits[0, -1].double(), -1)
        batch = torch.tensor([[*CTX, t] for t in range(256)])
        p2 = torch.softmax(target(input_ids=batch).logits[:, -1].double(), -1)
        q1 = torch.softmax(drafter_model(input_ids=torch.tensor([CTX])).logits[0, -1].double(), -1)
    return p1.numpy(), p2.numpy(), q1.numpy()


def check_first_two(first: np.ndarray, joint: np.ndarray, p1, p2, q1) -> None:
    assert chi2_pvalue(first, p1) > 1e-3
    assert chi2_pvalue(joint.ravel(), (p1[:, None] * p2).ravel()) > 1e-3
    assert chi2_pvalue(first, q1) < 1e-6  # the same test tells the drafter's distribution apart
