"""A progress bar on stderr, no dependency: redrawn in place on a terminal, a line per tenth
otherwise (logs, CI)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _fmt_s(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


class Progress:
    def __init__(
        self,
        total: int,
        done: int = 0,
        *,
        label: str = "runs",
        stream: TextIO | None = None,
        enabled: bool = True,
        width: int = 30,
    ):
        self.total = total
        self.start_done = done
        self.done = done
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and total > 0
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self._last_draw = 0.0
        self._last_tenth = (10 * done) // total if total else 10

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.tty:
            if now - self._last_draw >= 0.1 or self.done >= self.total:
                self._last_draw = now
                self.stream.write("\r" + self.line())
                self.stream.flush()
        else:
            tenth = (10 * self.done) // self.total
            if tenth > self._last_tenth:
                self._last_tenth = tenth
                self.stream.write(self.line() + "\n")
                self.stream.flush()

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        filled = round(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.t0
        new = self.done - self.start_done
        text = f"[{bar}] {self.done}/{self.total} {self.label} {frac:4.0%}  {_fmt_s(elapsed)}"
        if new > 0 and self.done < self.total:
            eta = elapsed / new * (self.total - self.done)
            text += f"  eta {_fmt_s(eta)}"
        return text

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
