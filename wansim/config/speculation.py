"""Scenario section ``speculation``: the policy (none, chain, tree), K, the verifier rule and
the tree's shape.

Field documentation: README.md's scenario section."""

from __future__ import annotations

import dataclasses

from wansim.config.validation import spec
from wansim.errors import ScenarioError

POLICIES = ("none", "chain", "tree")
# verifier rules the engines model; the real path implements REAL_VERIFIERS (no typical)
VERIFIERS = ("lossless", "greedy", "typical")
REAL_VERIFIERS = ("greedy", "lossless")
TREE_KINDS = ("static", "sequoia", "dynamic")


@dataclasses.dataclass(frozen=True)
class Tree:
    """sequoia/dynamic: ``budget_nodes`` draft nodes (root excluded), depth at most
    ``max_depth`` (default: the positions the acceptance covers); static: ``branching`` gives
    the children of every node at each depth and fixes the node count."""

    kind: str = spec("sequoia", choices=TREE_KINDS)
    budget_nodes: int = spec(32, ge=1, le=4096, doc="draft nodes, the root excluded")
    branching: tuple[int, ...] = spec(
        (), ge=1, le=4096, max_items=4096, doc="static trees: children per node per depth"
    )
    max_depth: int | None = spec(None, ge=1, le=4096)

    def check(self, path: str) -> None:
        if self.kind == "static" and not self.branching:
            raise ScenarioError(
                f"{path}.branching", "a static tree needs children per depth, e.g. [4, 2, 1]", []
            )
        if self.kind != "static" and self.branching:
            raise ScenarioError(
                f"{path}.branching",
                f"is for static trees (kind is {self.kind})",
                list(self.branching),
            )
        if (
            self.kind == "static"
            and self.max_depth is not None
            and len(self.branching) > self.max_depth
        ):
            raise ScenarioError(
                f"{path}.branching",
                f"is {len(self.branching)} deep, more than max_depth {self.max_depth}",
                list(self.branching),
            )


@dataclasses.dataclass(frozen=True)
class Speculation:
    policy: str = spec("chain", choices=POLICIES)
    k: int = spec(7, ge=1, le=64)
    verifier: str = spec("lossless", choices=VERIFIERS)
    tree: Tree = spec(factory=Tree)
