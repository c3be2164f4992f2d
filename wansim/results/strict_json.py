"""Strict JSON (RFC 8259) for everything wansim prints or writes: no NaN or Infinity.

:func:`plain` turns numpy scalars and arrays into Python values and every non-finite float into
``None`` (``null``); :func:`dumps` serialises with ``allow_nan=False``, so a non-finite value
that slipped through fails loudly here rather than in a user's parser. Where a value is
undefined for a known reason, the producer says why beside it (e.g. a result's ``undefined``
mapping: metric name -> reason).
"""

from __future__ import annotations

import gc
import json
import math
from typing import Any


def plain(obj: Any) -> Any:
    """numpy -> Python, tuples -> lists, non-finite floats -> None (recursively)."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return plain(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`plain` (obj), strict (``allow_nan=False``)."""
    return json.dumps(plain(obj), allow_nan=False, **kwargs)


def dumps_large(obj: Any) -> str:
    """:func:`dumps` for large documents of plain values (a Perfetto trace's hundreds of
    thousands of events): serialised as they are, numpy scalars converted where met, with the
    garbage collector paused; the same text as :func:`dumps`. A non-finite float (refused
    there) sends the document through :func:`dumps`, which writes it as null."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return json.dumps(obj, allow_nan=False, default=_numpy_value)
    except ValueError:
        return dumps(obj)
    finally:
        if paused:
            gc.enable()


def _numpy_value(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return plain(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def non_finite_paths(obj: Any, path: str = "") -> list[str]:
    """Paths (``a.b[2]``) of the non-finite floats inside ``obj`` (for reasons and tests)."""
    if isinstance(obj, dict):
        return [
            p
            for k, v in obj.items()
            for p in non_finite_paths(v, f"{path}.{k}" if path else str(k))
        ]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in non_finite_paths(v, f"{path}[{i}]")]
    if hasattr(obj, "tolist"):
        return non_finite_paths(obj.tolist(), path)
    if isinstance(obj, float) and not math.isfinite(obj):
        return [path]
    return []
