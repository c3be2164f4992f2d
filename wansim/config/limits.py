"""Limits shared by the scenario's sections."""

MAX_STAGES = 1024  # stages of a ring (and per-stage lists' entries)
DEFAULT_STAGES = 10  # ``stages`` when a scenario omits it
