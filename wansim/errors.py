"""Errors for bad input: one line naming the field path, the problem and the value.

Every user-facing input error is a :class:`WansimInputError`; the CLI prints ``str(err)`` and
exits with code 2. Never a traceback for bad input.
"""

from __future__ import annotations

_UNSET = object()


MAX_VALUE_CHARS = 80
MAX_PATH_CHARS = 120
MIN_PATH_CHARS = 40
# a whole error line, the CLI's "error: " included, within 400 characters where a long path
# can give way (WansimInputError)
MAX_ERROR_CHARS = 400 - len("error: ")


def format_value(value: object, _depth: int = 0) -> str:
    """Render a value the way a user typed it (strings quoted, floats short), on one line and
    at most :data:`MAX_VALUE_CHARS` characters."""
    if _depth > 3:
        return "..."
    if isinstance(value, str):
        text = repr(value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS])
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, int) and abs(value) >= 10**15:
        text = f"a {len(str(abs(value)))}-digit integer"
    elif isinstance(value, (list, tuple)):
        inner = ", ".join(format_value(v, _depth + 1) for v in value[:8])
        text = f"[{inner}{', ...' if len(value) > 8 else ''}]"
    elif isinstance(value, dict):
        items = list(value.items())[:8]
        inner = ", ".join(f"{_one_line(k)}: {format_value(v, _depth + 1)}" for k, v in items)
        text = "{" + inner + (", ..." if len(value) > 8 else "") + "}"
    else:
        text = _one_line(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _one_line(value: object) -> str:
    """``str(value)`` with control characters (newlines...) escaped."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class WansimInputError(ValueError):
    """Bad input from a user: a scenario, an override, a profile, a trace, a flag.

    ``str(err)`` is ``"<path>: <problem>, got <value>"`` (or without the value when there is none),
    e.g. ``network.hops[3].bandwidth_mbps: must be > 0, got -5``.
    """

    def __init__(self, path: str, problem: str, value: object = _UNSET):
        self.path = path
        self.problem = problem
        self.value = value
        got = f", got {format_value(value)}" if value is not _UNSET else ""
        # a long path gives way first (both ends kept: the file and the field inside it), so
        # that the line fits where it can; what is allowed (the problem) is never cut
        room = max(MIN_PATH_CHARS, MAX_ERROR_CHARS - len(problem) - len(got) - 2)
        shown = _one_line(path)
        cap = min(MAX_PATH_CHARS, room)
        if len(shown) > cap:
            head = cap // 3
            shown = shown[:head] + "..." + shown[len(shown) - (cap - head - 3) :]
        text = f"{shown}: {problem}" if path else problem
        super().__init__(text + got)

    def __reduce__(self):
        """Pickled as its three parts (a process pool's worker sends it to the parent)."""
        given = () if self.value is _UNSET else (self.value,)
        return type(self), (self.path, self.problem, *given)


class ScenarioError(WansimInputError):
    """A scenario field (or override) is wrong."""


class ProfileError(WansimInputError):
    """An acceptance profile or trace file is wrong."""
