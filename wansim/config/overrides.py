"""``--set a.b=v`` overrides on a raw scenario mapping: typed like the file (YAML scalars),
per-stage lists materialised or resized with ``stages``, and overrides that a per-stage list
would shadow refused (one line naming the field)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from wansim.config.limits import DEFAULT_STAGES, MAX_STAGES
from wansim.config.raw import (
    ACCEPTANCE_SOURCES,
    join_path,
    merge_acceptance,
    nested,
    split_path,
    to_plain,
)
from wansim.config.user_yaml import load_yaml_text
from wansim.errors import ScenarioError, WansimInputError


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ScenarioError("--set", "expected field.path=value", text)
    key, _, value = text.partition("=")
    key = key.strip()
    if not value.strip():
        return key, ""
    try:
        return key, load_yaml_text(value, key)
    except WansimInputError as err:
        raise ScenarioError(key, f"value: {err.problem}", value) from None


def apply_overrides(
    raw: dict, overrides: Iterable[str] | Mapping[str, Any], *, in_place: bool = False
) -> dict:
    """Set dotted fields in a copy of the raw mapping (before validation), with the precedence
    rules of per-stage lists (README, "Overrides, sweeps and per-stage lists"):

    - ``network.hops[i].f`` / ``model.stage_compute[i].f`` on an empty list first materialises
      one entry per stage (hops inheriting every global field; stage compute copying
      ``model.compute``), then sets entry i;
    - ``stages`` is applied first; a new ``stages`` resizes a per-stage list whose entries are all alike (a list whose
      entries differ must be given for the new count, e.g. zipped with ``stages``);
    - setting an acceptance source (``drafter.acceptance.profile|alpha|per_position``)
      replaces the current one (:func:`merge_acceptance`);
    - changing a global field that every entry of the existing ``network.hops`` overrides
      (``network.latency_ms``, ``bandwidth_mbps``, ``jitter``, ``loss_rate``), or
      ``model.compute`` when ``model.stage_compute`` is given, is an error: it would have no
      effect (unless the same overrides also give the list).

    ``in_place=True``: set them in ``raw`` itself (a plain mapping the caller owns).
    """
    if not in_place:
        raw = to_plain(raw)
    items = list(
        overrides.items() if isinstance(overrides, Mapping) else map(parse_override, overrides)
    )
    items.sort(key=lambda kv: kv[0].strip() != "stages")  # stages first: lists follow it
    _check_shadowed(raw, items)
    for key, value in items:
        parts = split_path(key)
        _materialise_per_stage(raw, parts)
        if (
            parts[:2] == ["drafter", "acceptance"]
            and len(parts) == 3
            and parts[2] in ACCEPTANCE_SOURCES
            and value is not None
            and isinstance(nested(raw, "drafter", "acceptance"), dict)
        ):
            acc = merge_acceptance(raw["drafter"]["acceptance"], {parts[2]: value})
            raw["drafter"]["acceptance"] = acc
        set_dotted(raw, key, value)
        if parts == ["stages"]:
            _resize_per_stage(raw)
    return raw


# the per-stage lists: (path, what an entry inheriting everything looks like)
_PER_STAGE = (
    (("network", "hops"), lambda raw: {}),
    (("model", "stage_compute"), lambda raw: {"kind": "linear", **_model_compute(raw)}),
)


def _model_compute(raw: dict) -> dict:
    """A copy of ``model.compute`` for a stage's entry to inherit (one line if not a mapping)."""
    compute = nested(raw, "model", "compute")
    if compute is not None and not isinstance(compute, Mapping):
        raise ScenarioError("model.compute", "is not a mapping (a compute model)", compute)
    return copy.deepcopy(compute) or {}


PER_STAGE_PATHS = ("network.hops", "model.stage_compute")
HOP_GLOBALS = ("latency_ms", "bandwidth_mbps", "jitter", "loss_rate")


def has_per_stage_lists(raw: Mapping) -> bool:
    """Whether ``network.hops`` or ``model.stage_compute`` lists per-stage entries (then
    ``stages`` cannot vary as an array: each stage count is its own scenario)."""
    return any(bool(nested(raw, *where)) for where, _ in _PER_STAGE)


def _stage_count(raw: dict) -> int | None:
    stages = raw.get("stages", DEFAULT_STAGES)
    if isinstance(stages, int) and not isinstance(stages, bool) and 1 <= stages <= MAX_STAGES:
        return stages
    return None


def _materialise_per_stage(raw: dict, parts: list[str | int]) -> None:
    for where, entry in _PER_STAGE:
        if tuple(parts[:2]) != where or len(parts) < 3 or not isinstance(parts[2], int):
            continue
        current = nested(raw, *where)
        count = _stage_count(raw)
        if (current is None or current == []) and count is not None:
            raw.setdefault(where[0], {})
            if isinstance(raw[where[0]], dict):
                raw[where[0]][where[1]] = [entry(raw) for _ in range(count)]


def _resize_per_stage(raw: dict) -> None:
    count = _stage_count(raw)
    for where, _ in _PER_STAGE:
        current = nested(raw, *where)
        if count is None or not isinstance(current, list) or len(current) in (0, count):
            continue
        if all(e == current[0] for e in current):
            raw[where[0]][where[1]] = [copy.deepcopy(current[0]) for _ in range(count)]


def _check_shadowed(raw: dict, items: list[tuple[str, Any]]) -> None:
    keys = [split_path(k) for k, _ in items]

    def gives(*where: str) -> bool:  # the overrides set the list itself (or its parent)
        return any(k[: len(where)] == list(where) or k == list(where[:-1]) for k in keys)

    hops = nested(raw, "network", "hops")
    stage_compute = nested(raw, "model", "stage_compute")
    for (key, value), parts in zip(items, keys, strict=True):
        if (
            len(parts) >= 2
            and parts[0] == "network"
            and parts[1] in HOP_GLOBALS
            and isinstance(hops, list)
            and hops
            and all(isinstance(h, Mapping) and h.get(parts[1]) is not None for h in hops)
            and not gives("network", "hops")
        ):
            raise ScenarioError(
                key,
                f"has no effect: every entry of network.hops sets its own {parts[1]} (change"
                f" network.hops[i].{parts[1]}, or remove {parts[1]} from the hops)",
                value,
            )
        if (
            parts[:2] == ["model", "compute"]
            and isinstance(stage_compute, list)
            and stage_compute
            and not gives("model", "stage_compute")
        ):
            raise ScenarioError(
                key,
                "has no effect: model.stage_compute gives every stage its own compute model"
                " (change model.stage_compute[i], or remove model.stage_compute)",
                value,
            )


def set_dotted(raw: dict, dotted: str, value: Any) -> None:
    parts = split_path(dotted)
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                have = len(node) if isinstance(node, list) else 0
                raise ScenarioError(
                    join_path(parts[: i + 1]), f"no such entry (the list has {have})", value
                )
            if node[part] is None:
                node[part] = {}
            node = node[part]
        else:
            if not isinstance(node, dict):
                raise ScenarioError(join_path(parts[:i]), "is not a mapping", node)
            if node.get(part) is None:
                node[part] = [] if isinstance(nxt, int) else {}
            node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            have = len(node) if isinstance(node, list) else 0
            raise ScenarioError(join_path(parts), f"no such entry (the list has {have})", value)
        node[last] = value
    else:
        if not isinstance(node, dict):
            raise ScenarioError(join_path(parts[:-1]), "is not a mapping", node)
        node[last] = value
