"""Reading YAML that users wrote (scenarios, sweeps, profiles, ``--set`` values), with limits.

The document is checked on the parser's event stream before any Python object is built, so a
hostile or broken file fails fast with one line instead of hanging or exhausting memory:

- text must be UTF-8 (a byte-order mark is allowed);
- collections nest at most :data:`MAX_DEPTH` deep;
- with every alias expanded, the document holds at most :data:`MAX_NODES` values (a ~400-byte
  "billion laughs" file expands to 9**9; it is rejected after reading its ~90 events);
- an alias may not refer to a collection that contains it (a self-referencing structure).

Numbers: YAML 1.2's float syntax; YAML 1.1 (PyYAML) reads ``1e3`` (no decimal point) and
``1.5e308`` (no exponent sign) as strings, here they are floats, as a user means them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from wansim.data import is_file
from wansim.errors import WansimInputError

MAX_DEPTH = 32
MAX_NODES = 1_000_000
MAX_FILE_BYTES = 64 << 20


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads exponent-only numbers (``1e3``) as floats."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+)$"),
    list("-+0123456789."),
)


def _check_events(text: str, fail) -> None:
    """Depth, expanded size and alias cycles, from the event stream (no objects built)."""
    sizes: dict[str, int] = {}  # anchor -> expanded values under it
    stack: list[list] = []  # open collections: [anchor, values so far]
    total = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            stack.append([event.anchor, 1])
            if len(stack) > MAX_DEPTH:
                raise fail(f"nested more than {MAX_DEPTH} deep (lists or mappings)")
            continue
        if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, size = stack.pop()
            if anchor is not None:
                sizes[anchor] = size
            if stack:
                stack[-1][1] += size
            continue
        if isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in stack):
                raise fail(f"alias *{event.anchor} refers to a collection that contains it")
            size = sizes.get(event.anchor, 1)
        elif isinstance(event, yaml.ScalarEvent):
            size = 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        else:
            continue
        total += size
        if stack:
            stack[-1][1] += size
        if total > MAX_NODES:
            raise fail(f"expands to more than {MAX_NODES:,} values (YAML aliases)")


def load_yaml_text(text: str, what: str, source: str | None = None) -> Any:
    """Parse ``text`` within the limits of the module docstring; errors name ``what`` (and
    ``source``, the file, when given)."""

    def fail(problem: str) -> WansimInputError:
        return (
            WansimInputError(what, problem)
            if source is None
            else WansimInputError(what, problem, source)
        )

    try:
        _check_events(text, fail)
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.reader.ReaderError as exc:
        raise fail(
            f"holds a character YAML does not allow (#x{exc.character:04x} at offset"
            f" {exc.position})"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise fail(f"not valid YAML{where}") from None


def read_yaml_file(path: str | Path, what: str) -> Any:
    """The parsed content of a YAML file; every failure is one :class:`WansimInputError`
    naming ``what`` with the file as its value."""
    p = Path(path)
    if not is_file(p):
        raise WansimInputError(what, "file not found", str(path))
    if _size(p) > MAX_FILE_BYTES:
        raise WansimInputError(what, f"file larger than {MAX_FILE_BYTES >> 20} MiB", str(path))
    return load_yaml_text(read_text(p, what), what, str(path))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # (read_text names why it cannot be read)
        return 0


def read_text(path: Path, what: str) -> str:
    """A user's file's text as UTF-8 (a leading byte-order mark dropped); a file that cannot be
    read (a device, no permission, an I/O error) or is not UTF-8 is one
    :class:`WansimInputError` naming ``what`` with the file as its value."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        why = (exc.strerror or type(exc).__name__).lower()
        raise WansimInputError(what, f"cannot be read ({why})", str(path)) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise WansimInputError(
            what,
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            str(path),
        ) from None
