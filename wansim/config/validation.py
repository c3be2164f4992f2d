"""Strict parsing of plain YAML data into frozen dataclasses.

A dataclass field declares its constraints with :func:`spec` (choices, numeric bounds, variants
of a tagged union). :func:`parse` walks a mapping, rejects unknown keys and wrong types, fills
omitted fields from defaults (a partial mapping keeps the defaults of what it omits), checks the
bounds and finally calls the instance's ``check(path)`` hook for cross-field rules. Every failure
is a one-line :class:`~wansim.errors.ScenarioError` naming the dotted path.

Limits every field obeys, on top of its own bounds (so that no product of a few fields
overflows and no input makes the engines allocate or loop without bound):

- numbers are finite, and at most :data:`MAX_MAGNITUDE` (1e9) in magnitude unless the field
  declares its own ``le``/``lt`` bound; a nonzero float is at least :data:`MIN_MAGNITUDE`
  (1e-9) in magnitude (write 0 for zero);
- lists hold at most :data:`MAX_ITEMS` items (``max_items`` in :func:`spec` for fewer), counted
  before their items are parsed.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import operator
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

from wansim.errors import ScenarioError

_NOTHING = dataclasses.MISSING
MAX_MAGNITUDE = 1e9
MIN_MAGNITUDE = 1e-9
MAX_ITEMS = 100_000


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
    max_items: int | None = None,
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
        "max_items": max_items,
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


@cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field, ...], frozenset[str]]:
    """A dataclass's fields and their names (fixed once the class is defined)."""
    fields = dataclasses.fields(cls)
    return fields, frozenset(f.name for f in fields)


_MEMO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("parse_memo", default=None)


@contextlib.contextmanager
def parsing_memoised():
    """Within this block :func:`parse` parses each distinct sub-config once: a mapping equal
    to one parsed before (same class, path and base; equal keys, and leaves of the same types
    with the same values) returns the earlier result. Only successes are kept, so bad input
    fails exactly as without the memo. For validating many scenarios that differ in a field
    or two (the grid's per-value validation); results are frozen, so sharing them is safe.

    The key of a mapping is its ``repr``: plain YAML data with the same repr parses alike (a
    leaf's type shows in it: ``1``, ``1.0``, ``True`` and ``'1'`` differ, as do ``0.0`` and
    ``-0.0``)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def parse(cls: type, raw: Any, path: str, base: Any = None) -> Any:
    """Build ``cls`` from ``raw`` (a mapping); ``base`` supplies defaults for omitted keys."""
    memo = _MEMO.get()
    if memo is None or not isinstance(raw, Mapping):
        return _parse(cls, raw, path, base)
    try:
        key = (cls, path, repr(raw), base)
        hash(key)
    except TypeError:  # an unhashable base: parse without the memo
        return _parse(cls, raw, path, base)
    if key not in memo:
        memo[key] = _parse(cls, raw, path, base)
    return memo[key]


def _parse(cls: type, raw: Any, path: str, base: Any) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ScenarioError(path or "scenario", "must be a mapping", raw)
    fields, names = _fields(cls)
    for key in raw:
        if key not in names:
            shown = key if isinstance(key, str) and key.strip() == key != "" else repr(key)
            where = f"{path}.{shown}" if path else shown  # (a blank or padded key: quoted)
            allowed = ", ".join(f.name for f in fields)
            raise ScenarioError(where, f"unknown key (allowed: {allowed})", raw[key])
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in fields:
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
        if set(args) == {float, str}:
            return _convert_number_or_word(value, path, meta)
        if len(args) != 1:
            raise TypeError(f"unsupported union {tp}")
        return _convert(args[0], value, path, meta, default)
    if origin is tuple:
        return _convert_tuple(tp, value, path, meta)
    if dataclasses.is_dataclass(tp):
        base = default if isinstance(default, tp) else None
        return parse(tp, value, path, base)
    return _convert_scalar(tp, value, path, meta)


def _convert_number_or_word(value: Any, path: str, meta: Mapping) -> float | str:
    """``float | str``: a number within the field's bounds, or one of its ``choices`` (the
    words it accepts in place of a number)."""
    words = meta.get("choices") or ()
    if isinstance(value, str):
        if value not in words:
            raise ScenarioError(path, f"must be a number or one of {' | '.join(words)}", value)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(path, f"must be a number or one of {' | '.join(words)}", value)
    return _convert_scalar(float, value, path, {**meta, "choices": None})


def _convert_variant(variants: Mapping[str, type], value: Any, path: str, default: Any) -> Any:
    if not isinstance(value, Mapping):
        raise ScenarioError(path, "must be a mapping", value)
    kind = value.get("kind", getattr(default, "kind", None))
    if not isinstance(kind, str) or kind not in variants:
        raise ScenarioError(f"{path}.kind", f"must be one of {' | '.join(variants)}", kind)
    cls = variants[kind]
    base = default if isinstance(default, cls) else None
    return parse(cls, value, path, base)


def _convert_tuple(tp: Any, value: Any, path: str, meta: Mapping) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise ScenarioError(path, "must be a list", value)
    limit = meta.get("max_items") or MAX_ITEMS
    if len(value) > limit:
        raise ScenarioError(path, f"must have at most {limit:,} items", f"{len(value):,} items")
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
        if isinstance(value, int):
            check_bounds(value, path, meta)  # exactly, before float() (which may overflow)
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
    """Raise if ``value`` breaks the field's choices or numeric bounds (or the module's
    magnitude limits). Numbers are compared exactly (a 400-digit integer is not converted to a
    float)."""
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ScenarioError(path, f"must be one of {' | '.join(map(str, choices))}", value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    for key, op, word in (
        ("gt", operator.gt, ">"),
        ("ge", operator.ge, ">="),
        ("lt", operator.lt, "<"),
        ("le", operator.le, "<="),
    ):
        bound = meta.get(key)
        if bound is not None and not op(value, bound):
            raise ScenarioError(path, f"must be {word} {bound:g}", value)
    if meta.get("le") is None and meta.get("lt") is None and not abs(value) <= MAX_MAGNITUDE:
        raise ScenarioError(path, f"must be at most {MAX_MAGNITUDE:g} in magnitude", value)
    if isinstance(value, float) and value != 0 and abs(value) < MIN_MAGNITUDE:
        raise ScenarioError(path, f"must be 0 or at least {MIN_MAGNITUDE:g} in magnitude", value)
