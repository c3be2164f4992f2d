"""User-space WAN link emulator: one relay process per hop (kernel netem is unavailable).

Model: the one the engines use, by the same code. The relay groups frames into messages (a
pass's draft ids and probabilities, a tree pass's shape and a batched pass's blocks ride with
the activations or verdict that end the message: :data:`LEADING_KINDS`) and schedules each
message with :class:`wansim.links.delivery.HopSender`:
it starts at ``max(arrival, link free)``, holds the link for ``busy = per_message_ms +
codec_ms_per_mb * bytes / 1e6 + (1 + G) * bytes * 8 / bandwidth`` (the sender's software cost,
paid once; a lost transmission is sent again and pays serialisation again), and is delivered
at ``max(free + G * retransmit_ms + max(0, latency + jitter), previous delivery)``. Jitter J and
lost transmissions G are drawn once per message (not per frame) by
:class:`wansim.links.draws.LinkDraws` from the DES's streams for this hop: a ``LinkSpec`` with
``seed``, ``ring_stages`` and ``hop`` draws exactly what the DES draws for hop ``hop`` of a ring
of ``ring_stages`` stages run with scenario seed ``seed``. Jitter kinds and parameters are
``wansim.config.network.Jitter``'s (:mod:`wansim.links.jitter`).

The relay process that applies it is :mod:`wansim.real.relay`; its accuracy is measured by
:mod:`wansim.real.link_accuracy`.

numpy and the standard library only (no torch, no scipy), so relays start fast.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field

from wansim.config.limits import MAX_STAGES
from wansim.config.network import JITTER_KINDS, TRANSPORTS
from wansim.links.delivery import HopSender
from wansim.links.draws import LinkDraws, hop_streams, ring_seeds
from wansim.links.jitter import jitter_dist
from wansim.links.nonstationary import Modulation, Ramp, network_modulation
from wansim.links.tcp import TcpParams, tcp_params
from wansim.real.errors import RealConfigError

RELAY_PRIORITIES = ("realtime", "normal")  # (wansim.real.relay, "Priority")


@dataclass(frozen=True)
class LinkSpec:
    """One hop's emulated link. ``bandwidth_mbps=None`` means no serialisation delay.

    Random draws come from the DES's streams of hop ``hop`` in a ring of ``ring_stages`` stages
    with scenario seed ``seed`` (:func:`wansim.links.draws.ring_seeds`).

    ``stall_after_frames`` / ``corrupt_frame`` inject faults for tests: hold every frame after
    the first N, or flip a header byte of frame number N (0-based).
    """

    latency_ms: float = 0.0
    bandwidth_mbps: float | None = None
    jitter_kind: str = "none"
    jitter_std_ms: float = 0.0
    jitter_mean_ms: float | None = None
    jitter_shape: float = 3.0
    jitter_samples_ms: tuple[float, ...] = ()
    loss_rate: float = 0.0
    retransmit_ms: float = 200.0
    per_message_ms: float = 0.0
    codec_ms_per_mb: float = 0.0
    transport: str = "ideal"
    tcp_mss_bytes: int = 1448
    tcp_initial_window_segments: int = 10
    tcp_max_window_bytes: float = 4194304.0
    tcp_restart_after_idle: bool = True
    tcp_idle_restart: str = "initial_window"
    # time-varying link (wansim.links.nonstationary): a drift and/or a replayed trace, in ms
    # from the first message (the emulator's clock origin)
    drift_latency_factor: float = 1.0
    drift_bandwidth_factor: float = 1.0
    drift_over_ms: float = 7_200_000.0
    trace_t_ms: tuple[float, ...] = ()
    trace_latency_factor: tuple[float, ...] = ()
    trace_bandwidth_factor: tuple[float, ...] = ()
    seed: int = 0
    ring_stages: int = 1
    hop: int = 0
    busy_wait_ms: float = 0.1  # (wansim.real.relay, "Timing")
    # the relay's scheduling (wansim.real.relay, "Priority"): realtime | normal
    priority: str = "realtime"
    stall_after_frames: int | None = None
    corrupt_frame: int | None = None

    def __post_init__(self):
        def bad(name, problem):
            raise RealConfigError(f"link.{name}", problem, getattr(self, name))

        if not self.latency_ms >= 0 or not math.isfinite(self.latency_ms):
            bad("latency_ms", "must be a finite number >= 0")
        if self.bandwidth_mbps is not None and not self.bandwidth_mbps > 0:
            bad("bandwidth_mbps", "must be > 0 (or null for unlimited)")
        if self.jitter_kind not in JITTER_KINDS:
            bad("jitter_kind", f"must be one of {list(JITTER_KINDS)}")
        if self.jitter_std_ms < 0:
            bad("jitter_std_ms", "must be >= 0")
        if self.jitter_kind in ("normal", "lognormal", "pareto") and self.jitter_std_ms <= 0:
            bad("jitter_std_ms", f"must be > 0 for {self.jitter_kind} jitter")
        lognormal_mean = self.jitter_kind == "lognormal" and self.jitter_mean_ms is not None
        if lognormal_mean and self.jitter_mean_ms <= 0:
            bad("jitter_mean_ms", "must be > 0 for lognormal jitter")
        if self.jitter_kind == "pareto" and not self.jitter_shape > 2:
            bad("jitter_shape", "must be > 2")
        if self.jitter_kind == "empirical" and not self.jitter_samples_ms:
            bad("jitter_samples_ms", "must be non-empty for empirical jitter")
        if not 0 <= self.loss_rate < 1:
            bad("loss_rate", "must be in [0, 1)")
        if self.retransmit_ms < 0:
            bad("retransmit_ms", "must be >= 0")
        for name in ("per_message_ms", "codec_ms_per_mb"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                bad(name, "must be a finite number >= 0")
        if self.transport not in TRANSPORTS:
            bad("transport", f"must be one of {list(TRANSPORTS)}")
        if not 64 <= self.tcp_mss_bytes <= 65535:
            bad("tcp_mss_bytes", "must be in 64..65535")
        if not self.tcp_initial_window_segments >= 1:
            bad("tcp_initial_window_segments", "must be >= 1")
        if not self.tcp_max_window_bytes >= self.tcp_mss_bytes:
            bad("tcp_max_window_bytes", "must be >= tcp_mss_bytes")
        if not 1 <= self.ring_stages <= MAX_STAGES:
            bad("ring_stages", f"must be in 1..{MAX_STAGES}")
        if not 0 <= self.hop < self.ring_stages:
            bad("hop", f"must be in 0..{self.ring_stages - 1} (ring_stages - 1)")
        if not 0 <= self.busy_wait_ms <= 20:
            bad("busy_wait_ms", "must be in [0, 20]")
        if self.priority not in RELAY_PRIORITIES:
            bad("priority", f"must be one of {list(RELAY_PRIORITIES)}")
        for name in ("drift_latency_factor", "drift_bandwidth_factor", "drift_over_ms"):
            if not getattr(self, name) > 0 or not math.isfinite(getattr(self, name)):
                bad(name, "must be a finite number > 0")
        trace = (self.trace_t_ms, self.trace_latency_factor, self.trace_bandwidth_factor)
        if len({len(c) for c in trace}) != 1:
            bad("trace_t_ms", "the trace's three columns must have one value per sample each")
        if any(not v > 0 for v in (*self.trace_latency_factor, *self.trace_bandwidth_factor)):
            bad("trace_latency_factor", "trace factors must be > 0")
        if any(b <= a for a, b in itertools.pairwise(self.trace_t_ms)):
            bad("trace_t_ms", "must be increasing")

    def modulation(self) -> Modulation | None:
        """The hop's drift and trace (:class:`wansim.links.nonstationary.Modulation`), or None."""
        drift = Ramp(self.drift_latency_factor, self.drift_bandwidth_factor, self.drift_over_ms)
        trace = None
        if self.trace_t_ms:
            trace = (self.trace_t_ms, self.trace_latency_factor, self.trace_bandwidth_factor)
        mod = Modulation(drift, trace)
        return mod if mod.drift is not None or trace is not None else None

    @classmethod
    def from_hop(
        cls, hop, seed: int = 0, ring_stages: int = 1, index: int = 0, tcp=None, modulation=None
    ) -> LinkSpec:
        """From a resolved ``wansim.config.network.Hop`` (latency, bandwidth, jitter, loss, software
        costs), hop ``index`` of a ring of ``ring_stages`` (the DES's draws for that hop and
        seed); ``tcp``: ``wansim.links.tcp.TcpParams`` for ``transport: tcp``; ``modulation``:
        the network's :class:`~wansim.links.nonstationary.Modulation` (drift, trace)."""
        j = hop.jitter
        varying = {}
        if modulation is not None:
            d = modulation.drift
            if d is not None:
                varying["drift_latency_factor"] = d.latency_factor
                varying["drift_bandwidth_factor"] = d.bandwidth_factor
                varying["drift_over_ms"] = d.over_ms
            if modulation.trace is not None:
                ts, lats, bws = modulation.trace
                varying.update(
                    trace_t_ms=tuple(ts),
                    trace_latency_factor=tuple(lats),
                    trace_bandwidth_factor=tuple(bws),
                )
        if tcp is not None:
            tcp_fields = {
                "transport": "tcp",
                "tcp_mss_bytes": tcp.mss_bytes,
                "tcp_initial_window_segments": tcp.initial_window_segments,
                "tcp_max_window_bytes": tcp.max_window_bytes,
                "tcp_restart_after_idle": tcp.restart_after_idle,
                "tcp_idle_restart": tcp.idle_restart,
            }
        return cls(
            latency_ms=hop.latency_ms,
            bandwidth_mbps=hop.bandwidth_mbps,
            jitter_kind=j.kind,
            jitter_std_ms=j.std_ms,
            jitter_mean_ms=j.mean_ms,
            jitter_shape=j.shape,
            jitter_samples_ms=tuple(j.samples_ms),
            loss_rate=hop.loss_rate,
            retransmit_ms=hop.retransmit_ms,
            per_message_ms=hop.per_message_ms,
            codec_ms_per_mb=hop.codec_ms_per_mb,
            seed=seed,
            ring_stages=ring_stages,
            hop=index,
            **tcp_fields,
            **varying,
        )

    @classmethod
    def from_scenario(cls, scenario, index: int) -> LinkSpec:
        """Hop ``index`` of a scenario's ring as the DES runs it: its resolved hop, the
        network's transport (tcp) and time variation (drift, trace), the DES's streams."""
        net = scenario.network
        return cls.from_hop(
            scenario.resolved_hops()[index],
            scenario.seed,
            scenario.stages,
            index,
            tcp_params(net),
            network_modulation(net),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LinkSpec:
        raw = json.loads(text)
        for name in (
            "jitter_samples_ms",
            "trace_t_ms",
            "trace_latency_factor",
            "trace_bandwidth_factor",
        ):
            raw[name] = tuple(raw.get(name, ()))
        return cls(**raw)


def link_draws(spec: LinkSpec) -> LinkDraws:
    """The per-message draws of ``spec``'s hop: the DES's streams for (seed, ring_stages, hop)."""
    prop_rng, loss_rng = hop_streams(ring_seeds(spec.seed, spec.ring_stages), spec.hop)
    jitter = jitter_dist(
        _JitterFields(
            spec.jitter_kind,
            spec.jitter_std_ms,
            spec.jitter_mean_ms,
            spec.jitter_shape,
            spec.jitter_samples_ms,
        )
    )
    return LinkDraws(spec.latency_ms, jitter, spec.loss_rate, prop_rng, loss_rng)


@dataclass(frozen=True)
class _JitterFields:
    """``wansim.config.network.Jitter``'s fields, as :func:`wansim.links.jitter.jitter_dist` reads them."""

    kind: str
    std_ms: float
    mean_ms: float | None
    shape: float
    samples_ms: tuple[float, ...]
    samples_file: str | None = None


@dataclass
class LinkScheduler:
    """The shared per-hop sender (:class:`wansim.links.delivery.HopSender`) on this hop, one
    call per message; times in ns of ``time.monotonic_ns``, computed in ms from the first
    message's arrival (the DES's clock starts there too in the emulator-against-DES test)."""

    spec: LinkSpec
    draws: LinkDraws = field(init=False)
    sender: HopSender = field(init=False)
    origin_ns: int | None = None

    def __post_init__(self):
        spec = self.spec
        self.draws = link_draws(spec)
        tcp = None
        if spec.transport == "tcp":
            tcp = TcpParams(
                spec.tcp_mss_bytes,
                spec.tcp_initial_window_segments,
                spec.tcp_max_window_bytes,
                spec.tcp_restart_after_idle,
                spec.tcp_idle_restart,
            )
        bw = math.inf if spec.bandwidth_mbps is None else spec.bandwidth_mbps
        self.sender = HopSender(
            bw,
            spec.per_message_ms,
            spec.codec_ms_per_mb,
            spec.retransmit_ms,
            spec.latency_ms,
            tcp,
            spec.modulation(),
        )

    @property
    def free_ms(self) -> float:
        return self.sender.free_ms

    def schedule(self, arrival_ns: int, nbytes: int) -> tuple[int, float, float, float, int]:
        """(delivery_ns, busy_ms, prop_ms, jitter_ms, losses) for a message of ``nbytes``
        complete at ``arrival_ns``: ``busy_ms`` holds the link, ``prop_ms`` is the rest of the
        way (max(0, L + J) plus any loss repair), ``jitter_ms`` = max(0, L + J) - L."""
        if self.origin_ns is None:
            self.origin_ns = arrival_ns
        offer_ms = (arrival_ns - self.origin_ns) / 1e6
        g = self.draws.losses()
        propagation = self.draws.propagation_ms()
        start, free, delivery = self.sender.send(offer_ms, nbytes, g, propagation)
        delivery_ns = self.origin_ns + round(delivery * 1e6)
        busy = free - start
        return delivery_ns, busy, delivery - free, propagation - self.spec.latency_ms, g
