"""The shipped difficulty fits (``wansim/data/fits.json``) are what the fit computes now, to the
bit, for every workload of every shipped profile; a lookup returns them as the fit would."""

from __future__ import annotations

import numpy as np

from wansim.acceptance import fit_table, heterogeneity


def test_every_stored_fit_is_the_fit_computed_now():
    """Fails when the fit or a shipped profile changed: regenerate the table
    (``python -m wansim.acceptance.fit_table``)."""
    assert fit_table.compute_table()["fits"] == [
        {
            "pooled": list(pooled),
            "dispersion": dispersion,
            "rates": list(fit_table.lookup(pooled, dispersion)[0]),
            "sigma": fit_table.lookup(pooled, dispersion)[1],
        }
        for pooled, dispersion in fit_table.shipped_inputs()
    ]


def test_a_lookup_gives_what_the_fit_gives_and_anything_else_is_fitted():
    pooled, dispersion = fit_table.shipped_inputs()[0]
    heterogeneity.fit.cache_clear()
    stored = heterogeneity.fit(pooled, dispersion)
    computed = heterogeneity.fit_uncached(pooled, dispersion)
    assert stored == computed
    assert [type(x) for x in stored[0]] == [type(x) for x in computed[0]]
    assert type(stored[1]) is type(computed[1])
    other = (pooled, dispersion + 0.01)  # not in the table: fitted
    assert fit_table.lookup(*other) is None
    rates, sigma = heterogeneity.fit(*other)
    assert sigma > stored[1]  # more spread between prompts needs a wider difficulty
    assert np.all(np.isfinite(rates))
