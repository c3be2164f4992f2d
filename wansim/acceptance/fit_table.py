"""Difficulty fits of the shipped profiles, computed once and shipped (``wansim/data/fits.json``).

:func:`wansim.acceptance.heterogeneity.fit` solves ~1,000 roots for
each (pooled rates, dispersion): about half a second, paid by every command that builds the
acceptance model of the reference profile. The fit is a pure function of those inputs, so the
result for each workload of each shipped profile is stored here, keyed by the exact inputs
(floats written by ``repr``: read back to the bit), and returned as computed. Any other input
(a user's profile, a dispersion or rates overridden) is fitted as before.

Regenerate after changing the fit or a shipped profile: ``python -m wansim.acceptance.fit_table``
(``tests/acceptance/test_fit_table.py`` recomputes every entry and fails when one is stale).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

TABLE = "fits.json"


@lru_cache(maxsize=1)
def _table() -> dict[tuple[tuple[float, ...], float], tuple[tuple[float, ...], float]]:
    node = resources.files("wansim.data").joinpath(TABLE)
    if not node.is_file():
        return {}
    entries = json.loads(node.read_text())["fits"]
    return {(tuple(e["pooled"]), e["dispersion"]): (tuple(e["rates"]), e["sigma"]) for e in entries}


def lookup(pooled: tuple[float, ...], dispersion: float) -> tuple[tuple[float, ...], float] | None:
    """The stored (q, sigma) of exactly these inputs, or None."""
    return _table().get((pooled, dispersion))


def shipped_inputs() -> list[tuple[tuple[float, ...], float]]:
    """(pooled rates, dispersion) of every workload of every shipped profile."""
    from wansim.acceptance.profile import load_profile
    from wansim.data import reference_profile

    prof = load_profile(reference_profile())
    return [
        (tuple(float(x) for x in wl.per_position), float(wl.dispersion))
        for wl in prof.workloads.values()
    ]


def compute_table() -> dict:
    """The table's content, fitted now (the slow path, without the table)."""
    from wansim.acceptance.heterogeneity import fit_uncached

    fits = []
    for pooled, dispersion in shipped_inputs():
        rates, sigma = fit_uncached(pooled, dispersion)
        fits.append(
            {
                "pooled": list(pooled),
                "dispersion": dispersion,
                "rates": [float(x) for x in rates],
                "sigma": float(sigma),
            }
        )
    return {"fits": fits}


def main() -> None:
    path = resources.files("wansim.data").joinpath(TABLE)
    with resources.as_file(path) as target:
        target.write_text(json.dumps(compute_table(), indent=1) + "\n")
        print(f"wrote {target}")


if __name__ == "__main__":
    main()
