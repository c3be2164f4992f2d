"""The per-round hybrid async protocol (``schedule.hybrid_confident_fraction``): one rule for
both engines.

Real rings mix two ways of speculating: when the drafter is confident (an n-gram match, a
long run of accepted drafts) S0 pipelines chain blocks ahead of their verdicts (the async
schedule); otherwise it drafts a tree from the last verified token and waits for that tree's
verdict (a synchronous tree round). The mix depends on the workload (code repeats itself and
matches n-grams more often than chat), so the scenario gives it as a number, or as
``profile``: the selected workload row's ``hybrid_confident_fraction`` in the acceptance profile
(measured per workload; :func:`confident_fraction` resolves it, for both engines).

Model (decisions):

- A *round* starts wherever drafting restarts from a verified token with nothing of the
  request in flight: after the prefill's first token, after a lost bet (the stale blocks
  behind it are dropped or flushed as the async protocol says: the pipeline drains) and after
  a tree round's verdict.
- Each round is *confident* with probability p = ``hybrid_confident_fraction``, drawn i.i.d.
  per round (one uniform per round from the request's own stream, so the draws never depend
  on timing); confidence does not change the acceptance rates (the same per-request
  difficulty serves chain and tree rounds).
- A confident round is a chain of the async schedule: S0 issues blocks of K + 1 tokens back to
  back (window ``max_inflight_blocks``) until a bet is lost, with the async protocol's commit
  rule and bet (:mod:`wansim.acceptance.bet`).
- Any other round is one verify pass of the tree ``speculation.tree`` (the sync schedule's tree
  round: the tree's drafting cost at S0, its N + 1 tokens through every stage, its mask on the
  forward hops, its verdict on the return hop; commits A + 1 for the tree's accepted length
  A), after which a new round starts.

So p = 1 is the async schedule and p = 0 the sync schedule with the tree (both engines reduce
to those exactly in their means; the DES's p = 1 run is the async run to the bit).

Renewal-reward (the analytical engine): a confident round commits t_c = M / C tokens in c = T_a
/ C ms (C chains per request of the pure async schedule, 1 + its lost bets; T_a its decode
time), a tree round t_t = M / N_t tokens in one tree lap l_t = T_t / N_t. A request of M
tokens runs R = M / (p t_c + (1 - p) t_t) rounds and decodes in R (p c + (1 - p) l_t)
(:func:`round_mix`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.config.scenario import Scenario
from wansim.config.schedule import CANCEL_ON_DIVERGENCE
from wansim.errors import ScenarioError


def confident_fraction(scenario: Scenario) -> float | None:
    """p, or None when the hybrid is off; ``profile`` reads p from the acceptance profile's
    selected workload row (``drafter.acceptance.workload``, else the profile's first), and is
    one line naming the field when there is no profile, a per-request ``workload.mix`` or the
    row has no value."""
    p = scenario.schedule.hybrid_confident_fraction
    if p is None:
        return None
    if p != "profile":
        return float(p)
    from wansim.acceptance.profile import load_profile

    field = "schedule.hybrid_confident_fraction"
    acc = scenario.drafter.acceptance
    if acc.profile is None:
        raise ScenarioError(
            field, "profile needs an acceptance profile (drafter.acceptance.profile)", p
        )
    if scenario.workload.mix:
        raise ScenarioError(
            field,
            "profile with workload.mix would give each request its row's fraction (not"
            " modelled: one fraction per run): give a number",
            p,
        )
    prof = load_profile(acc.profile)
    workload = acc.workload or prof.default_workload
    row = prof.workload(workload).hybrid_confident_fraction
    if row is None:
        raise ScenarioError(
            field,
            f"profile: the profile's workload {workload!r} has no hybrid_confident_fraction"
            f" ({acc.profile}); give a number",
            p,
        )
    return float(row)


def is_hybrid(scenario: Scenario) -> bool:
    return scenario.schedule.hybrid_confident_fraction is not None


def confident(u: float, p: float) -> bool:
    """Is a round with uniform draw ``u`` confident (async chain) at fraction ``p``?"""
    return u < p


def async_scenario(scenario: Scenario) -> Scenario:
    """The scenario of the confident rounds alone (the async schedule, hybrid off)."""
    sched = dataclasses.replace(scenario.schedule, hybrid_confident_fraction=None)
    return dataclasses.replace(scenario, schedule=sched)


def tree_scenario(scenario: Scenario) -> Scenario:
    """The scenario of the tree rounds alone: the sync schedule verifying
    ``speculation.tree`` (one block in flight, every verdict commits A + 1)."""
    sched = dataclasses.replace(
        scenario.schedule,
        kind="sync",
        max_inflight_blocks=1,
        async_protocol=CANCEL_ON_DIVERGENCE,
        hybrid_confident_fraction=None,
    )
    spec = dataclasses.replace(scenario.speculation, policy="tree")
    return dataclasses.replace(scenario, schedule=sched, speculation=spec)


def check_tree_rounds(scenario: Scenario) -> None:
    """The tree rounds' policy can be built (a tree needs sibling rates): else one line
    naming ``speculation.tree`` (both engines call this before running)."""
    from wansim import speculation

    if not is_hybrid(scenario):
        return
    try:
        speculation.policy(tree_scenario(scenario))
    except ScenarioError as err:
        raise ScenarioError(
            "speculation.tree",
            f"is what the hybrid's unconfident rounds verify, and cannot be built: {err}",
            scenario.speculation.tree.kind,
        ) from None


@dataclasses.dataclass(frozen=True)
class RoundMix:
    """Per request: rounds of each kind, decode time, verify passes and any additive total
    (``extra``: per-request totals of the two schedules mixed per round, e.g. bytes)."""

    rounds: float
    confident_rounds: float
    tree_rounds: float
    decode_ms: float
    passes: float
    extra: dict[str, float]


def round_mix(p: float, chain: dict[str, float], tree: dict[str, float]) -> RoundMix:
    """Renewal-reward mix of the two round kinds (module docstring).

    ``chain``: the pure async schedule per request: ``rounds`` (chains C), ``decode_ms``,
    ``passes`` and other additive totals; ``tree``: the sync tree schedule per request:
    ``rounds`` = ``passes`` = N_t, ``decode_ms`` and the same totals. Every total is mixed as
    R (p X_a / C + (1 - p) X_t / N_t), R = 1 / (p / C + (1 - p) / N_t) (the rounds that
    commit a request's tokens: t_c = M / C, t_t = M / N_t)."""
    c, n_t = float(chain["rounds"]), float(tree["rounds"])
    rounds = 1.0 / (p / c + (1.0 - p) / n_t)
    per_c, per_t = p * rounds / c, (1.0 - p) * rounds / n_t

    def mixed(key: str) -> float:
        return per_c * float(chain[key]) + per_t * float(tree[key])

    keys = (set(chain) & set(tree)) - {"rounds", "decode_ms", "passes"}
    return RoundMix(
        rounds=rounds,
        confident_rounds=p * rounds,
        tree_rounds=(1.0 - p) * rounds,
        decode_ms=mixed("decode_ms"),
        passes=mixed("passes"),
        extra={k: mixed(k) for k in sorted(keys)},
    )


def round_draws(rng: np.random.Generator, size: int) -> list[float]:
    """A block of per-round uniforms from a request's own stream."""
    return rng.random(size).tolist()
