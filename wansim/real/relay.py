"""The link emulator's relay: one process per hop between two stages, holding each message for
the delay :class:`wansim.real.link.LinkScheduler` gives it (the engines' rule, by the same code).

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
when nothing is due within 20 ms, every 512 frames and at the end. The loopback legs into and
out of the relay and the wake-up error are the emulator's own error
(:mod:`wansim.real.link_accuracy` measures it: achieved one-way delay minus the scheduled one).

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

import collections
import contextlib
import csv
import json
import os
import select
import signal
import socket
import sys
import time

from wansim.real.frames import HEADER_BYTES, FrameError, Kind, decode_header
from wansim.real.link import LinkScheduler, LinkSpec

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
