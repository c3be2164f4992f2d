"""Scenario section ``faults``: stages and links that fail, and how the ring recovers.

Field documentation: README.md's scenario section."""

from __future__ import annotations

import dataclasses

from wansim.config.validation import spec
from wansim.errors import ScenarioError

RECOVERIES = ("failover", "fail")
MAX_FAULTS = 10_000


@dataclasses.dataclass(frozen=True)
class FaultEvent:
    """One failing component: exactly one of ``stage`` (index) or ``link`` (hop index; the
    last is the return hop), and exactly one of ``at_s`` (one failure at that simulated time)
    or ``rate_per_hour`` (failures at that Poisson rate while the ring is up). ``downtime_s``:
    how long the ring cannot serve after it (default ``faults.detection_s``)."""

    stage: int | None = spec(None, ge=0)
    link: int | None = spec(None, ge=0)
    at_s: float | None = spec(None, ge=0)
    rate_per_hour: float | None = spec(None, gt=0, le=3_600_000)
    downtime_s: float | None = spec(None, ge=0, le=1e7)

    def check(self, path: str) -> None:
        if (self.stage is None) == (self.link is None):
            raise ScenarioError(path, "give exactly one of stage, link", self._given())
        if (self.at_s is None) == (self.rate_per_hour is None):
            raise ScenarioError(path, "give exactly one of at_s, rate_per_hour", self._given())

    def _given(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    @property
    def component(self) -> str:
        """``stage 3`` or ``link 2`` (Perfetto and details)."""
        return f"stage {self.stage}" if self.stage is not None else f"link {self.link}"


@dataclasses.dataclass(frozen=True)
class Faults:
    """Stage and link failures (:mod:`wansim.faults`). A failure stops the whole ring for its
    downtime (``detection_s`` unless the event gives ``downtime_s``): every pass in flight is
    lost. ``recovery: failover``: a spare takes the component's place and every request that
    was in flight re-prefills its prompt plus the tokens it had committed, then decodes on;
    ``fail``: those requests fail (their tokens do not count as goodput)."""

    recovery: str = spec("failover", choices=RECOVERIES)
    detection_s: float = spec(1.0, ge=0, le=1e7, doc="failure to the spare serving, seconds")
    events: tuple[FaultEvent, ...] = spec((), max_items=MAX_FAULTS)
