"""The shipped difficulty fits (``wansim/data/fits.json``) are what the fit computes now, for
every workload of every shipped profile; a lookup returns them as the fit would.

"What the fit computes" holds to 1e-9 relative, not to the bit: the fit's exp, log and dot
products run through numpy's SIMD loops and the BLAS kernel the CPU selects, whose last bits
differ between CPUs (on an AMD EPYC without AVX-512 the stored rates and sigma, written on
another machine, differed by up to 2 ulp, 4e-16 relative). A changed fit or profile moves
them by far more than 1e-9."""

from __future__ import annotations

import numpy as np
import pytest

from wansim.acceptance import fit_table, heterogeneity

REL = 1e-9


def _close(stored, computed) -> None:
    rates, sigma = stored
    assert np.asarray(rates) == pytest.approx(np.asarray(computed[0]), rel=REL, abs=0)
    assert sigma == pytest.approx(computed[1], rel=REL, abs=0)


def test_every_stored_fit_is_the_fit_computed_now():
    """Fails when the fit or a shipped profile changed: regenerate the table
    (``python -m wansim.acceptance.fit_table``)."""
    computed = fit_table.compute_table()["fits"]
    inputs = fit_table.shipped_inputs()
    assert [(tuple(f["pooled"]), f["dispersion"]) for f in computed] == [
        (tuple(p), d) for p, d in inputs
    ]
    for (pooled, dispersion), fit in zip(inputs, computed, strict=True):
        _close(fit_table.lookup(pooled, dispersion), (fit["rates"], fit["sigma"]))


def test_a_lookup_gives_what_the_fit_gives_and_anything_else_is_fitted():
    pooled, dispersion = fit_table.shipped_inputs()[0]
    heterogeneity.fit.cache_clear()
    stored = heterogeneity.fit(pooled, dispersion)
    assert stored == fit_table.lookup(pooled, dispersion)  # the table's values, as they are
    computed = heterogeneity.fit_uncached(pooled, dispersion)
    _close(stored, computed)
    assert [type(x) for x in stored[0]] == [type(x) for x in computed[0]]
    assert type(stored[1]) is type(computed[1])
    other = (pooled, dispersion + 0.01)  # not in the table: fitted
    assert fit_table.lookup(*other) is None
    rates, sigma = heterogeneity.fit(*other)
    assert sigma > stored[1]  # more spread between prompts needs a wider difficulty
    assert np.all(np.isfinite(rates))
