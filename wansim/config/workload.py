"""Scenario section ``workload``: the requests - how many, how long, how they arrive, the
KV capacity and the service-level objective.

Field documentation: README.md's scenario section."""

from __future__ import annotations

import dataclasses

from wansim.config.validation import spec
from wansim.errors import ScenarioError

ARRIVALS = ("closed", "poisson", "gamma", "onoff", "trace")
LENGTH_KINDS = ("fixed", "lognormal", "empirical", "trace")


@dataclasses.dataclass(frozen=True)
class Slo:
    """A request meets the service-level objective when its TTFT is at most ``ttft_ms`` and its
    TPOT at most ``tpot_ms`` (null: no bound). Gives ``slo_attainment`` and
    ``goodput_requests_per_s``."""

    ttft_ms: float | None = spec(None, gt=0)
    tpot_ms: float | None = spec(None, gt=0)


@dataclasses.dataclass(frozen=True)
class Lengths:
    """Per-request prompt and output lengths (:mod:`wansim.serving.workload`): ``fixed`` (the
    workload's prompt_tokens/output_tokens), ``lognormal`` (those are the means; ``prompt_cv``,
    ``output_cv`` the coefficients of variation; clipped to the maxima), ``empirical`` (pairs
    drawn from ``workload.trace``'s rows) or ``trace`` (its rows in order)."""

    kind: str = spec("fixed", choices=LENGTH_KINDS)
    prompt_cv: float = spec(0.0, ge=0, le=10)
    output_cv: float = spec(0.0, ge=0, le=10)
    max_prompt_tokens: int = spec(131_072, ge=1, le=10_000_000)
    max_output_tokens: int = spec(32_768, ge=2, le=10_000_000)


@dataclasses.dataclass(frozen=True)
class MixRow:
    """A share of the requests whose acceptance is the profile's ``workload`` row."""

    workload: str = spec("math")
    share: float = spec(1.0, gt=0)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Requests of ``prompt_tokens`` (one prefill pass) and ``output_tokens`` (the first from
    prefill, the rest committed by verify passes). ``closed``: ``concurrency`` requests in
    flight, a new one starts when one finishes; open arrivals (``poisson``, ``gamma``,
    ``onoff``, ``trace``) wait for one of the ``concurrency`` slots. Arrival processes, length
    distributions, traces and mixes: :mod:`wansim.serving.workload`."""

    requests: int = spec(64, ge=1, le=1_000_000)
    concurrency: int = spec(1, ge=1, le=65_536)
    prompt_tokens: int = spec(512, ge=1, le=10_000_000)
    output_tokens: int = spec(256, ge=2)
    arrival: str = spec("closed", choices=ARRIVALS)
    rate_per_s: float = spec(1.0, gt=0)
    arrival_cv: float = spec(
        1.0, gt=0, le=100, doc="gamma arrivals: coefficient of variation of the gaps"
    )
    on_ms: float = spec(1000.0, gt=0, doc="onoff arrivals: mean on period")
    off_ms: float = spec(1000.0, gt=0, doc="onoff arrivals: mean off period")
    lengths: Lengths = spec(factory=Lengths)
    trace: str | None = spec(
        None, doc="request trace (CSV or .parquet): arrival_ms, prompt_tokens, output_tokens"
    )
    mix: tuple[MixRow, ...] = spec((), max_items=64)
    slo: Slo = spec(factory=Slo)
    kv_capacity_tokens: int | None = spec(
        None,
        ge=1,
        doc="KV cache tokens the tightest stage holds for the sequences in flight (a request"
        " reserves prompt + output at admission); null: only concurrency limits the batch",
    )

    def check(self, path: str) -> None:
        if self.trace is not None and not (
            self.arrival == "trace" or self.lengths.kind in ("trace", "empirical")
        ):
            raise ScenarioError(
                f"{path}.trace",
                "is read only by arrival: trace or lengths.kind: trace | empirical",
                self.trace,
            )
        if self.lengths.kind != "lognormal" and (self.lengths.prompt_cv or self.lengths.output_cv):
            raise ScenarioError(
                f"{path}.lengths.kind",
                "prompt_cv/output_cv need kind: lognormal",
                self.lengths.kind,
            )
        names = [r.workload for r in self.mix]
        if len(set(names)) != len(names):
            raise ScenarioError(f"{path}.mix", "names a workload twice", names)
        if self.kv_capacity_tokens is not None and self.lengths.kind in ("fixed", "lognormal"):
            need, what = self.prompt_tokens + self.output_tokens, "prompt_tokens + output_tokens"
            if self.lengths.kind == "lognormal":
                need = self.lengths.max_prompt_tokens + self.lengths.max_output_tokens
                what = "lengths.max_prompt_tokens + max_output_tokens"
            check_fits(self.kv_capacity_tokens, need, what, path)


def check_fits(capacity: int, need: int, what: str, path: str = "workload") -> None:
    """Bad input when not even one request fits the KV capacity (a batch that cannot fit)."""
    if need > capacity:
        raise ScenarioError(
            f"{path}.kv_capacity_tokens",
            f"holds fewer tokens than one request needs ({what} = {need}): no batch fits",
            capacity,
        )
