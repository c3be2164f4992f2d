"""A timeline kept as columns: the vectorised lone ring's (:mod:`wansim.sim.lone_ring`).

The event engine appends a tuple per slice as it goes (:class:`wansim.sim.record.Timeline`); the
lone ring computes every pass's clock in blocks, and that clock is already the whole timeline:
each stage's start and end, each message's offer, serialisation end and delivery are entries
of it. So the run keeps only its blocks' clocks (no Python object per slice, nothing for the
garbage collector to walk), and the timeline's columns -- one numpy array per field -- are
derived from them on first read. Readers see the :class:`Timeline`'s fields (``stage_slices``,
``transfers``, ``verify_log``, ``software``, ``window_stalls``, ``slowdowns``): the same tuples,
in the same order, as the events append them (``tests/engines/test_lone_ring.py``), built from
the columns on first read (each pass's :class:`~wansim.sim.messages.Pass` made then, one per
pass, shared by its slices as the events share it). A lone ring has no tcp window and no
compute noise: those two are empty.

Pass rows: pass j of the run is request ``pass_rid[j]``'s step ``pass_step[j]`` (0: prefill) of
``pass_n[j]`` tokens; a slice or a transfer names its pass by that row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from wansim.sim.messages import PREFILL, VERIFY, Pass

SLICE_KINDS = ("prefill", "verify", "draft")  # a slice's ``what`` code -> its name
DRAFT = 2


class ColumnarTimeline:
    """The run's slices as columns (module docstring); read like a :class:`Timeline`."""

    def __init__(self, stage_names, link_names, requests, columns: Callable[[], dict]):
        self.stage_names = stage_names
        self.link_names = link_names
        self.requests = requests
        self._columns = columns

    @functools.cached_property
    def columns(self) -> dict[str, np.ndarray]:
        """Every field's column (the run's own arrays, derived once on first read)."""
        return self._columns()

    def _passes(self) -> list[list[Pass]]:
        c, requests = self.columns, self.requests
        rows = zip(
            c["pass_rid"].tolist(), c["pass_step"].tolist(), c["pass_n"].tolist(), strict=True
        )
        return [
            [Pass(requests[rid], VERIFY if step else PREFILL, step, n)] for rid, step, n in rows
        ]

    @functools.cached_property
    def _pass_lists(self) -> list[list[Pass]]:
        return self._passes()

    @functools.cached_property
    def stage_slices(self) -> list[tuple]:
        """(stage, start_ms, end_ms, what, passes), as the stages append them."""
        c, passes = self.columns, self._pass_lists
        what = [SLICE_KINDS[k] for k in c["slice_what"].tolist()]
        return [
            (stage, start, end, kind, passes[row])
            for stage, start, end, kind, row in zip(
                c["slice_stage"].tolist(),
                c["slice_start_ms"].tolist(),
                c["slice_end_ms"].tolist(),
                what,
                c["slice_pass"].tolist(),
                strict=True,
            )
        ]

    @functools.cached_property
    def transfers(self) -> list[tuple]:
        """(hop, offer_ms, start_ms, busy_end_ms, delivery_ms, bytes, losses, passes)."""
        c, passes = self.columns, self._pass_lists
        names = ("offer_ms", "start_ms", "free_ms", "delivery_ms", "bytes", "losses")
        fields = [c[f"transfer_{name}"].tolist() for name in names]
        return [
            (hop, *values, passes[row])
            for hop, *values, row in zip(
                c["transfer_hop"].tolist(), *fields, c["transfer_pass"].tolist(), strict=True
            )
        ]

    @functools.cached_property
    def verify_log(self) -> list[tuple]:
        """(rid, step, time_ms, n, accepted, remaining_before, committed) per verify pass."""
        c = self.columns
        names = ("rid", "step", "time_ms", "n", "accepted", "remaining", "committed")
        return list(zip(*(c[f"verify_{name}"].tolist() for name in names), strict=True))

    @functools.cached_property
    def software(self) -> list[tuple]:
        """(hop, start_ms, end_ms) of each message's per-message and codec cost."""
        c = self.columns
        names = ("hop", "start_ms", "end_ms")
        return list(zip(*(c[f"software_{name}"].tolist() for name in names), strict=True))

    @property
    def window_stalls(self) -> list[tuple]:
        return []  # no tcp in a lone ring

    @property
    def slowdowns(self) -> list[tuple]:
        return []  # no compute noise or stragglers in a lone ring
