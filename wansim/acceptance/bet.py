"""The bet of async in-pipe speculation and of the overlapped drafter (one rule, both engines).

A block drafted ahead of its predecessor's verdict assumes that predecessor is accepted whole:
all K drafts *and* the drafter's guess of the token after them (verified as draft K + 1 of the
earlier block). The bet wins with probability S_K(Z) p_{K+1}(Z) for a request of difficulty Z;
p_{K+1} is the acceptance rate at position K + 1: measured where the profile has it (a rate
at that position, or a per-K profile's ``guess_rate``, P(A >= K + 1 | A >= K) pooled over the
steps of larger block sizes, to which q_{K+1} is fitted with the K rates and the difficulty
spread left as they are), else the last measured rate held (whatever the scenario's
``extrapolate``: the guess is not a draft the scenario's K asked for).
"""

from __future__ import annotations

import dataclasses

import numpy as np


def guess_acceptance(acceptance):
    """The acceptance with rates extended past the measured positions (the guess's rate): the
    profile's measured guess first (module docstring), then the last rate held."""
    from wansim.acceptance.heterogeneity import next_rate

    model = acceptance.model
    if model.guess_rate is not None:
        q = next_rate(tuple(model.rates), model.sigma, model.guess_rate)
        model = dataclasses.replace(model, rates=(*model.rates, q), guess_rate=None)
    return dataclasses.replace(acceptance, model=dataclasses.replace(model, extrapolate=True))


def bet_win_probability(survival_k, guess_rate, flush: bool = False) -> np.ndarray:
    """P(the bet wins) = S_K p_{K+1}: all K drafts accepted, then the guess. With
    ``flush_on_full_acceptance`` the next block starts right after the K drafts (no bonus
    token, no guess): S_K."""
    s = np.asarray(survival_k, dtype=float)
    return s if flush else s * np.asarray(guess_rate, dtype=float)
