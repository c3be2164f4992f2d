"""Strict parsing of plain YAML data into frozen dataclasses.

A dataclass field declares its constraints with :func:`spec` (choices, numeric bounds, variants
of a tagged union). :func:`parse` walks a mapping, rejects unknown keys and wrong types, fills
omitted fields from defaults (a partial mapping keeps the defaults of what it omits), checks the
bounds and finally calls the instance's ``check(path)`` hook for cross-field rules. Every failure
is a one-line :class:`~wansim.errors.ScenarioError` naming the dotted path.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

from wansim.errors import ScenarioError

_NOTHING = dataclasses.MISSING


def spec(
    default: Any = _NOTHING,
    *,
    factory: Any = _NOTHING,
    choices: tuple | None = None,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    variants: Mapping[str, type] | None = None,
    doc: str = "",
) -> Any:
    """A dataclass field with validation metadata.

    ``variants`` maps a ``kind`` tag to the dataclass to build (a tagged union): a mapping without
    ``kind`` keeps the kind of the default.
    """
    meta = {
        "choices": choices,
        "gt": gt,
        "ge": ge,
        "lt": lt,
        "le": le,
        "variants": dict(variants) if variants else None,
        "doc": doc,
    }
    if factory is not _NOTHING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def parse(cls: type, raw: Any, path: str, base: Any = None) -> Any:
    """Build ``cls`` from ``raw`` (a mapping); ``base`` supplies defaults for omitted keys."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ScenarioError(path or "scenario", "must be a mapping", raw)
    allowed = field_names(cls)
    for key in raw:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise ScenarioError(where, f"unknown key (allowed: {', '.join(allowed)})", raw[key])
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        default = _default_of(f, base)
        if f.name in raw:
            values[f.name] = _convert(hints[f.name], raw[f.name], where, f.metadata, default)
        else:
            values[f.name] = default
    obj = cls(**values)
    check = getattr(obj, "check", None)
    if check is not None:
        check(path)
    return obj


def _default_of(f: dataclasses.Field, base: Any) -> Any:
    if base is not None:
        return getattr(base, f.name)
    if f.default is not _NOTHING:
        return f.default
    if f.default_factory is not _NOTHING:
        return f.default_factory()
    raise TypeError(f"field {f.name} has no default")


def _convert(tp: Any, value: Any, path: str, meta: Mapping, default: Any) -> Any:
    variants = meta.get("variants")
    origin = typing.get_origin(tp)
    if variants and origin is not tuple:  # a list of variants: each item is converted below
        return _convert_variant(variants, value, path, default)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        if len(args) != 1:
            raise TypeError(f"unsupported union {tp}")
        return _convert(args[0], value, path, meta, default)
    if origin is tuple:
        return _convert_tuple(tp, value, path, meta)
    if dataclasses.is_dataclass(tp):
        base = default if isinstance(default, tp) else None
        return parse(tp, value, path, base)
    return _convert_scalar(tp, value, path, meta)


def _convert_variant(variants: Mapping[str, type], value: Any, path: str, default: Any) -> Any:
    if not isinstance(value, Mapping):
        raise ScenarioError(path, "must be a mapping", value)
    kind = value.get("kind", getattr(default, "kind", None))
    if kind not in variants:
        raise ScenarioError(f"{path}.kind", f"must be one of {' | '.join(variants)}", kind)
    cls = variants[kind]
    base = default if isinstance(default, cls) else None
    return parse(cls, value, path, base)


def _convert_tuple(tp: Any, value: Any, path: str, meta: Mapping) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise ScenarioError(path, "must be a list", value)
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        item_types = [args[0]] * len(value)
    else:
        if len(value) != len(args):
            raise ScenarioError(path, f"must be a list of {len(args)} items", value)
        item_types = list(args)
    out = []
    for i, (item_tp, item) in enumerate(zip(item_types, value, strict=True)):
        out.append(_convert(item_tp, item, f"{path}[{i}]", meta, None))
    return tuple(out)


def _convert_scalar(tp: Any, value: Any, path: str, meta: Mapping) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            raise ScenarioError(path, "must be true or false", value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise ScenarioError(path, "must be an integer", value)
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(path, "must be a number", value)
        value = float(value)
        if not math.isfinite(value):
            raise ScenarioError(path, "must be a finite number", value)
    elif tp is str:
        if not isinstance(value, str):
            raise ScenarioError(path, "must be a string", value)
    else:
        raise TypeError(f"unsupported field type {tp} at {path}")
    check_bounds(value, path, meta)
    return value


def check_bounds(value: Any, path: str, meta: Mapping) -> None:
    """Raise if ``value`` breaks the field's choices or numeric bounds."""
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ScenarioError(path, f"must be one of {' | '.join(map(str, choices))}", value)
    for key, op, word in (
        ("gt", float.__gt__, ">"),
        ("ge", float.__ge__, ">="),
        ("lt", float.__lt__, "<"),
        ("le", float.__le__, "<="),
    ):
        bound = meta.get(key)
        if bound is not None and not op(float(value), float(bound)):
            raise ScenarioError(path, f"must be {word} {bound:g}", value)
