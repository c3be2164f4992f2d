"""Scenario section ``model``: the stages' compute models (linear, roofline, MoE, measured
table), per-pass overheads, the shared host, compute noise, stragglers and idle costs.

Field documentation: README.md's scenario section."""

from __future__ import annotations

import dataclasses
import math

from wansim.config.limits import MAX_STAGES
from wansim.config.validation import spec
from wansim.errors import ScenarioError


@dataclasses.dataclass(frozen=True)
class LinearCompute:
    """t(n) = base_ms + per_token_ms * n for a pass of n tokens."""

    kind: str = spec("linear", choices=("linear",))
    base_ms: float = spec(6.0, ge=0)
    per_token_ms: float = spec(0.02, ge=0)


@dataclasses.dataclass(frozen=True)
class RooflineCompute:
    """t(n) = overhead_ms + max(bytes read / memory bandwidth, FLOPs / peak).

    bytes = params_b*1e9*bytes_per_param + kv_bytes_per_token*context_tokens (weights and KV
    cache are read once per pass); FLOPs = 2*params_b*1e9*n. Defaults: one H200-class GPU
    holding one stage's share of a large model.
    """

    kind: str = spec("roofline", choices=("roofline",))
    params_b: float = spec(4.9, gt=0, doc="active parameters in this stage, billions")
    bytes_per_param: float = spec(1.0, gt=0)
    kv_bytes_per_token: float = spec(0.0, ge=0)
    context_tokens: int = spec(2048, ge=0)
    mem_bandwidth_gbs: float = spec(4800.0, gt=0)
    peak_tflops: float = spec(990.0, gt=0)
    overhead_ms: float = spec(0.5, ge=0)


@dataclasses.dataclass(frozen=True)
class MoeCompute:
    """Roofline for a mixture-of-experts stage: weight bytes grow with the experts touched.

    With E experts, top-k routing and uniform routing, n tokens touch
    E*(1-(1-k/E)^n) distinct experts in expectation; bytes = dense params * bytes_per_param +
    touched*expert params * expert_bytes_per_param (mixed precision, e.g. fp4 experts beside
    fp8 attention), FLOPs = 2*n*(dense + k*expert) params.
    """

    kind: str = spec("moe", choices=("moe",))
    dense_params_b: float = spec(0.5, ge=0)
    experts: int = spec(384, ge=1)
    experts_per_token: int = spec(8, ge=1)
    expert_params_b: float = spec(0.0125, gt=0)
    bytes_per_param: float = spec(1.0, gt=0)
    expert_bytes_per_param: float | None = spec(
        None, gt=0, doc="routed experts' bytes per parameter (default bytes_per_param)"
    )
    kv_bytes_per_token: float = spec(0.0, ge=0)
    context_tokens: int = spec(2048, ge=0)
    mem_bandwidth_gbs: float = spec(4800.0, gt=0)
    peak_tflops: float = spec(990.0, gt=0)
    overhead_ms: float = spec(0.5, ge=0)

    def check(self, path: str) -> None:
        if self.experts_per_token > self.experts:
            raise ScenarioError(
                f"{path}.experts_per_token",
                f"must be <= experts ({self.experts})",
                self.experts_per_token,
            )


@dataclasses.dataclass(frozen=True)
class TableCompute:
    """Measured (n tokens, ms) points, linearly interpolated; beyond the last point the last
    segment's slope is extended (what ``wansim calibrate`` writes)."""

    kind: str = spec("table", choices=("table",))
    points: tuple[tuple[float, float], ...] = spec(((1.0, 6.0), (64.0, 7.3)), max_items=10_000)

    def check(self, path: str) -> None:
        ns = [n for n, _ in self.points]
        if len(ns) < 1:
            raise ScenarioError(f"{path}.points", "needs at least one [n, ms] point", [])
        if any(n < 1 for n in ns) or any(ms < 0 for _, ms in self.points):
            raise ScenarioError(f"{path}.points", "need n >= 1 and ms >= 0", list(self.points))
        if sorted(set(ns)) != ns:
            raise ScenarioError(f"{path}.points", "n must be strictly increasing", ns)


COMPUTE_VARIANTS = {
    "linear": LinearCompute,
    "roofline": RooflineCompute,
    "moe": MoeCompute,
    "table": TableCompute,
}
ComputeModel = LinearCompute | RooflineCompute | MoeCompute | TableCompute


NOISE_KINDS = ("none", "lognormal", "gamma")


@dataclasses.dataclass(frozen=True)
class ComputeNoise:
    """Per-pass noise on a stage's pass time (compute model + overhead): the pass takes X times
    its deterministic time, X independent per pass and stage with mean 1 and coefficient of
    variation ``cv`` (lognormal or gamma), at the stages listed in ``stages`` (empty: every
    stage). :mod:`wansim.stages.slowdown`."""

    kind: str = spec("none", choices=NOISE_KINDS)
    cv: float = spec(0.0, ge=0, le=10)
    stages: tuple[int, ...] = spec((), ge=0, max_items=MAX_STAGES, doc="empty: every stage")

    def check(self, path: str) -> None:
        if (self.kind == "none") != (self.cv == 0):
            raise ScenarioError(
                f"{path}.cv",
                "must be > 0 with a noise kind and 0 with kind none",
                self.cv,
            )


@dataclasses.dataclass(frozen=True)
class Straggler:
    """Intermittent stragglers: a listed stage (empty: every stage) is slow - its passes take
    ``factor`` x their time - for a random ``fraction`` of the time, in episodes of mean
    ``episode_ms`` (exponential, as the gaps between them); ``episode_ms: 0``: each pass is
    slow with probability ``fraction`` on its own. A pass is slow when it starts in an
    episode. :mod:`wansim.stages.slowdown`."""

    fraction: float = spec(0.0, ge=0, lt=1)
    factor: float = spec(1.0, ge=1, le=1000)
    episode_ms: float = spec(0.0, ge=0)
    stages: tuple[int, ...] = spec((), ge=0, max_items=MAX_STAGES, doc="empty: every stage")

    def check(self, path: str) -> None:
        if (self.fraction == 0) != (self.factor == 1):
            raise ScenarioError(
                f"{path}.factor",
                f"must be > 1 with fraction > 0 and 1 with fraction 0 (fraction {self.fraction})",
                self.factor,
            )


IDLE_FOLLOWS = ("stage", "host")  # model.idle_follows (wansim.stages.idle_cost)


@dataclasses.dataclass(frozen=True)
class IdleCost:
    """A pass after an idle period costs more: the first work a stage does after it idled
    ``g`` ms takes ``extra_ms(g)`` ms more (caches, TLBs and the CPU's state cooled), from
    ``points`` of [idle ms, extra ms], linearly interpolated, the end values held beyond them;
    no points: off. Every stage; the drafting on a stage is part of its pass.
    :mod:`wansim.stages.idle_cost`."""

    points: tuple[tuple[float, float], ...] = spec(
        (), max_items=1_000, doc="[idle ms, extra ms] pairs, idle strictly increasing"
    )

    def check(self, path: str) -> None:
        idle = [g for g, _ in self.points]
        if any(not (math.isfinite(g) and g >= 0) for g in idle) or any(
            not (math.isfinite(ms) and ms >= 0) for _, ms in self.points
        ):
            raise ScenarioError(
                f"{path}.points", "need finite idle ms >= 0 and extra ms >= 0", list(self.points)
            )
        if sorted(set(idle)) != idle:
            raise ScenarioError(f"{path}.points", "idle ms must be strictly increasing", idle)


@dataclasses.dataclass(frozen=True)
class Model:
    """``compute``: every stage's compute model. ``stage_compute``: optional, one entry per stage
    (P entries, each naming its ``kind``) replacing ``compute`` stage by stage, for pipelines
    whose stages differ (``wansim calibrate`` writes measured ``table`` entries here).
    ``overhead_ms`` (or ``stage_overhead_ms``, P entries): a fixed cost per pass per stage on top
    of the compute model (a roofline's own ``overhead_ms`` included), times ``host_cpu_factor``
    (:func:`wansim.stages.compute.stage_overheads_ms`). ``sequence_ms`` (or
    ``stage_sequence_ms``): what each sequence beyond the first adds to a batched pass (several
    requests' blocks in one pass), times ``host_cpu_factor``
    (:func:`wansim.stages.compute.stage_sequence_costs_ms`). ``host_cores``: every stage on one host
    of that many cores, passes computing at once sharing them (:mod:`wansim.stages.host_cpu`)."""

    hidden_size: int = spec(7168, ge=1)
    compute: ComputeModel = spec(factory=LinearCompute, variants=COMPUTE_VARIANTS)
    stage_compute: tuple[ComputeModel, ...] = spec(
        (), variants=COMPUTE_VARIANTS, max_items=MAX_STAGES
    )
    overhead_ms: float = spec(
        0.0, ge=0, doc="fixed host-side cost of every pass at every stage (coordinator, launches)"
    )
    stage_overhead_ms: tuple[float, ...] = spec(
        (), ge=0, max_items=MAX_STAGES, doc="per stage, replaces overhead_ms"
    )
    sequence_ms: float = spec(
        0.0,
        ge=0,
        doc="each sequence beyond the first in a batched pass adds this to every stage's pass"
        " (the requests' caches laid side by side and split back)",
    )
    stage_sequence_ms: tuple[float, ...] = spec(
        (), ge=0, max_items=MAX_STAGES, doc="per stage, replaces sequence_ms"
    )
    host_cpu_factor: float = spec(
        1.0,
        gt=0,
        doc="multiplies the overhead and the per-sequence cost: a loaded host CPU (>1) slows"
        " the host-side work",
    )
    host_cores: int | None = spec(
        None,
        ge=1,
        doc="CPU cores of the one host every stage (and its drafting) runs on; computes "
        "overlapping beyond it share the cores (null: unlimited, each stage its own CPU)",
    )
    noise: ComputeNoise = spec(factory=ComputeNoise)
    straggler: Straggler = spec(factory=Straggler)
    idle_cost: IdleCost = spec(factory=IdleCost)
    stage_idle_cost: tuple[IdleCost, ...] = spec(
        (), max_items=MAX_STAGES, doc="per stage, replaces idle_cost (P entries)"
    )
    idle_follows: str = spec(
        "stage",
        choices=IDLE_FOLLOWS,
        doc="whose idle an idle cost follows: the stage's own since its last work (each stage"
        " its own machine) or the host's since any stage last worked (every stage on one"
        " host: a stage that idled while the others computed finds the host warm)",
    )
