"""Scenario YAML -> frozen dataclasses, with defaults, overrides and strict validation.

The schema is README.md's scenario section. Every field has a default; a partial mapping keeps the
defaults of what it omits; unknown keys, wrong types and out-of-range values are errors naming the
dotted field path. ``--set a.b=v`` overrides are applied to the raw YAML before validation, so
they are typed and checked exactly like the file.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from wansim.config.user_yaml import load_yaml_text, read_yaml_file
from wansim.config.validation import parse, spec
from wansim.data import on_disk_or_shipped, shipped
from wansim.errors import ScenarioError, WansimInputError

DRAFTER_KINDS = ("mtp", "dspark", "dflash", "eagle", "draft_model", "ngram")
PLACEMENTS = ("first_stage", "last_stage")
# drafters that read the target's last-stage hidden state (review Part V: MTP/DSpark blocks,
# EAGLE heads, DFlash conditioned on target hidden states); a draft model or n-gram lookup
# needs only token ids
HIDDEN_STATE_DRAFTERS = ("mtp", "dspark", "dflash", "eagle")
JITTER_KINDS = ("none", "normal", "lognormal", "pareto", "empirical")
TRANSPORTS = ("ideal", "tcp")
POLICIES = ("none", "chain", "tree")
# verifier rules the engines model; the real path implements REAL_VERIFIERS (no typical)
VERIFIERS = ("lossless", "greedy", "typical")
REAL_VERIFIERS = ("greedy", "lossless")
TREE_KINDS = ("static", "sequoia", "dynamic")
SCHEDULES = ("sync", "async")
CANCEL_ON_DIVERGENCE = "cancel_on_divergence"
FLUSH_ON_FULL_ACCEPTANCE = "flush_on_full_acceptance"
ASYNC_PROTOCOLS = (CANCEL_ON_DIVERGENCE, FLUSH_ON_FULL_ACCEPTANCE)
BATCHING = ("none", "continuous")
ARRIVALS = ("closed", "poisson", "gamma", "onoff", "trace")
LENGTH_KINDS = ("fixed", "lognormal", "empirical", "trace")
RECOVERIES = ("failover", "fail")
MAX_FAULTS = 10_000
ACTIVATION_BITS = (3, 4, 8, 16, 32)
MAX_LOSS_RATE = 0.99
MAX_STAGES = 1024


# ----------------------------------------------------------------------------- compute models
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


# ----------------------------------------------------------------------------- network
@dataclasses.dataclass(frozen=True)
class Jitter:
    """Extra one-way delay J added to a hop's latency L; the delay is max(0, L + J).

    none: J = 0. normal: J ~ N(mean_ms (default 0), std_ms). lognormal: J >= 0 with mean
    mean_ms and standard deviation std_ms; mean_ms defaults to std_ms, so lognormal jitter adds
    its mean (std_ms unless given) to every hop's mean delay. pareto: Lomax (Pareto II from 0)
    with tail index ``shape`` (> 2) and standard deviation std_ms (no mean_ms: its mean,
    std_ms * sqrt((shape - 2) / shape), follows and is added to every hop). empirical: J
    resampled from ``samples_ms`` or a file of one value per line (``samples_file``).
    """

    kind: str = spec("none", choices=JITTER_KINDS)
    std_ms: float = spec(0.0, ge=0)
    mean_ms: float | None = spec(None)
    shape: float = spec(3.0, gt=2)
    samples_ms: tuple[float, ...] = spec((), max_items=100_000)
    samples_file: str | None = spec(None)

    def check(self, path: str) -> None:
        if self.kind == "none" and self.std_ms > 0:
            raise ScenarioError(f"{path}.std_ms", "needs a jitter kind (kind is none)", self.std_ms)
        if self.kind in ("normal", "lognormal", "pareto") and self.std_ms <= 0:
            raise ScenarioError(
                f"{path}.std_ms", f"must be > 0 for {self.kind} jitter", self.std_ms
            )
        if self.mean_ms is not None and self.kind in ("none", "pareto", "empirical"):
            raise ScenarioError(
                f"{path}.mean_ms", f"is not used by {self.kind} jitter", self.mean_ms
            )
        if self.kind == "lognormal" and self.mean_ms is not None and self.mean_ms <= 0:
            raise ScenarioError(f"{path}.mean_ms", "must be > 0 for lognormal jitter", self.mean_ms)
        has_samples = bool(self.samples_ms) or self.samples_file is not None
        if self.kind == "empirical":
            if bool(self.samples_ms) == (self.samples_file is not None):
                raise ScenarioError(
                    path, "empirical jitter needs exactly one of samples_ms, samples_file", None
                )
        elif has_samples:
            raise ScenarioError(
                f"{path}.kind", "samples_ms/samples_file need kind: empirical", self.kind
            )


@dataclasses.dataclass(frozen=True)
class HopOverride:
    """Per-hop values; an omitted field takes the network's value."""

    latency_ms: float | None = spec(None, ge=0)
    bandwidth_mbps: float | None = spec(None, gt=0)
    jitter: Jitter | None = spec(None)
    loss_rate: float | None = spec(None, ge=0, le=MAX_LOSS_RATE)
    per_message_ms: float | None = spec(None, ge=0)
    codec_ms_per_mb: float | None = spec(None, ge=0)


@dataclasses.dataclass(frozen=True)
class Hop:
    """A resolved link: hop i carries stage i's output to stage i+1; the last is the return hop."""

    latency_ms: float
    bandwidth_mbps: float
    jitter: Jitter
    loss_rate: float
    retransmit_ms: float
    per_message_ms: float = 0.0
    codec_ms_per_mb: float = 0.0


@dataclasses.dataclass(frozen=True)
class Tcp:
    """``network.transport: tcp`` (:mod:`wansim.links.tcp`): segments of ``mss_bytes``, an
    initial window of ``initial_window_segments`` segments, the receiver's window
    ``max_window_bytes``, and the window's restart after an idle period longer than
    ``network.retransmit_ms`` (``restart_after_idle``; Linux's tcp_slow_start_after_idle)."""

    mss_bytes: int = spec(1448, ge=64, le=65535)
    initial_window_segments: int = spec(10, ge=1, le=1000)
    max_window_bytes: float = spec(4194304.0, gt=0)
    restart_after_idle: bool = spec(True)

    def check(self, path: str) -> None:
        if self.max_window_bytes < self.mss_bytes:
            raise ScenarioError(
                f"{path}.max_window_bytes",
                f"must hold at least one segment (mss_bytes {self.mss_bytes})",
                self.max_window_bytes,
            )


@dataclasses.dataclass(frozen=True)
class Drift:
    """A slow drift of every hop (:func:`wansim.links.delivery.drift_factors`): from the start
    of the run the latency grows linearly to ``latency_factor`` x its value and the bandwidth to
    ``bandwidth_factor`` x over ``over_ms`` of simulated time, then both hold. Factors of 1: off."""

    latency_factor: float = spec(1.0, gt=0)
    bandwidth_factor: float = spec(1.0, gt=0)
    over_ms: float = spec(7_200_000.0, gt=0, doc="ms of simulated time to reach the factors")


@dataclasses.dataclass(frozen=True)
class Network:
    latency_ms: float = spec(25.0, ge=0)
    bandwidth_mbps: float = spec(1000.0, gt=0)
    jitter: Jitter = spec(factory=Jitter)
    loss_rate: float = spec(
        0.0, ge=0, le=MAX_LOSS_RATE, doc="per transmission; a link losing more is down"
    )
    retransmit_ms: float = spec(200.0, ge=0, doc="extra delay per lost transmission (TCP RTO)")
    per_message_ms: float = spec(
        0.0, ge=0, doc="sender software cost per message (framing, sidecar), paid once"
    )
    codec_ms_per_mb: float = spec(0.0, ge=0, doc="sender codec cost per 10^6 bytes, paid once")
    transport: str = spec("ideal", choices=TRANSPORTS)
    tcp: Tcp = spec(factory=Tcp)
    drift: Drift = spec(factory=Drift)
    trace_file: str | None = spec(
        None, doc="CSV t_ms,latency_factor,bandwidth_factor replayed (wansim.links.nonstationary)"
    )
    hops: tuple[HopOverride, ...] = spec((), max_items=MAX_STAGES)
    idle_cost: IdleCost = spec(
        factory=IdleCost,
        doc="a message after its hop's sender idled costs more (added to per_message_ms)",
    )


# ----------------------------------------------------------------------------- payload
@dataclasses.dataclass(frozen=True)
class ExtraTensor:
    """A tensor of ``values_per_token`` values per token at ``bits`` that stage ``stage``'s
    output adds to the forward message and every later hop carries until stage ``to_stage``
    consumes it (hops ``stage`` .. ``to_stage - 1``; default the last stage; ``to_stage:
    stages`` carries it over the return hop to S0) - e.g. an EAGLE-3 drafter's auxiliary
    hidden states taken at a few stages, or the last stage's hidden state for a drafter at S0
    (:func:`wansim.links.wire_bytes.forward_bytes`)."""

    stage: int = spec(0, ge=0)
    values_per_token: int = spec(7168, ge=1)
    bits: int = spec(16, choices=ACTIVATION_BITS)
    to_stage: int | None = spec(None, ge=1)


@dataclasses.dataclass(frozen=True)
class Payload:
    """Bytes on the wire: activations of hidden_size*activation_bits/8 per token (plus one fp16
    scale per ``quant_group_size`` values below 16 bits; 32 = fp32), a header per message, the
    ``extra_tensors`` that ride some hops, and a return message of ``return_bytes`` plus
    ``return_token_bytes`` per token id it lists (:func:`wansim.links.wire_bytes.verdict_bytes`)."""

    activation_bits: int = spec(16, choices=ACTIVATION_BITS)
    header_bytes: int = spec(64, ge=0)
    return_bytes: int = spec(50, ge=1)
    return_token_bytes: int = spec(
        0, ge=0, doc="per token id in the verdict (verified positions, next chain drafts)"
    )
    extra_tensors: tuple[ExtraTensor, ...] = spec((), max_items=MAX_STAGES)
    cancel_bytes: int = spec(
        24, ge=1, doc="async: a cancellation message (request id, epoch, position)"
    )
    quant_group_size: int = spec(128, ge=1)


# ----------------------------------------------------------------------------- drafter
@dataclasses.dataclass(frozen=True)
class AcceptanceSpec:
    """Where acceptance comes from: exactly one of ``profile`` (+ ``workload``), ``alpha``
    (constant conditional rate; ``alpha: 0.8`` when none is given) or ``per_position`` (p_1..p_K). ``domain_shift`` in (0, 1]
    multiplies every conditional rate (Part IX: out of domain, fine-tuned targets).
    ``dispersion`` is the between-prompt share of the per-step accepted-length variance
    (default: the profile's; 0 for alpha/per_position). ``extrapolate`` allows K beyond the
    measured positions by holding the last measured rate (an assumption, off by default).
    ``sibling_logit_offsets`` (trees): rank-r candidates are accepted at
    sigmoid(logit p_d - offset_r) for r = 2, 3, ... (overrides the profile's; see
    :mod:`wansim.acceptance.trees`). alpha/per_position rates are the rates of the scenario's
    ``speculation.verifier`` rule; a profile converts them (its ``verifier_logit_shift``).
    ``activation_quality``: a table file of what each activation bit width costs (acceptance
    factor, exactness; :mod:`wansim.acceptance.activation_quality`), replacing the profile's."""

    profile: str | None = spec(None)
    workload: str | None = spec(None)
    alpha: float | None = spec(None, gt=0, lt=1)
    per_position: tuple[float, ...] | None = spec(None, ge=0, le=1, max_items=4096)
    domain_shift: float = spec(1.0, gt=0, le=1)
    dispersion: float | None = spec(None, ge=0, lt=1)
    extrapolate: bool = spec(False)
    sibling_logit_offsets: tuple[float, ...] | None = spec(None, max_items=4096)
    activation_quality: str | None = spec(None)

    def check(self, path: str) -> None:
        if self.sibling_logit_offsets is not None and not self.sibling_logit_offsets:
            raise ScenarioError(
                f"{path}.sibling_logit_offsets", "needs at least one rank (rank 2 first)", []
            )
        given = [n for n in ("profile", "alpha", "per_position") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ScenarioError(path, "give only one of profile, alpha, per_position", given)
        if self.per_position is not None and len(self.per_position) == 0:
            raise ScenarioError(f"{path}.per_position", "needs at least one rate", [])
        if self.workload is not None and self.profile is None:
            raise ScenarioError(f"{path}.workload", "needs a profile", self.workload)

    DEFAULT_ALPHA = 0.8

    @property
    def source(self) -> str:
        if self.profile is not None:
            return "profile"
        if self.per_position is not None:
            return "per_position"
        return "alpha"


@dataclasses.dataclass(frozen=True)
class Drafter:
    """One drafter pass costs ``draft_ms``; ``parallel`` (block) drafters draft K tokens in one
    pass, autoregressive ones pay K passes. A tree's candidates beyond one per depth cost
    ``width_ms`` each (``compute.drafter_tree_ms``); a pass drafting for several sequences (a
    batch) costs ``sequence_ms`` more per sequence beyond the first (on the stage it drafts
    on; an overlapped drafter's own device drafts at ``draft_ms`` a pass). ``preset`` names a catalog entry
    (``wansim drafters``) whose values fill the fields this mapping omits (at load time).

    ``overlap: true`` puts the drafter on its own device (another GPU or node beside its
    stage): drafting no longer occupies the stage, and the drafter drafts the next block from
    its own drafts while the current block is verified, betting that the block is accepted
    whole. A won bet makes a step cost max(draft, lap) instead of draft + lap; a lost one
    finishes the draft in progress and redrafts from the correction (max(lap, draft) + draft). Chains only; nothing to overlap with policy
    none."""

    kind: str = spec("dspark", choices=DRAFTER_KINDS)
    placement: str = spec("last_stage", choices=PLACEMENTS)
    parallel: bool = spec(True)
    draft_ms: float = spec(4.0, ge=0)
    width_ms: float = spec(0.05, ge=0, doc="per extra tree candidate beyond one per depth")
    sequence_ms: float = spec(
        0.0, ge=0, doc="per drafter pass, each sequence beyond the first of a batched pass"
    )
    acceptance: AcceptanceSpec = spec(factory=AcceptanceSpec)
    preset: str | None = spec(None)
    overlap: bool = spec(
        False,
        doc="the drafter has its own device beside its stage and drafts the next block while"
        " the current one is verified (the max(.) law; :mod:`wansim.sim.async_speculation`)",
    )


# ----------------------------------------------------------------------------- speculation
@dataclasses.dataclass(frozen=True)
class Tree:
    """sequoia/dynamic: ``budget_nodes`` draft nodes (root excluded), depth at most
    ``max_depth`` (default: the positions the acceptance covers); static: ``branching`` gives
    the children of every node at each depth and fixes the node count."""

    kind: str = spec("sequoia", choices=TREE_KINDS)
    budget_nodes: int = spec(32, ge=1, le=4096, doc="draft nodes, the root excluded")
    branching: tuple[int, ...] = spec(
        (), ge=1, le=4096, max_items=4096, doc="static trees: children per node per depth"
    )
    max_depth: int | None = spec(None, ge=1, le=4096)

    def check(self, path: str) -> None:
        if self.kind == "static" and not self.branching:
            raise ScenarioError(
                f"{path}.branching", "a static tree needs children per depth, e.g. [4, 2, 1]", []
            )
        if self.kind != "static" and self.branching:
            raise ScenarioError(
                f"{path}.branching",
                f"is for static trees (kind is {self.kind})",
                list(self.branching),
            )
        if (
            self.kind == "static"
            and self.max_depth is not None
            and len(self.branching) > self.max_depth
        ):
            raise ScenarioError(
                f"{path}.branching",
                f"is {len(self.branching)} deep, more than max_depth {self.max_depth}",
                list(self.branching),
            )


@dataclasses.dataclass(frozen=True)
class Speculation:
    policy: str = spec("chain", choices=POLICIES)
    k: int = spec(7, ge=1, le=64)
    verifier: str = spec("lossless", choices=VERIFIERS)
    tree: Tree = spec(factory=Tree)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """``sync``: one block in flight per request (the next is drafted from the verdict).
    ``async`` (in-pipe speculation): S0 launches up to ``max_inflight_blocks`` blocks of a
    request before their verdicts return, each drafted from the drafts before it; needs the
    drafter on S0 (``drafter.placement: first_stage``) and a chain (:mod:`wansim.sim.async_speculation`
    has the protocol). ``async_protocol``: ``cancel_on_divergence`` (a verified block commits
    its accepted drafts and the bonus or correction token; a lost bet cancels the blocks behind
    it, with cancellation messages) or ``flush_on_full_acceptance`` (a block's K drafts count
    only when all are accepted, without a bonus token; else the block commits only the
    target's token at the divergence; stale blocks are computed by every stage they reach and
    dropped at the last, no cancellation travels). ``hybrid_confident_fraction`` p: the
    per-round hybrid (:mod:`wansim.speculation.hybrid_rounds`): each round is pipelined chain blocks
    with probability p, else one synchronous round of the tree ``speculation.tree``; ``profile``
    takes p from the acceptance profile's selected workload row.

    ``batching: continuous`` shares passes between the requests in flight: by default one batch
    circulates; ``micro_batches: N`` keeps N batches in flight at once, each of at most
    ``max_batch_size`` sequences, with prefill split into chunks of at most
    ``prefill_chunk_tokens`` per pass (:mod:`wansim.serving.micro_batching`)."""

    kind: str = spec("sync", choices=SCHEDULES)
    max_inflight_blocks: int = spec(1, ge=1)
    hedge_branches: int = spec(0, ge=0)
    batching: str = spec("none", choices=BATCHING)
    async_protocol: str = spec(CANCEL_ON_DIVERGENCE, choices=ASYNC_PROTOCOLS)
    micro_batches: int | None = spec(
        None, ge=1, le=4096, doc="batches in flight at once (continuous batching); null: one"
    )
    max_batch_size: int | None = spec(
        None, ge=1, le=65_536, doc="sequences per micro-batch at most; null: no cap"
    )
    prefill_chunk_tokens: int | None = spec(
        None, ge=1, le=10_000_000, doc="prompt tokens a pass carries at most; null: whole"
    )
    hybrid_confident_fraction: float | str | None = spec(
        None,
        ge=0,
        le=1,
        choices=("profile",),
        doc="async only: share of rounds the drafter is confident (pipelined chain blocks);"
        " the others are one synchronous round of speculation.tree"
        " (:mod:`wansim.speculation.hybrid_rounds`); profile: the selected acceptance-profile"
        " workload's hybrid_confident_fraction; null: every round async",
    )


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


# ----------------------------------------------------------------------------- faults
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


# ----------------------------------------------------------------------------- scenario
@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str = spec("scenario")
    seed: int = spec(0, ge=0, le=2**63 - 1)
    stages: int = spec(10, ge=1, le=MAX_STAGES)
    model: Model = spec(factory=Model)
    network: Network = spec(factory=Network)
    payload: Payload = spec(factory=Payload)
    drafter: Drafter = spec(factory=Drafter)
    speculation: Speculation = spec(factory=Speculation)
    schedule: Schedule = spec(factory=Schedule)
    workload: Workload = spec(factory=Workload)
    faults: Faults = spec(factory=Faults)

    def check(self, path: str) -> None:
        self._check_schedule()
        for i, event in enumerate(self.faults.events):
            for name in ("stage", "link"):
                index = getattr(event, name)
                if index is not None and index >= self.stages:
                    raise ScenarioError(
                        f"faults.events[{i}].{name}",
                        f"must be < stages ({self.stages}; {name}s are numbered from 0)",
                        index,
                    )
        m = self.model
        for path, entries, what in (
            ("network.hops", self.network.hops, "one per stage; the last is the return hop"),
            ("model.stage_compute", m.stage_compute, "one compute model per stage"),
            ("model.stage_idle_cost", m.stage_idle_cost, "one per stage; or use model.idle_cost"),
            (
                "model.stage_overhead_ms",
                m.stage_overhead_ms,
                "one per stage; or use model.overhead_ms",
            ),
            (
                "model.stage_sequence_ms",
                m.stage_sequence_ms,
                "one per stage; or use model.sequence_ms",
            ),
        ):
            if entries and len(entries) != self.stages:
                raise ScenarioError(
                    path, f"needs {self.stages} entries ({what})", f"{len(entries)} entries"
                )
        for i, extra in enumerate(self.payload.extra_tensors):
            to_stage = self.stages - 1 if extra.to_stage is None else extra.to_stage
            if not extra.stage < to_stage <= self.stages:
                raise ScenarioError(
                    f"payload.extra_tensors[{i}].to_stage"
                    if extra.to_stage is not None
                    else f"payload.extra_tensors[{i}].stage",
                    f"needs stage < to_stage <= stages ({self.stages}; to_stage defaults to the"
                    f" last stage, {self.stages} is S0 over the return hop), stage is"
                    f" {extra.stage}",
                    to_stage if extra.to_stage is not None else extra.stage,
                )
        for name in ("noise", "straggler"):
            for j, s in enumerate(getattr(self.model, name).stages):
                if s >= self.stages:
                    raise ScenarioError(
                        f"model.{name}.stages[{j}]", f"must name a stage < {self.stages}", s
                    )

    def _check_schedule(self) -> None:
        """Async in-pipe speculation bets on drafts S0 drafted itself (module Schedule)."""
        sched = self.schedule
        if sched.kind == "sync" and sched.max_inflight_blocks != 1:
            raise ScenarioError(
                "schedule.max_inflight_blocks",
                "the sync schedule keeps one block in flight per request (use kind: async)",
                sched.max_inflight_blocks,
            )
        if sched.async_protocol != CANCEL_ON_DIVERGENCE and sched.kind != "async":
            raise ScenarioError(
                "schedule.async_protocol",
                f"is the async schedule's protocol (schedule.kind is {sched.kind}; use async)",
                sched.async_protocol,
            )
        self._check_micro_batches()
        self._check_hybrid()
        if sched.kind != "async":
            return
        if sched.async_protocol == FLUSH_ON_FULL_ACCEPTANCE and self.k < 2:
            raise ScenarioError(
                "speculation.k",
                "flush_on_full_acceptance commits K drafts or one token: it needs K >= 2",
                self.speculation.k,
            )
        if self.drafter.placement != "first_stage":
            raise ScenarioError(
                "drafter.placement",
                "async needs the drafter on S0 (first_stage) to draft the next block from its own"
                " drafts before the verdict returns; a last_stage drafter drafts only after a"
                " verification",
                self.drafter.placement,
            )
        if self.speculation.policy == "none":
            raise ScenarioError(
                "speculation.policy",
                "async launches draft blocks ahead of their verdicts: it needs speculation"
                " (policy chain)",
                "none",
            )
        if self.drafter.kind in HIDDEN_STATE_DRAFTERS:
            raise ScenarioError(
                "drafter.kind",
                "reads the last stage's hidden state, which S0 does not have for drafts still in"
                " flight: async at first_stage needs a drafter of token ids (draft_model | ngram)",
                self.drafter.kind,
            )

    def _check_hybrid(self) -> None:
        """The per-round hybrid mixes async chain rounds with sync tree rounds
        (:mod:`wansim.speculation.hybrid_rounds`): it needs the async schedule with a chain, one
        request's blocks per message (no continuous batching) and S0 drafting."""
        sched = self.schedule
        p = sched.hybrid_confident_fraction
        if p is None:
            return
        field = "schedule.hybrid_confident_fraction"
        if sched.kind != "async":
            raise ScenarioError(
                field,
                f"mixes async chain rounds with tree rounds: needs schedule.kind: async"
                f" (is {sched.kind})",
                p,
            )
        if self.speculation.policy != "chain":
            raise ScenarioError(
                "speculation.policy",
                "the hybrid's confident rounds are chains (its other rounds verify"
                " speculation.tree): needs policy chain",
                self.speculation.policy,
            )
        if sched.batching != "none":
            raise ScenarioError(
                "schedule.batching",
                "the hybrid's rounds are per request: needs batching: none",
                sched.batching,
            )
        if self.drafter.overlap:
            raise ScenarioError(
                "drafter.overlap",
                "the hybrid drafts on S0 between its rounds (an overlapped drafter is not"
                " modelled with it): needs overlap: false",
                True,
            )
        if sched.hedge_branches:
            raise ScenarioError(
                "schedule.hedge_branches",
                "hedge branches are a sync chain's; the hybrid's rounds are async chains or"
                " trees: needs 0",
                sched.hedge_branches,
            )

    def _check_micro_batches(self) -> None:
        """Micro-batches are a form of continuous batching in the sync schedule
        (:mod:`wansim.serving.micro_batching`); their two knobs need them."""
        sched = self.schedule
        if sched.micro_batches is None:
            for name in ("max_batch_size", "prefill_chunk_tokens"):
                if getattr(sched, name) is not None:
                    raise ScenarioError(
                        f"schedule.{name}",
                        "applies to micro-batches: set schedule.micro_batches too",
                        getattr(sched, name),
                    )
            return
        if sched.batching != "continuous":
            raise ScenarioError(
                "schedule.micro_batches",
                "are batches of continuous batching: needs schedule.batching: continuous",
                sched.micro_batches,
            )
        if sched.kind == "async" or (self.drafter.overlap and self.speculation.policy != "none"):
            raise ScenarioError(
                "schedule.micro_batches",
                "run the sync schedule (async and an overlapped drafter keep several blocks of"
                " one sequence in flight, so it cannot belong to one micro-batch: README,"
                " 'Scheduling levers'; use batching: continuous without micro_batches): needs"
                " schedule.kind: sync and drafter.overlap: false",
                sched.micro_batches,
            )

    @property
    def k(self) -> int:
        """Draft tokens per verify pass (0 without speculation)."""
        return 0 if self.speculation.policy == "none" else self.speculation.k

    def stage_compute_models(self) -> tuple[ComputeModel, ...]:
        """Stage i's compute model: ``model.stage_compute[i]`` where given, else
        ``model.compute`` (scalar ``stages``)."""
        return self.model.stage_compute or (self.model.compute,) * int(self.stages)

    def resolved_hops(self) -> tuple[Hop, ...]:
        """The P hops of the ring: hop i is S_i -> S_(i+1); hop P-1 is the return hop to S0."""
        net = self.network
        out = []
        for i in range(self.stages):
            o = net.hops[i] if net.hops else HopOverride()
            out.append(
                Hop(
                    latency_ms=net.latency_ms if o.latency_ms is None else o.latency_ms,
                    bandwidth_mbps=net.bandwidth_mbps
                    if o.bandwidth_mbps is None
                    else o.bandwidth_mbps,
                    jitter=net.jitter if o.jitter is None else o.jitter,
                    loss_rate=net.loss_rate if o.loss_rate is None else o.loss_rate,
                    retransmit_ms=net.retransmit_ms,
                    per_message_ms=net.per_message_ms
                    if o.per_message_ms is None
                    else o.per_message_ms,
                    codec_ms_per_mb=net.codec_ms_per_mb
                    if o.codec_ms_per_mb is None
                    else o.codec_ms_per_mb,
                )
            )
        return tuple(out)


def hop_name(i: int, stages: int) -> str:
    if i == stages - 1:
        return f"S{stages - 1}->S0 (return)"
    return f"S{i}->S{i + 1}"


# ----------------------------------------------------------------------------- loading
# Mappings that describe a scenario at a higher level, keyed by the top-level field that marks
# them (``nodes``: a deployment, resolved by wansim.deploy into a plain scenario mapping).
# The layers above register here (wansim/__init__.py), so this module imports none of them.
RAW_RESOLVERS: dict[str, Callable[[dict, Path], dict]] = {}


def register_raw_resolver(key: str, resolve: Callable[[dict, Path], dict]) -> None:
    """``resolve(raw, base_dir) -> scenario mapping`` for raw mappings that contain ``key``."""
    RAW_RESOLVERS[key] = resolve


def load_scenario(
    path: str | os.PathLike | None = None,
    overrides: Iterable[str] | Mapping[str, Any] | None = None,
    *,
    data: Mapping[str, Any] | None = None,
    base_dir: str | os.PathLike | None = None,
) -> Scenario:
    """Load, override and validate a scenario (from a YAML file or an already-parsed mapping).

    ``overrides``: ``["a.b=v", ...]`` (values parsed as YAML scalars) or ``{"a.b": v}``.
    Relative file paths inside the scenario resolve against the scenario's folder (``base_dir``
    for ``data``; default the working directory), then the working directory, then the
    scenario folder's parents.
    """
    base_dir = Path.cwd() if base_dir is None else Path(base_dir).resolve()
    if data is None:
        if path is None:
            raise ScenarioError("scenario", "give a path or data", None)
        raw = read_scenario_raw(path)
        base_dir = on_disk_or_shipped(path).resolve().parent
    else:
        raw = to_plain(data)
    if not isinstance(raw, Mapping):
        raise ScenarioError("scenario", "must be a mapping", raw)
    raw = apply_overrides(raw, overrides or (), in_place=data is not None)  # to_plain(data) copied
    for key, resolve in RAW_RESOLVERS.items():  # e.g. a deployment (``nodes``): wansim.deploy
        if key in raw:
            raw = resolve(raw, base_dir)
    raw = _apply_drafter_preset(raw)
    raw = _apply_compute_bundle(raw, base_dir)
    scenario = parse(Scenario, raw, "")
    scenario = _resolve_files(scenario, base_dir)
    _check_acceptance(scenario)
    if scenario.schedule.hybrid_confident_fraction is not None:  # its tree rounds' depth
        from wansim.speculation.hybrid_rounds import confident_fraction

        confident_fraction(scenario)  # ``profile`` resolves (else one line, exit 2)
        tree = dataclasses.replace(scenario.speculation, policy="tree")
        _check_acceptance(dataclasses.replace(scenario, speculation=tree))
    return scenario


def read_scenario_raw(path: str | os.PathLike, _seen: tuple = ()) -> dict:
    """The raw mapping of a scenario file, with ``extends: other.yaml`` merged in.

    ``extends`` names a scenario (relative to the file that says it) whose mapping this one
    deep-merges over: a family of scenarios states only what differs from its base. Relative
    file paths inside a file (acceptance profile, jitter samples) resolve against that file's
    own folder, whichever file extends it. An acceptance source (``profile``, ``alpha`` or
    ``per_position``) given by the extending file replaces the inherited one (see
    :func:`merge_acceptance`). An empty file is an error (``{}`` means "all defaults").
    """
    resolved = on_disk_or_shipped(path).resolve()
    if resolved in _seen:
        raise ScenarioError("extends", "cycle of scenarios extending each other", str(path))
    raw = read_yaml_mapping(path, "scenario")
    if raw is None:
        raise WansimInputError(
            "scenario", "the file is empty (write {} to run on the defaults)", str(path)
        )
    raw = _anchor_files(raw, resolved.parent)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ScenarioError("extends", "must be a path to a scenario file", parent)
    parent_path = resolve_file(parent, resolved.parent, search_cwd=False)
    if parent_path is None:
        raise ScenarioError("extends", f"file not found (relative to {resolved.parent})", parent)
    return merge_scenarios(read_scenario_raw(parent_path, (*_seen, resolved)), raw)


ACCEPTANCE_SOURCES = ("profile", "alpha", "per_position")


def merge_scenarios(base: Mapping, top: Mapping) -> dict:
    """``top`` deep-merged over ``base``, with the acceptance rule of :func:`merge_acceptance`."""
    merged = deep_merge(base, top)
    top_acc = _get(top, "drafter", "acceptance")
    base_acc = _get(base, "drafter", "acceptance")
    if isinstance(top_acc, Mapping) and isinstance(base_acc, Mapping):
        merged["drafter"]["acceptance"] = merge_acceptance(base_acc, top_acc)
    return merged


def merge_acceptance(base: Mapping, top: Mapping) -> dict:
    """An acceptance mapping over an inherited one. When ``top`` names a source (``profile``,
    ``alpha`` or ``per_position``), it replaces the inherited source: the other sources are
    dropped, and so is the profile's ``workload`` unless the new source is a profile. Other
    keys (domain_shift, dispersion, extrapolate, ...) merge as usual."""
    new = [k for k in ACCEPTANCE_SOURCES if top.get(k) is not None]
    if new:
        drop = set(ACCEPTANCE_SOURCES) - set(new)
        if "profile" not in new:
            drop.add("workload")
        base = {k: v for k, v in base.items() if k not in drop}
    return deep_merge(base, top)


def _get(raw: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(raw, Mapping):
            return None
        raw = raw.get(key)
    return raw


# file-valued fields: (path to the mapping, key)
_FILE_FIELDS = (
    (("drafter", "acceptance"), "profile"),
    (("workload",), "trace"),
    (("drafter", "acceptance"), "activation_quality"),
    (("network", "jitter"), "samples_file"),
    (("network",), "trace_file"),
)


def _anchor_files(raw: dict, folder: Path) -> dict:
    """Relative file fields that exist next to the file that names them -> absolute paths (so
    a scenario extending this one from elsewhere still finds them)."""

    def anchor(mapping: Any, key: str) -> None:
        value = mapping.get(key) if isinstance(mapping, dict) else None
        if isinstance(value, str) and value and not Path(value).is_absolute():
            candidate = folder / value
            if candidate.is_file():
                mapping[key] = str(candidate.resolve())

    for where, key in _FILE_FIELDS:
        anchor(_get(raw, *where), key)
    hops = _get(raw, "network", "hops")
    if isinstance(hops, list):
        for hop in hops:
            anchor(_get(hop, "jitter"), "samples_file")
    return raw


def deep_merge(base: Mapping, top: Mapping) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml_mapping(path: str | os.PathLike, what: str) -> dict | None:
    """The file's YAML mapping, read within the limits of :mod:`wansim.config.user_yaml` (UTF-8,
    depth, alias expansion); None for an empty file (each caller decides what that means).
    A missing relative path that names a shipped file (``scenarios/...``) reads that file."""
    p = on_disk_or_shipped(path)
    if not p.is_file():
        raise WansimInputError(what, "file not found", str(path))
    raw = read_yaml_file(p, what)
    if raw is not None and not isinstance(raw, dict):
        raise WansimInputError(what, "must be a YAML mapping", str(path))
    return raw


MAX_NESTING = 32  # levels of mappings/lists in a scenario (the schema needs 5)
_LEAVES = frozenset({str, int, float, bool, type(None)})  # neither containers nor dataclasses


def to_plain(obj: Any) -> Any:
    """Dataclasses/tuples -> plain dicts/lists (the YAML shape). Raises a one-line error for
    data nested more than :data:`MAX_NESTING` deep (or containing itself)."""
    trail: list[str | int] = []  # the path to the current value (joined only for the error)

    def plain(obj: Any) -> Any:
        if type(obj) in _LEAVES:  # the common case, without the checks below
            return obj
        if len(trail) > MAX_NESTING:
            raise ScenarioError(
                join_path(trail[:4]) + "...",
                f"nested more than {MAX_NESTING} deep (or contains itself)",
            )
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        if isinstance(obj, Mapping):
            out = {}
            for k, v in obj.items():
                trail.append(str(k))
                out[k] = plain(v)
                trail.pop()
            return out
        if isinstance(obj, (list, tuple)):
            out_list = []
            for i, v in enumerate(obj):
                trail.append(i)
                out_list.append(plain(v))
                trail.pop()
            return out_list
        return obj

    return plain(obj)


def scenario_to_dict(scenario: Scenario) -> dict:
    return to_plain(scenario)


_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def split_path(dotted: str) -> list[str | int]:
    """'network.hops[3].latency_ms' -> ['network', 'hops', 3, 'latency_ms'] (also hops.3)."""
    parts: list[str | int] = []
    for seg in dotted.split("."):
        if seg.isdigit():
            parts.append(int(seg))
            continue
        m = _SEGMENT.match(seg)
        if not m:
            raise ScenarioError("--set", "bad field path", dotted)
        parts.append(m.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    return parts


def join_path(parts: list[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ScenarioError("--set", "expected field.path=value", text)
    key, _, value = text.partition("=")
    key = key.strip()
    if not value.strip():
        return key, ""
    try:
        return key, load_yaml_text(value, key)
    except WansimInputError as err:
        raise ScenarioError(key, f"value: {err.problem}", value) from None


def apply_overrides(
    raw: dict, overrides: Iterable[str] | Mapping[str, Any], *, in_place: bool = False
) -> dict:
    """Set dotted fields in a copy of the raw mapping (before validation), with the precedence
    rules of per-stage lists (README, "Overrides, sweeps and per-stage lists"):

    - ``network.hops[i].f`` / ``model.stage_compute[i].f`` on an empty list first materialises
      one entry per stage (hops inheriting every global field; stage compute copying
      ``model.compute``), then sets entry i;
    - ``stages`` is applied first; a new ``stages`` resizes a per-stage list whose entries are all alike (a list whose
      entries differ must be given for the new count, e.g. zipped with ``stages``);
    - setting an acceptance source (``drafter.acceptance.profile|alpha|per_position``)
      replaces the current one (:func:`merge_acceptance`);
    - changing a global field that every entry of the existing ``network.hops`` overrides
      (``network.latency_ms``, ``bandwidth_mbps``, ``jitter``, ``loss_rate``), or
      ``model.compute`` when ``model.stage_compute`` is given, is an error: it would have no
      effect (unless the same overrides also give the list).

    ``in_place=True``: set them in ``raw`` itself (a plain mapping the caller owns).
    """
    if not in_place:
        raw = to_plain(raw)
    items = list(
        overrides.items() if isinstance(overrides, Mapping) else map(parse_override, overrides)
    )
    items.sort(key=lambda kv: kv[0].strip() != "stages")  # stages first: lists follow it
    _check_shadowed(raw, items)
    for key, value in items:
        parts = split_path(key)
        _materialise_per_stage(raw, parts)
        if (
            parts[:2] == ["drafter", "acceptance"]
            and len(parts) == 3
            and parts[2] in ACCEPTANCE_SOURCES
            and value is not None
            and isinstance(_get(raw, "drafter", "acceptance"), dict)
        ):
            acc = merge_acceptance(raw["drafter"]["acceptance"], {parts[2]: value})
            raw["drafter"]["acceptance"] = acc
        set_dotted(raw, key, value)
        if parts == ["stages"]:
            _resize_per_stage(raw)
    return raw


# the per-stage lists: (path, what an entry inheriting everything looks like)
_PER_STAGE = (
    (("network", "hops"), lambda raw: {}),
    (
        ("model", "stage_compute"),
        lambda raw: {"kind": "linear", **(copy.deepcopy(_get(raw, "model", "compute")) or {})},
    ),
)
PER_STAGE_PATHS = ("network.hops", "model.stage_compute")
HOP_GLOBALS = ("latency_ms", "bandwidth_mbps", "jitter", "loss_rate")


def has_per_stage_lists(raw: Mapping) -> bool:
    """Whether ``network.hops`` or ``model.stage_compute`` lists per-stage entries (then
    ``stages`` cannot vary as an array: each stage count is its own scenario)."""
    return any(bool(_get(raw, *where)) for where, _ in _PER_STAGE)


def _stage_count(raw: dict) -> int | None:
    stages = raw.get("stages", Scenario.stages)
    if isinstance(stages, int) and not isinstance(stages, bool) and 1 <= stages <= 1024:
        return stages
    return None


def _materialise_per_stage(raw: dict, parts: list[str | int]) -> None:
    for where, entry in _PER_STAGE:
        if tuple(parts[:2]) != where or len(parts) < 3 or not isinstance(parts[2], int):
            continue
        current = _get(raw, *where)
        count = _stage_count(raw)
        if (current is None or current == []) and count is not None:
            raw.setdefault(where[0], {})
            if isinstance(raw[where[0]], dict):
                raw[where[0]][where[1]] = [entry(raw) for _ in range(count)]


def _resize_per_stage(raw: dict) -> None:
    count = _stage_count(raw)
    for where, _ in _PER_STAGE:
        current = _get(raw, *where)
        if count is None or not isinstance(current, list) or len(current) in (0, count):
            continue
        if all(e == current[0] for e in current):
            raw[where[0]][where[1]] = [copy.deepcopy(current[0]) for _ in range(count)]


def _check_shadowed(raw: dict, items: list[tuple[str, Any]]) -> None:
    keys = [split_path(k) for k, _ in items]

    def gives(*where: str) -> bool:  # the overrides set the list itself (or its parent)
        return any(k[: len(where)] == list(where) or k == list(where[:-1]) for k in keys)

    hops = _get(raw, "network", "hops")
    stage_compute = _get(raw, "model", "stage_compute")
    for (key, value), parts in zip(items, keys, strict=True):
        if (
            len(parts) >= 2
            and parts[0] == "network"
            and parts[1] in HOP_GLOBALS
            and isinstance(hops, list)
            and hops
            and all(isinstance(h, Mapping) and h.get(parts[1]) is not None for h in hops)
            and not gives("network", "hops")
        ):
            raise ScenarioError(
                key,
                f"has no effect: every entry of network.hops sets its own {parts[1]} (change"
                f" network.hops[i].{parts[1]}, or remove {parts[1]} from the hops)",
                value,
            )
        if (
            parts[:2] == ["model", "compute"]
            and isinstance(stage_compute, list)
            and stage_compute
            and not gives("model", "stage_compute")
        ):
            raise ScenarioError(
                key,
                "has no effect: model.stage_compute gives every stage its own compute model"
                " (change model.stage_compute[i], or remove model.stage_compute)",
                value,
            )


def set_dotted(raw: dict, dotted: str, value: Any) -> None:
    parts = split_path(dotted)
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                have = len(node) if isinstance(node, list) else 0
                raise ScenarioError(
                    join_path(parts[: i + 1]), f"no such entry (the list has {have})", value
                )
            if node[part] is None:
                node[part] = {}
            node = node[part]
        else:
            if not isinstance(node, dict):
                raise ScenarioError(join_path(parts[:i]), "is not a mapping", node)
            if node.get(part) is None:
                node[part] = [] if isinstance(nxt, int) else {}
            node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            have = len(node) if isinstance(node, list) else 0
            raise ScenarioError(join_path(parts), f"no such entry (the list has {have})", value)
        node[last] = value
    else:
        if not isinstance(node, dict):
            raise ScenarioError(join_path(parts[:-1]), "is not a mapping", node)
        node[last] = value


def get_dotted(obj: Any, dotted: str) -> Any:
    """Read a dotted field from a scenario (dataclasses) or a raw mapping."""
    node = obj
    for part in split_path(dotted):
        if isinstance(part, int) or isinstance(node, Mapping):
            node = node[part]
        else:
            node = getattr(node, part)
    return node


def resolve_file(value: str, base_dir: Path, *, search_cwd: bool = True) -> Path | None:
    p = Path(value)
    if p.is_absolute():
        return p if p.exists() else None
    candidates = [base_dir / p] + ([Path.cwd() / p] if search_cwd else [])
    candidates += [d / p for d in base_dir.parents]
    for c in candidates:
        if c.exists():
            return c.resolve()
    return shipped(p)  # a shipped name (traces/reference/..., scenarios/...) from anywhere


def _resolve_files(scenario: Scenario, base_dir: Path) -> Scenario:
    acc = scenario.drafter.acceptance
    if acc.profile is not None:
        found = resolve_file(acc.profile, base_dir)
        if found is None:
            raise ScenarioError("drafter.acceptance.profile", "file not found", acc.profile)
        acc = dataclasses.replace(acc, profile=str(found))
    if acc.activation_quality is not None:
        found = resolve_file(acc.activation_quality, base_dir)
        if found is None:
            raise ScenarioError(
                "drafter.acceptance.activation_quality", "file not found", acc.activation_quality
            )
        from wansim.acceptance.activation_quality import load_table

        load_table(found)  # checked now, one line, not mid-run
        acc = dataclasses.replace(acc, activation_quality=str(found))
    if acc is not scenario.drafter.acceptance:
        scenario = dataclasses.replace(
            scenario, drafter=dataclasses.replace(scenario.drafter, acceptance=acc)
        )

    def fix_jitter(j: Jitter | None, where: str) -> Jitter | None:
        if j is None or j.samples_file is None:
            return j
        found = resolve_file(j.samples_file, base_dir)
        if found is None:
            raise ScenarioError(f"{where}.samples_file", "file not found", j.samples_file)
        from wansim.links.expected_delay import read_samples

        read_samples(found, f"{where}.samples_file")  # its values are checked now, not mid-run
        return dataclasses.replace(j, samples_file=str(found))

    wl = scenario.workload
    if wl.trace is not None:
        found = resolve_file(wl.trace, base_dir)
        if found is None:
            raise ScenarioError("workload.trace", "file not found", wl.trace)

        wl = dataclasses.replace(wl, trace=str(found))
        scenario = dataclasses.replace(scenario, workload=wl)
    if wl.trace is not None or wl.arrival == "trace" or wl.lengths.kind in ("trace", "empirical"):
        from wansim.serving.workload import (
            check_workload,
        )  # (numpy: only for a workload that needs it)

        check_workload(wl)
    net = scenario.network
    hops = tuple(
        dataclasses.replace(h, jitter=fix_jitter(h.jitter, f"network.hops[{i}].jitter"))
        for i, h in enumerate(net.hops)
    )
    net = dataclasses.replace(net, jitter=fix_jitter(net.jitter, "network.jitter"), hops=hops)
    if net.trace_file is not None:
        found = resolve_file(net.trace_file, base_dir)
        if found is None:
            raise ScenarioError("network.trace_file", "file not found", net.trace_file)
        from wansim.links.nonstationary import read_trace

        read_trace(str(found))  # its samples are checked now, not mid-run
        net = dataclasses.replace(net, trace_file=str(found))
    return dataclasses.replace(scenario, network=net)


def _check_acceptance(scenario: Scenario) -> None:
    """Profile workload exists, and the profile/per-position vector covers K."""
    from wansim.acceptance.profile import load_profile

    acc = scenario.drafter.acceptance
    need = scenario.k
    field = "speculation.k"
    if scenario.speculation.policy == "tree":
        need = _tree_depth_needed(scenario)
        tree = scenario.speculation.tree
        field = "speculation.tree." + ("branching" if tree.kind == "static" else "max_depth")
    if acc.profile is not None:
        prof = load_profile(acc.profile)
        workload = acc.workload or prof.default_workload
        if workload not in prof.workloads:
            raise ScenarioError(
                "drafter.acceptance.workload",
                f"not in profile (has {', '.join(prof.workloads)})",
                workload,
            )
        for i, row in enumerate(scenario.workload.mix):
            if row.workload not in prof.workloads:
                raise ScenarioError(
                    f"workload.mix[{i}].workload",
                    f"not in profile (has {', '.join(prof.workloads)})",
                    row.workload,
                )
        measured = len(prof.workloads[workload].per_position)
        if need > measured and not acc.extrapolate:
            raise ScenarioError(
                field,
                f"profile measured positions 1..{measured} (set drafter.acceptance.extrapolate"
                " to hold the last rate)",
                need,
            )
    if scenario.workload.mix and acc.profile is None:
        raise ScenarioError(
            "workload.mix", "names profile workload rows: it needs drafter.acceptance.profile", None
        )
    if acc.per_position is not None:
        measured = len(acc.per_position)
        if need > measured and not acc.extrapolate:
            raise ScenarioError(
                field,
                f"per_position gives positions 1..{measured} (set drafter.acceptance.extrapolate"
                " to hold the last rate)",
                need,
            )


def acceptance_depth(scenario: Scenario) -> tuple[int, int | None]:
    """(positions the speculation needs: K, or the tree's depth; positions the acceptance
    measured: the profile workload's or per_position's length, None for a constant alpha).
    needed > measured means the rates beyond are extrapolated (the last one held)."""
    from wansim.acceptance.profile import load_profile

    acc = scenario.drafter.acceptance
    need = scenario.k
    if scenario.speculation.policy == "tree":
        need = _tree_depth_needed(scenario)
    if acc.profile is not None:
        prof = load_profile(acc.profile)
        workload = acc.workload or prof.default_workload
        return need, len(prof.workloads[workload].per_position)
    if acc.per_position is not None:
        return need, len(acc.per_position)
    return need, None


def _tree_depth_needed(scenario: Scenario) -> int:
    tree = scenario.speculation.tree
    if tree.kind == "static" and tree.branching:
        return len(tree.branching)
    if tree.max_depth is not None:
        return min(tree.max_depth, tree.budget_nodes)
    return 0


def _apply_compute_bundle(raw: dict, base_dir: Path) -> dict:
    """``model.compute: {kind: table, from: PROFILE_DIR}``: every stage's table from a profile
    bundle (``wansim calibrate profile``; :mod:`wansim.stages.profiled_cost`), unless ``stage_compute``
    is given."""
    model = raw.get("model")
    comp = model.get("compute") if isinstance(model, Mapping) else None
    if not isinstance(comp, Mapping) or "from" not in comp:
        return raw
    from wansim.stages.profiled_cost import tables_from_bundle

    where = "model.compute.from"
    if comp.get("kind", "table") != "table" or set(comp) - {"kind", "from"}:
        raise ScenarioError(where, "takes only kind: table beside it", dict(comp))
    if not isinstance(comp["from"], str):
        raise ScenarioError(where, "must be a profile bundle directory", comp["from"])
    found = resolve_file(comp["from"], base_dir)
    if found is None or not found.is_dir():
        raise ScenarioError(where, "profile bundle directory not found", comp["from"])
    stages = raw.get("stages", 10)
    payload = raw.get("payload")
    bits = payload.get("activation_bits", 16) if isinstance(payload, Mapping) else 16
    if not isinstance(stages, int) or not isinstance(bits, int):
        return raw  # the schema reports the bad field
    tables = tables_from_bundle(found, stages, bits, where)
    new = {**model, "compute": tables[0]}
    new.setdefault("stage_compute", tables)
    return {**raw, "model": new}


def _apply_drafter_preset(raw: dict) -> dict:
    """``drafter: {preset: NAME, ...}``: the catalog entry's values under the explicit keys."""
    drafter = raw.get("drafter")
    if not isinstance(drafter, Mapping) or drafter.get("preset") is None:
        return raw
    from wansim.speculation.drafters import preset_mapping

    merged = preset_mapping(drafter["preset"], drafter)
    return {**raw, "drafter": merged}
