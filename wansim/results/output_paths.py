"""Output paths checked before a run starts: an unwritable ``--out`` or ``--perfetto`` is bad
input (exit 2, one line naming the flag, the path and why), found before minutes of work, not
a traceback after them. The checks create nothing (a run rejected later leaves no folder)."""

from __future__ import annotations

import os
from pathlib import Path

from wansim.errors import WansimInputError


def writable_dir(path: str | os.PathLike, flag: str) -> Path:
    """Raise unless ``path`` is a writable folder or could be created as one."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise WansimInputError(flag, "is a file, not a folder", str(path))
        if not os.access(p, os.W_OK | os.X_OK):
            raise WansimInputError(
                flag, "cannot write in the folder (permission denied)", str(path)
            )
        return p
    _creatable(p, flag, str(path))
    return p


def writable_file(path: str | os.PathLike, flag: str) -> Path:
    """Raise unless ``path`` can be written as a file (its folder may still have to be made)."""
    p = Path(path)
    if p.is_dir():
        raise WansimInputError(flag, "is a folder, not a file", str(path))
    if p.exists():
        if not os.access(p, os.W_OK):
            raise WansimInputError(flag, "cannot write the file (permission denied)", str(path))
        return p
    _creatable(p, flag, str(path))
    return p


def _creatable(p: Path, flag: str, shown: str) -> None:
    """The nearest existing ancestor of ``p`` must be a folder we can write in."""
    ancestor = p.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise WansimInputError(flag, f"cannot be created: {ancestor} is a file", shown)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise WansimInputError(flag, f"cannot be created: no write permission in {ancestor}", shown)
