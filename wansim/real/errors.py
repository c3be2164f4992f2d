"""Errors of the real execution path.

- :class:`RealConfigError`: bad input (a missing checkpoint directory, a bad bit width...): one
  line ``field: problem, got value`` (a :class:`wansim.errors.WansimInputError`, so the CLI maps
  it to exit code 2).
- :class:`PipelineError`: a run that failed while running (a dead stage, a malformed frame, a
  stalled link). The message names the stage and hop; ``run_dir`` holds what was recorded so far.
"""

from __future__ import annotations

from wansim.errors import WansimInputError


class RealConfigError(WansimInputError):
    """Bad settings for a real run."""


class PipelineError(RuntimeError):
    """A real run failed; ``stage``/``hop`` say where (None when unknown)."""

    def __init__(
        self,
        message: str,
        *,
        stage: int | None = None,
        hop: int | None = None,
        run_dir: str | None = None,
    ):
        self.stage = stage
        self.hop = hop
        self.run_dir = run_dir
        suffix = f" (recorded so far: {run_dir})" if run_dir else ""
        super().__init__(message + suffix)
