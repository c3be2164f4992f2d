"""Package names imported on first use (a module ``__getattr__``, PEP 562).

A package lists ``name -> defining module`` and sets ``__getattr__ = lazy_exports(__name__,
EXPORTS)``: importing one submodule (a light CLI command's) then does not import the others'
dependencies (pandas, scipy).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``exports[name]``'s attribute ``name``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
