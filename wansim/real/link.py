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

Timing: one thread per relay, waiting in ``select(2)`` (microsecond timeouts) for the upstream
socket, for the downstream socket where it holds back bytes, or until ``busy_wait_ms`` before
the next message's due time, then busy-waiting to it; frames arriving meanwhile are read and
scheduled as they come. Frames arriving while the relay busy-waits are time-stamped late by at
most ``busy_wait_ms``. The relay's CPU is the emulator's, on the cores the stage processes
share, and at real-time priority it takes them from a compute: it was an asyncio event loop
(on ``select(2)``: asyncio's default epoll selector rounds every timeout up to a whole
millisecond, so the relay had slept to 1 ms before and spun 0.87 ms a frame), 0.26-0.30 ms of
CPU a frame with 0.1 ms of spin at real-time priority; this loop takes 0.19-0.22 ms, half of it
the spin (BENCHMARKS.md, "The real path's link relay"). uvloop's clock is cached to 1 ms, so it
is not used. Every frame's timings go to a CSV (a message's frames share its schedule), written
when nothing is due within 20 ms, every 512 frames and at the end. The loopback legs into and out of the relay and the wake-up error are the emulator's
own error: :func:`measure_link_accuracy` measures it (achieved one-way delay minus the
scheduled one).

Priority. A link moves a frame when its sender hands it over, whatever the sender does next;
a relay process woken by a stage that goes on computing (stage 0 drafting its next block right
after sending one, a stage serving another request) is queued on the busy core and takes the
frame only when the scheduler lets it (measured on 2 cores: a restart block of an async run
reached the hop-0 relay 1.6 ms after stage 0 sent it, median, against 0.2 ms when stage 0
waits). With ``priority: realtime`` (the default) each relay asks for ``SCHED_FIFO`` at the
lowest real-time priority, else ``nice -10``, else runs as it is (:func:`raise_priority`; what
it got is readable with :func:`process_priority`): the same restart frames then arrive in
0.04-0.15 ms (mean) against 0.86-0.91. Its work per frame is small (reading, scheduling, the
last ``busy_wait_ms`` of spinning); the kernel's real-time throttling leaves the other
processes at least 5% of each core in any case.

numpy and the standard library only (no torch, no scipy), so relays start fast.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import itertools
import json
import math
import multiprocessing
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from wansim.config.limits import MAX_STAGES
from wansim.config.network import JITTER_KINDS, TRANSPORTS
from wansim.links.delivery import HopSender
from wansim.links.draws import LinkDraws, hop_streams, ring_seeds
from wansim.links.jitter import jitter_dist
from wansim.links.nonstationary import Modulation, Ramp, network_modulation
from wansim.links.tcp import TcpParams, tcp_params
from wansim.real.errors import RealConfigError
from wansim.real.frames import (
    HEADER_BYTES,
    FrameError,
    Kind,
    array_frame,
    decode_header,
    recv_frame,
    send_frame,
)

RELAY_PRIORITIES = ("realtime", "normal")
REALTIME_PRIORITY = 1  # SCHED_FIFO's lowest: above every ordinary process, below the kernel's
RAISED_NICE = -10  # the fallback where SCHED_FIFO is refused
# frames that open a message and wait for the frame that ends it: a pass's drafts, a tree
# pass's shape and a batched pass's blocks ride with its activations forward (and drafts with
# the verdict on the return hop), so a pass is one message on every hop, as the engines send
# it; every other kind ends a message
LEADING_KINDS = frozenset({Kind.DRAFT_IDS, Kind.DRAFT_PROBS, Kind.TREE, Kind.BATCH})
RECORD_COLUMNS = (
    "frame",
    "message",
    "kind",
    "step",
    "bytes",
    "send_ns",
    "arrival_ns",
    "scheduled_ns",
    "delivered_ns",
    "busy_ms",
    "prop_ms",
    "jitter_ms",
    "queue_ms",
    "losses",
)


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
    busy_wait_ms: float = 0.1  # (module docstring, "Timing")
    # the relay's scheduling (module docstring, "Priority"): realtime | normal
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


# ----------------------------------------------------------------------------- the relay
# the record's rows are written when nothing is due this soon, or when this many wait
ROWS_WRITE_SLACK_NS = 20_000_000
ROWS_WRITE_MAX = 512


class _Relay:
    """One hop's relay: one thread waiting in ``select(2)`` for the upstream socket, the
    downstream socket (when it holds back bytes) or the next message's due time (module
    docstring, "Timing"). ``clock`` (ns) and ``select`` (:func:`select.select`'s signature)
    are the real ones; a test may give a virtual pair to check the delivery timing without a
    wall clock."""

    def __init__(
        self,
        spec: LinkSpec,
        hop: int,
        records_path: str | None,
        clock=time.monotonic_ns,
        select=select.select,
    ):
        self.spec = spec
        self.clock = clock
        self.select = select
        self.hop = hop
        self.busy_ns = int(spec.busy_wait_ms * 1e6)
        self.sched = LinkScheduler(spec)
        self.pending: collections.deque = collections.deque()  # scheduled messages, in order
        self.records = open(records_path, "w", newline="") if records_path else None  # noqa: SIM115
        self.writer_csv = csv.writer(self.records) if self.records else None
        if self.writer_csv:
            self.writer_csv.writerow(RECORD_COLUMNS)
            self.records.flush()
        self.rows: list = []  # delivered frames not yet written to the record
        self.out = bytearray()  # delivered bytes the downstream socket has not taken yet
        self.error: str | None = None
        # reading: bytes of frames not complete yet, the current frame's header and arrival
        self._buf = bytearray()
        self._header = None
        self._frame = 0
        self._message = 0
        self._message_frames: list = []  # frames of the message being read (leading kinds)

    def _offer(self, message: int, frames: list) -> None:
        """Schedule one message (its frames, complete at the last frame's arrival)."""
        nbytes = sum(len(f[2]) for f in frames)
        deliver, busy, prop, jit, g = self.sched.schedule(frames[-1][3], nbytes)
        self.pending.append((message, frames, deliver, busy, prop, jit, g))

    def feed(self, data: bytes, arrival_ns: int) -> None:
        """Bytes read from upstream at ``arrival_ns``: every frame they complete (a frame
        arrives when its header is read) joins its message, and a message is offered at the
        frame that ends it (:data:`LEADING_KINDS`)."""
        buf = self._buf
        buf += data
        at = 0
        while True:
            if self._header is None:
                if len(buf) - at < HEADER_BYTES:
                    break
                self._header = (decode_header(bytes(buf[at : at + HEADER_BYTES])), arrival_ns)
            h, arrival = self._header
            end = at + HEADER_BYTES + h.payload_len
            if len(buf) < end:
                break
            frame = bytes(buf[at:end])
            at, self._header = end, None
            if self.spec.corrupt_frame is not None and self._frame == self.spec.corrupt_frame:
                frame = frame[:20] + bytes([frame[20] ^ 0xFF]) + frame[21:]
            self._message_frames.append((self._frame, h, frame, arrival))
            self._frame += 1
            if h.kind not in LEADING_KINDS:
                self._offer(self._message, self._message_frames)
                self._message += 1
                self._message_frames = []
        del buf[:at]

    def end_of_stream(self) -> None:
        """Upstream closed: inside a frame it is an error; inside a message, what came of it
        is delivered."""
        if self._header is not None:
            h = self._header[0]
            got = len(self._buf) - HEADER_BYTES
            raise FrameError(f"truncated payload: {got} of {h.payload_len} bytes")
        if self._buf:
            raise FrameError(f"truncated header: {len(self._buf)} of {HEADER_BYTES} bytes")
        if self._message_frames:
            self._offer(self._message, self._message_frames)
            self._message_frames = []

    def _deliver(self, down) -> None:
        """The head message: busy-wait to its due time (never early), write its frames, keep
        their record rows."""
        message, frames, deliver, busy, prop, jit, g = self.pending.popleft()
        stall = self.spec.stall_after_frames
        if stall is not None:  # fault injection: the link swallows every frame from here on
            frames = [f for f in frames if f[0] < stall]
            if not frames:
                return
        clock = self.clock
        while clock() < deliver:
            pass
        for _, _, data, _ in frames:
            self.out += data
        self._send(down)
        delivered = clock()
        for idx, h, data, arrival in frames:
            self.rows.append(
                (idx, message, h, len(data), arrival, deliver, delivered, busy, prop, jit, g)
            )

    def _send(self, down) -> None:
        """Hand the socket what it takes now; the rest waits for it to be writable."""
        try:
            sent = down.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        del self.out[:sent]

    def _write_rows(self) -> None:
        if self.writer_csv and self.rows:
            self.writer_csv.writerows(
                (
                    idx,
                    message,
                    int(h.kind),
                    h.step,
                    n,
                    h.send_ns,
                    arrival,
                    deliver,
                    delivered,
                    f"{busy:.6f}",
                    f"{prop:.6f}",
                    f"{jit:.6f}",
                    f"{(deliver - arrival) / 1e6 - busy - prop:.6f}",
                    g,
                )
                for idx, message, h, n, arrival, deliver, delivered, busy, prop, jit, g in self.rows
            )
            self.records.flush()
        self.rows = []

    def run(self, up, down) -> None:
        """Relay from ``up`` (a socket, or None: nothing more to read) to ``down`` until
        upstream has closed and every message is delivered. A message due within
        ``busy_wait_ms`` is busy-waited for; otherwise the loop waits in ``select(2)`` until
        ``busy_wait_ms`` before it (microsecond timeouts), reading what arrives meanwhile."""
        reading = up is not None
        pending, clock = self.pending, self.clock
        while True:
            timeout_ns = None
            while pending:
                wait_ns = pending[0][2] - clock() - self.busy_ns
                if wait_ns > 0:
                    timeout_ns = wait_ns
                    break
                self._deliver(down)
            if not (reading or pending or self.out):
                break
            if (
                timeout_ns is None
                or timeout_ns > ROWS_WRITE_SLACK_NS
                or len(self.rows) > ROWS_WRITE_MAX
            ):
                self._write_rows()
            readable, writable, _ = self.select(
                [up] if reading else [],
                [down] if self.out else [],
                [],
                None if timeout_ns is None else timeout_ns / 1e9,
            )
            if writable:
                self._send(down)
            if readable:
                try:
                    data = up.recv(1 << 20)
                except (ConnectionError, OSError) as e:
                    self.error = f"upstream connection failed: {e}"
                    reading = False
                    continue
                try:
                    if data:
                        self.feed(data, clock())
                    else:
                        reading = False
                        self.end_of_stream()
                except FrameError as e:
                    self.error = f"malformed frame from upstream: {e}"
                    reading = False
        self._write_rows()

    def close(self):
        if self.records:
            self._write_rows()
            self.records.close()


def _serve(spec, hop, listener, downstream, records_path) -> str | None:
    relay = _Relay(spec, hop, records_path)
    try:
        listener.setblocking(True)
        up, _ = listener.accept()
        listener.close()
        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        downstream.setblocking(False)
        relay.run(up, downstream)
        downstream.setblocking(True)
        downstream.sendall(relay.out)
        with contextlib.suppress(OSError):
            downstream.shutdown(socket.SHUT_WR)
        downstream.close()
    except (ConnectionError, OSError) as e:
        relay.error = relay.error or f"downstream connection failed: {e}"
    finally:
        relay.close()
    return relay.error


def _send_ctrl(conn, **msg) -> None:
    if conn is not None:
        with contextlib.suppress(OSError, ValueError):
            conn.send_bytes(json.dumps(msg).encode())


def raise_priority(wanted: str) -> str:
    """Ask for this process's relay priority (module docstring, "Priority"); returns what it
    got: ``realtime`` (SCHED_FIFO), ``nice`` (nice -10) or ``normal``."""
    if wanted == "normal":
        return "normal"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
        return "realtime"
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, RAISED_NICE)
        return "nice"
    except (AttributeError, OSError):
        return "normal"


def process_priority(pid: int) -> str:
    """A process's scheduling as :func:`raise_priority` names it (``normal`` where the host
    cannot tell)."""
    try:
        if os.sched_getscheduler(pid) == os.SCHED_FIFO:
            return "realtime"
        return "nice" if os.getpriority(os.PRIO_PROCESS, pid) < 0 else "normal"
    except (AttributeError, OSError):
        return "normal"


def relay_main(spec_json: str, hop: int, host: str, downstream_port: int, records_path, conn):
    """Process entry: listen for the upstream sender, connect downstream, relay until EOF.

    Reports ``{"event": "listening", "port": P}`` then, on failure,
    ``{"event": "error", "hop": h, "message": ...}`` over ``conn`` (JSON bytes, no pickle).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    spec = LinkSpec.from_json(spec_json)
    try:
        listener = socket.create_server((host, 0))
        listener.setblocking(False)
        down = socket.create_connection((host, downstream_port), timeout=30)
        down.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        down.setblocking(False)
    except OSError as e:
        _send_ctrl(conn, event="error", hop=hop, message=f"relay setup failed: {e}")
        sys.exit(1)
    priority = raise_priority(spec.priority)
    _send_ctrl(conn, event="listening", hop=hop, port=listener.getsockname()[1], priority=priority)
    error = _serve(spec, hop, listener, down, records_path)
    if error:
        _send_ctrl(conn, event="error", hop=hop, message=error)
        sys.exit(1)
    _send_ctrl(conn, event="closed", hop=hop)


def start_relay(ctx, spec: LinkSpec, hop: int, host: str, downstream_port: int, records_path):
    """Start a relay process; return (process, control connection, upstream port)."""
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(
        target=relay_main,
        args=(spec.to_json(), hop, host, downstream_port, records_path, child),
        name=f"wansim-link-{hop}",
        daemon=True,
    )
    proc.start()
    child.close()
    if not parent.poll(30):
        proc.kill()
        raise RuntimeError(f"link relay for hop {hop} did not start")
    msg = json.loads(parent.recv_bytes())
    if msg.get("event") != "listening":
        proc.join(1)
        raise RuntimeError(f"link relay for hop {hop} failed: {msg.get('message')}")
    return proc, parent, int(msg["port"])


# ----------------------------------------------------------------------------- accuracy
@dataclass(frozen=True)
class LinkAccuracy:
    """Achieved minus scheduled one-way delay (ms) over ``frames`` frames through one relay."""

    frames: int
    frame_bytes: int
    configured: LinkSpec
    error_ms_mean: float
    error_ms_sd: float
    error_ms_p50: float
    error_ms_p99: float
    error_ms_max: float
    error_ms_min: float
    delay_ms_mean: float
    scheduled_ms_mean: float
    into_relay_ms_p50: float  # sender -> relay (loopback leg and relay read)
    wake_late_ms_p50: float  # relay wrote the frame this late after its due time
    wake_late_ms_p99: float
    out_of_relay_ms_p50: float  # relay -> receiver (loopback leg and receiver wake-up)
    load_avg_1min: float

    def as_dict(self) -> dict:
        d = asdict(self)
        d["configured"] = asdict(self.configured)
        return d


@dataclass(frozen=True)
class RelayFrames:
    """Per-frame times (ns, ``time.monotonic_ns``: one clock for every process) of frames sent
    through one relay process: the sender's ``send``, the relay's ``arrival`` (read complete),
    ``scheduled`` (its delivery rule) and ``delivered`` (written), the receiver's ``received``;
    and the relay's ``busy_ms``/``prop_ms``/``queue_ms`` per frame (its record CSV)."""

    frame_bytes: int
    send: np.ndarray
    arrival: np.ndarray
    scheduled: np.ndarray
    delivered: np.ndarray
    received: np.ndarray
    busy_ms: np.ndarray
    prop_ms: np.ndarray
    queue_ms: np.ndarray


def relay_frames(
    spec: LinkSpec,
    frames: int = 1000,
    frame_bytes: int = 64,
    interval_ms: float = 2.0,
    host: str = "127.0.0.1",
) -> RelayFrames:
    """Send ``frames`` frames, one every ``interval_ms`` (0: back to back), through a relay
    process and return every frame's times (:class:`RelayFrames`)."""
    import tempfile

    ctx = multiprocessing.get_context("spawn")
    sink = socket.create_server((host, 0))
    with tempfile.TemporaryDirectory() as tmp:
        rec = os.path.join(tmp, "link.csv")
        proc, conn, port = start_relay(ctx, spec, 0, host, sink.getsockname()[1], rec)
        recv_sock, _ = sink.accept()
        sink.close()
        send_sock = socket.create_connection((host, port))
        for s in (send_sock, recv_sock):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        n_values = max(1, frame_bytes - HEADER_BYTES)
        payload = np.zeros(n_values, dtype=np.uint8)
        received: list[tuple[int, int]] = []

        def receive():
            for _ in range(frames):
                f = recv_frame(recv_sock)
                received.append((f.header.send_ns, time.monotonic_ns()))

        t = threading.Thread(target=receive, daemon=True)
        t.start()
        next_t = time.monotonic()
        for i in range(frames):
            send_frame(send_sock, array_frame(Kind.HIDDEN, payload, step=i))
            next_t += interval_ms / 1e3
            time.sleep(max(0.0, next_t - time.monotonic()))
        t.join(timeout=60 + frames * (spec.latency_ms + 10 * spec.jitter_std_ms) / 1e3)
        send_sock.close()
        proc.join(10)
        recv_sock.close()
        conn.close()
        with open(rec) as fh:
            rows = list(csv.DictReader(fh))
    if len(received) != frames or len(rows) != frames:
        raise RuntimeError(f"link accuracy: got {len(received)}/{len(rows)} of {frames} frames")

    def col(name, kind=np.int64):
        return np.array([kind(r[name]) for r in rows], dtype=kind)

    send = np.array([s for s, _ in received], dtype=np.int64)
    if not np.array_equal(send, col("send_ns")):
        raise RuntimeError("link accuracy: frames received out of order")
    return RelayFrames(
        frame_bytes=HEADER_BYTES + n_values,
        send=send,
        arrival=col("arrival_ns"),
        scheduled=col("scheduled_ns"),
        delivered=col("delivered_ns"),
        received=np.array([r for _, r in received], dtype=np.int64),
        busy_ms=col("busy_ms", float),
        prop_ms=col("prop_ms", float),
        queue_ms=col("queue_ms", float),
    )


def measure_link_accuracy(
    spec: LinkSpec,
    frames: int = 1000,
    frame_bytes: int = 64,
    interval_ms: float = 2.0,
    host: str = "127.0.0.1",
) -> LinkAccuracy:
    """Send ``frames`` frames through a relay process; compare achieved to scheduled delay.

    Achieved = receiver's ``monotonic_ns`` at full receipt minus the sender's ``send_ns``;
    scheduled = the relay's own schedule (delivery minus arrival, which includes the sampled
    jitter and any serialisation/queueing). Their difference is the emulator's error: on a
    busy machine it is the processes' wake-up delays (benchmarks/bench_link_accuracy.py).
    """
    f = relay_frames(spec, frames, frame_bytes, interval_ms, host)
    achieved = (f.received - f.send) / 1e6
    scheduled = (f.scheduled - f.arrival) / 1e6
    into = (f.arrival - f.send) / 1e6
    late = (f.delivered - f.scheduled) / 1e6
    out = (f.received - f.delivered) / 1e6
    err = achieved - scheduled
    return LinkAccuracy(
        frames=frames,
        frame_bytes=f.frame_bytes,
        configured=spec,
        error_ms_mean=float(err.mean()),
        error_ms_sd=float(err.std()),
        error_ms_p50=float(np.percentile(err, 50)),
        error_ms_p99=float(np.percentile(err, 99)),
        error_ms_max=float(err.max()),
        error_ms_min=float(err.min()),
        delay_ms_mean=float(achieved.mean()),
        scheduled_ms_mean=float(scheduled.mean()),
        into_relay_ms_p50=float(np.percentile(into, 50)),
        wake_late_ms_p50=float(np.percentile(late, 50)),
        wake_late_ms_p99=float(np.percentile(late, 99)),
        out_of_relay_ms_p50=float(np.percentile(out, 50)),
        load_avg_1min=os.getloadavg()[0],
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Measure the link emulator's accuracy.")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--jitter-kind", default="none", choices=JITTER_KINDS)
    ap.add_argument("--jitter-std-ms", type=float, default=0.0)
    ap.add_argument("--bandwidth-mbps", type=float, default=None)
    ap.add_argument("--frames", type=int, default=1000)
    ap.add_argument("--frame-bytes", type=int, default=64)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    args = ap.parse_args(argv)
    spec = LinkSpec(
        latency_ms=args.latency_ms,
        jitter_kind=args.jitter_kind,
        jitter_std_ms=args.jitter_std_ms,
        bandwidth_mbps=args.bandwidth_mbps,
    )
    acc = measure_link_accuracy(spec, args.frames, args.frame_bytes, args.interval_ms)
    print(json.dumps(acc.as_dict(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
