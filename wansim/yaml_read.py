"""How wansim reads YAML: ``yaml.safe_load`` with YAML 1.2's number syntax.

PyYAML follows YAML 1.1, where ``1e3`` (no dot) and ``1E-6`` are strings; a user writing
``bandwidth_mbps: 1e3`` (or ``--set network.bandwidth_mbps=1e3``) means the number 1000. This
loader reads every YAML 1.2 float (``1e3``, ``-2.5E-4``, ``5e+2``) as a float; everything else is exactly ``yaml.safe_load``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    pass


# YAML 1.2 floats PyYAML's 1.1 resolver misses (an exponent without a dot); its own resolvers
# come first, so ints, 1.1 floats, booleans and strings read as before
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+)$"),
    list("-+0123456789."),
)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` reading ``1e3``-style numbers as floats (module docstring)."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
