"""Scenario section ``network``: the ring's links - latency, bandwidth, jitter, loss,
per-message costs, per-hop overrides, the transport (ideal or tcp), drift and traces.

Field documentation: README.md's scenario section."""

from __future__ import annotations

import dataclasses

from wansim.config.limits import MAX_STAGES
from wansim.config.model import IdleCost
from wansim.config.validation import spec
from wansim.errors import ScenarioError

JITTER_KINDS = ("none", "normal", "lognormal", "pareto", "empirical")
TRANSPORTS = ("ideal", "tcp")
MAX_LOSS_RATE = 0.99


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


IDLE_RESTARTS = ("initial_window", "halve_per_rto")


@dataclasses.dataclass(frozen=True)
class Tcp:
    """``network.transport: tcp`` (:mod:`wansim.links.tcp`): segments of ``mss_bytes``, an
    initial window of ``initial_window_segments`` segments, the receiver's window
    ``max_window_bytes``, and the window's restart after an idle period longer than
    ``network.retransmit_ms`` (``restart_after_idle``; Linux's tcp_slow_start_after_idle):
    from the initial window (``idle_restart: initial_window``, RFC 5681 section 4.1) or halved
    once per RTO of idle beyond the first, down to the initial window (``halve_per_rto``,
    RFC 2861 as Linux's tcp_cwnd_restart does it)."""

    mss_bytes: int = spec(1448, ge=64, le=65535)
    initial_window_segments: int = spec(10, ge=1, le=1000)
    max_window_bytes: float = spec(4194304.0, gt=0)
    restart_after_idle: bool = spec(True)
    idle_restart: str = spec("initial_window", choices=IDLE_RESTARTS)

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
