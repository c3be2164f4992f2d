"""Errors for bad input: one line naming the field path, the problem and the value.

Every user-facing input error is a :class:`WansimInputError`; the CLI prints ``str(err)`` and
exits with code 2. Never a traceback for bad input.
"""

from __future__ import annotations

_UNSET = object()


def format_value(value: object) -> str:
    """Render a value the way a user typed it (strings quoted, floats short)."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(format_value(v) for v in value)
        return f"[{inner}]"
    if isinstance(value, dict):
        inner = ", ".join(f"{k}: {format_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    return str(value)


class WansimInputError(ValueError):
    """Bad input from a user: a scenario, an override, a profile, a trace, a flag.

    ``str(err)`` is ``"<path>: <problem>, got <value>"`` (or without the value when there is none),
    e.g. ``network.hops[3].bandwidth_mbps: must be > 0, got -5``.
    """

    def __init__(self, path: str, problem: str, value: object = _UNSET):
        self.path = path
        self.problem = problem
        self.value = value
        text = f"{path}: {problem}" if path else problem
        if value is not _UNSET:
            text += f", got {format_value(value)}"
        super().__init__(text)


class ScenarioError(WansimInputError):
    """A scenario field (or override) is wrong."""


class ProfileError(WansimInputError):
    """An acceptance profile or trace file is wrong."""
