"""Compressed activations on every forward hop: what they do to the target (in process)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from wansim.real.wire_quality import _kl, activation_quality  # noqa: E402

pytestmark = pytest.mark.real


def test_kl_matches_scipy():
    from scipy.stats import entropy

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    want = [
        entropy(torch.softmax(a[i].double(), -1), torch.softmax(b[i].double(), -1))
        for i in range(3)
    ]
    np.testing.assert_allclose(_kl(a, b), want, rtol=1e-10)


def test_activation_quality_orders_bit_widths(tiny_dirs, code_prompts):
    """fp32 is the reference (KL 0, exact); fp16 is near-exact; 3-bit codes move the target
    (larger KL) and the drafter's acceptance is measured against the compressed target."""
    target_dir, drafter_dir = tiny_dirs
    rows = activation_quality(
        target_dir, drafter_dir, code_prompts[:1], bits=(32, 16, 3), k=3, max_new_tokens=16
    )
    by = {r["activation_bits"]: r for r in rows}
    assert by[32]["kl_mean"] == 0 and by[32]["target_exact"] and by[32]["acceptance_ratio"] == 1
    assert by[16]["kl_mean"] < 1e-4
    assert by[3]["kl_mean"] > 100 * by[16]["kl_mean"]
    for r in rows:
        assert 0 <= r["token_agreement"] <= 1 and 0 <= r["acceptance_rate"] <= 1
        assert r["target_exact"] == (r["token_agreement"] == 1)
