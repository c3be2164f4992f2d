"""The link emulator's accuracy through a real relay process: achieved one-way delay (sender ->
receiver) minus the relay's own schedule, split into the legs into and out of the relay and the
relay's wake-up lateness (``python -m wansim.real link-accuracy``,
``benchmarks/bench_link_accuracy.py``)."""

from __future__ import annotations

import csv
import multiprocessing
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

from wansim.real.frames import HEADER_BYTES, Kind, array_frame, recv_frame, send_frame
from wansim.real.link import LinkSpec
from wansim.real.relay import start_relay


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
