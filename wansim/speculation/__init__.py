"""Speculation policies: what a verify pass carries, what drafting costs, what rides the wire,
and how many drafts a pass accepts. Both engines call this package; its functions are pure (a
scenario in, numbers out) and the random ones take the caller's generator.

- :mod:`~wansim.speculation.acceptance_rates`: the rates a policy draws from (verifier shift,
  sibling offsets, difficulty);
- :mod:`~wansim.speculation.verify_pass`: one pass's shape and accepted-draft law (``Policy``);
- :mod:`~wansim.speculation.tree_verification`: which tree is verified and what it costs;
- :mod:`~wansim.speculation.policies`: a scenario's policy (``policy``), ``target_exact``;
- :mod:`~wansim.speculation.pass_terms`: per-point bytes, drafter time and acceptance terms;
- :mod:`~wansim.speculation.drafters`: the drafter presets (``drafter: {preset: NAME}``).

``typical`` acceptance is lossy: results carry ``target_exact: false``.
"""

from wansim.speculation.acceptance_rates import SpecAcceptance, acceptance
from wansim.speculation.pass_terms import (
    batch_size,
    commit_survival,
    distinct_rows,
    drafter_ms,
    forward_message_bytes,
    forward_message_bytes_hops,
    point_columns,
    point_scenario,
    policy_terms,
    return_message_bytes,
)
from wansim.speculation.policies import bit_quality, effective_acceptance, policy, target_exact
from wansim.speculation.tree_verification import MAX_SEQUOIA_STEPS, MAX_TREE_NODES
from wansim.speculation.verify_pass import Policy

__all__ = [
    "MAX_SEQUOIA_STEPS",
    "MAX_TREE_NODES",
    "Policy",
    "SpecAcceptance",
    "acceptance",
    "batch_size",
    "bit_quality",
    "commit_survival",
    "distinct_rows",
    "drafter_ms",
    "effective_acceptance",
    "forward_message_bytes",
    "forward_message_bytes_hops",
    "point_columns",
    "point_scenario",
    "policy",
    "policy_terms",
    "return_message_bytes",
    "target_exact",
]
