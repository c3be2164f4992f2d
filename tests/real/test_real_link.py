"""Link emulator: the delivery rule, jitter distributions, and the relay's measured accuracy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from wansim.real.errors import RealConfigError
from wansim.real.frames import HEADER_BYTES, Kind, array_frame
from wansim.real.link import LinkScheduler, LinkSpec, link_draws
from wansim.real.link_accuracy import relay_frames

pytestmark = pytest.mark.real

MS = 1_000_000


def test_serialisation_queues_but_propagation_overlaps():
    # 1250 bytes at 1 Mbit/s = 10 ms on the wire; latency 50 ms
    s = LinkScheduler(LinkSpec(latency_ms=50, bandwidth_mbps=1.0))
    d1, ser, prop, _, _ = s.schedule(0, 1250)
    d2, *_ = s.schedule(0, 1250)  # arrives together: waits for the first's serialisation only
    d3, *_ = s.schedule(200 * MS, 1250)  # link idle again
    assert ser == pytest.approx(10.0) and prop == 50.0
    assert d1 == 60 * MS and d2 == 70 * MS and d3 == 260 * MS


def test_fifo_never_overtakes():
    s = LinkScheduler(LinkSpec(latency_ms=20, jitter_kind="normal", jitter_std_ms=15, seed=3))
    out = [s.schedule(i * MS, 100)[0] for i in range(500)]
    assert all(b >= a for a, b in itertools.pairwise(out))


def test_loss_adds_retransmissions():
    s = LinkScheduler(LinkSpec(latency_ms=10, loss_rate=0.5, retransmit_ms=100, seed=1))
    props = np.array([s.schedule(i * 10**12, 10)[2] for i in range(4000)])
    # geometric number of losses with mean p/(1-p) = 1
    assert props.mean() == pytest.approx(10 + 100, rel=0.08)


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("normal", {}),
        ("lognormal", {}),
        ("lognormal", {"jitter_mean_ms": 5.0}),
        ("pareto", {"jitter_shape": 4.0}),
    ],
)
def test_jitter_moments(kind, extra):
    spec = LinkSpec(latency_ms=30, jitter_kind=kind, jitter_std_ms=3.0, **extra)
    draws = link_draws(spec)  # max(0, 30 + J): no clipping at 10 standard deviations
    j = np.array([draws.propagation_ms() for _ in range(40000)]) - 30.0
    mean = {"normal": 0.0, "lognormal": extra.get("jitter_mean_ms", 3.0)}.get(kind)
    if mean is not None:
        assert j.mean() == pytest.approx(mean, abs=0.1)
    assert j.std() == pytest.approx(3.0, rel=0.1 if kind != "pareto" else 0.25)
    if kind != "normal":
        assert j.min() >= 0


def test_bad_link_fields_are_one_line_errors():
    with pytest.raises(
        RealConfigError, match=r"link.latency_ms: must be a finite number >= 0, got -1"
    ):
        LinkSpec(latency_ms=-1)
    with pytest.raises(RealConfigError, match=r"link.jitter_kind: must be one of"):
        LinkSpec(jitter_kind="gauss")
    with pytest.raises(RealConfigError, match=r"link.jitter_std_ms: must be > 0 for normal"):
        LinkSpec(jitter_kind="normal")


class _VirtualTime:
    """A clock that advances 1 us a reading and a ``select(2)`` whose timeout wakes
    ``overshoot_ms`` late (a loaded machine's wake-up), so the relay's timing logic runs without
    a wall clock."""

    def __init__(self, overshoot_ms: float):
        self.now_ns = 0
        self.overshoot_ns = round(overshoot_ms * MS)
        self.slept_until_ns: list[int] = []

    def clock(self) -> int:
        self.now_ns += 1_000
        return self.now_ns

    def select(self, readable, writable, _errors, timeout=None):
        assert not readable and not writable and timeout is not None and timeout > 0
        self.now_ns += round(timeout * 1e9)
        self.slept_until_ns.append(self.now_ns)
        self.now_ns += self.overshoot_ns
        return [], [], []


class _Writer:
    """A downstream socket that takes every byte at once, noting when."""

    def __init__(self, vt: _VirtualTime):
        self.vt = vt
        self.written_ns: list[int] = []

    def send(self, data) -> int:
        self.written_ns.append(self.vt.now_ns)
        return len(data)


@pytest.mark.parametrize("overshoot_ms", [0.0, 0.6, 3.0])
def test_relay_writes_each_message_at_its_due_time_on_a_virtual_clock(tmp_path, overshoot_ms):
    """The relay's wait (sleep to ``busy_wait_ms`` before the due time, then busy-wait) on a
    virtual clock: a message is written at its due time, never before, within one clock
    reading; a sleep that wakes later than ``busy_wait_ms`` makes it late by exactly the excess
    (the machine's lateness, which no relay can undo). Offers: a burst that queues behind the
    20 Mbit/s serialisation, then two on an idle link."""
    from wansim.real.frames import decode_header, encode_header
    from wansim.real.relay import _Relay

    vt = _VirtualTime(overshoot_ms)
    spec = LinkSpec(latency_ms=15.0, bandwidth_mbps=20.0, busy_wait_ms=1.0)
    relay = _Relay(spec, 0, str(tmp_path / "link.csv"), clock=vt.clock, select=vt.select)
    frame = array_frame(Kind.HIDDEN, np.zeros(2000, np.uint8))
    data = encode_header(frame.header) + frame.payload
    arrivals_ns = [0, 100_000, 200_000, 500 * MS, 500 * MS + 1]
    for m, arrival in enumerate(arrivals_ns):
        relay._offer(m, [(m, decode_header(data[:HEADER_BYTES]), data, arrival)])
    writer = _Writer(vt)
    vt.now_ns = 0
    relay.run(None, writer)  # nothing more to read: deliver what is scheduled
    relay.close()

    ser_ms = len(data) * 8 / 20e3
    due_ns = np.array([r[2] for r in _records(tmp_path / "link.csv")], dtype=np.int64)
    # the queueing rule, by hand: start when the link is free, 15 ms after serialisation
    free, want = 0.0, []
    for a in np.array(arrivals_ns) / MS:
        free = max(a, free) + ser_ms
        want.append(free + 15.0)
    assert due_ns / MS == pytest.approx(want, abs=1e-6)
    # the wait, by hand: sleep to busy_wait_ms before the due time when further off than
    # that (waking overshoot_ms late), then busy-wait to the due time; one message at a time
    now, expected = 0.0, []
    for due in due_ns / MS:
        if due - now > spec.busy_wait_ms:
            now = due - spec.busy_wait_ms + overshoot_ms
        now = max(now, due)
        expected.append(now)
    written_ms = np.array(writer.written_ns) / MS
    assert (written_ms >= due_ns / MS).all()  # never early
    assert written_ms == pytest.approx(expected, abs=0.02)  # 1 us a clock reading
    assert len(vt.slept_until_ns) >= 2  # the idle-link message and the burst's first slept
    if overshoot_ms <= spec.busy_wait_ms:  # the wake-up's lateness is absorbed: on time
        assert written_ms == pytest.approx(due_ns / MS, abs=0.02)


def _records(path):
    """(arrival_ns, message, scheduled_ns, delivered_ns) per row of a relay's record CSV."""
    import csv

    with open(path) as fh:
        return [
            (
                int(r["arrival_ns"]),
                int(r["message"]),
                int(r["scheduled_ns"]),
                int(r["delivered_ns"]),
            )
            for r in csv.DictReader(fh)
        ]


def test_relay_process_holds_every_frame_for_its_delay():
    """A real relay process: every frame is scheduled exactly 15 ms after it arrived, and the
    times recorded by the sender, the relay and the receiver (one monotonic clock) are in
    causal order: sent <= arrived <= due <= written, and due <= received. So no frame is early; how late
    frames are depends on the machine's load (benchmarks/bench_link_accuracy.py measures it;
    the relay's own timing is checked on a virtual clock above)."""
    f = relay_frames(LinkSpec(latency_ms=15.0), frames=150, interval_ms=2.0)
    assert (f.scheduled - f.arrival) == pytest.approx(15 * MS, abs=1)
    assert (f.arrival >= f.send).all()
    assert (f.delivered >= f.scheduled).all()
    assert (f.received >= f.scheduled).all()
    assert ((f.received - f.send) / MS >= 15.0).all()  # the configured delay at least
    assert np.array_equal(f.send, np.sort(f.send))  # received in the order sent


def test_relay_bandwidth_serialisation():
    """16 KiB frames at 20 Mbit/s (6.55 ms each on the wire) sent back to back: they queue, and
    each frame's due time is the queueing rule applied to the arrivals the relay recorded (by
    hand here: start when the link is free, then 5 ms)."""
    f = relay_frames(
        LinkSpec(latency_ms=5.0, bandwidth_mbps=20.0), frames=40, frame_bytes=16384, interval_ms=0
    )
    ser_ms = 16384 * 8 / 20e3
    arrival_ms = (f.arrival - f.arrival[0]) / MS
    free, want = 0.0, []
    for a in arrival_ms:
        free = max(a, free) + ser_ms
        want.append(free + 5.0)
    assert (f.scheduled - f.arrival[0]) / MS == pytest.approx(want, abs=1e-5)
    assert f.busy_ms == pytest.approx(ser_ms, rel=1e-6)
    assert (f.queue_ms > 0).sum() >= 20  # a burst of 40 frames queued behind each other
    assert (f.received >= f.scheduled).all()  # never early


# ----------------------------------------------------------------------------- one link model
HOPS = [
    # (latency, bandwidth, jitter, loss, rto): every jitter kind, loss, queueing at 40 Mbit/s
    (20.0, 40.0, {"jitter_kind": "lognormal", "jitter_std_ms": 4.0}, 0.05, 200.0),
    (5.0, 10.0, {"jitter_kind": "normal", "jitter_std_ms": 8.0}, 0.3, 60.0),
    (30.0, 100.0, {"jitter_kind": "pareto", "jitter_std_ms": 3.0, "jitter_shape": 3.5}, 0.1, 90.0),
    (10.0, 1000.0, {"jitter_kind": "empirical", "jitter_samples_ms": (-12.0, 0.0, 4.0)}, 0.0, 0),
    # per-message software costs: 4 ms a message and 3 ms per MB at 40 Mbit/s, with loss
    (15.0, 40.0, {"per_message_ms": 4.0, "codec_ms_per_mb": 3.0}, 0.1, 120.0),
    # TCP: window-limited sender with restart after idle, and without
    (12.0, 200.0, {"transport": "tcp", "jitter_kind": "normal", "jitter_std_ms": 2.0}, 0.02, 200),
    (12.0, 200.0, {"transport": "tcp", "tcp_restart_after_idle": False}, 0.05, 200.0),
    # time-varying: a drift over the run, and a replayed trace with the drift (factors multiply)
    (
        20.0,
        40.0,
        {"drift_latency_factor": 1.5, "drift_bandwidth_factor": 0.6, "drift_over_ms": 60_000.0},
        0.05,
        150.0,
    ),
    (
        20.0,
        40.0,
        {
            "jitter_kind": "lognormal",
            "jitter_std_ms": 2.0,
            "drift_latency_factor": 1.3,
            "trace_t_ms": (0.0, 20_000.0, 50_000.0),
            "trace_latency_factor": (1.0, 2.0, 0.5),
            "trace_bandwidth_factor": (1.0, 0.5, 2.0),
        },
        0.0,
        0.0,
    ),
]


def _des_deliveries(spec: LinkSpec, offers_ms, sizes) -> list[float]:
    """The DES's own Link on the hop ``spec`` describes, with the DES's streams for its seed."""
    from wansim.config.network import Hop, Jitter
    from wansim.links.draws import hop_streams, ring_seeds
    from wansim.sim.kernel import Kernel
    from wansim.sim.link import Link

    jitter = Jitter(
        kind=spec.jitter_kind,
        std_ms=spec.jitter_std_ms if spec.jitter_kind != "empirical" else 0.0,
        shape=spec.jitter_shape,
        samples_ms=spec.jitter_samples_ms,
    )
    hop = Hop(
        spec.latency_ms,
        spec.bandwidth_mbps,
        jitter,
        spec.loss_rate,
        spec.retransmit_ms,
        spec.per_message_ms,
        spec.codec_ms_per_mb,
    )
    log: list = []
    streams = hop_streams(ring_seeds(spec.seed, spec.ring_stages), spec.hop)
    tcp = LinkScheduler(spec).sender.tcp
    link = Link(
        Kernel(),
        spec.hop,
        hop,
        lambda _p: None,
        *streams,
        log,
        tcp and tcp.params,
        spec.modulation(),
    )
    for t, b in zip(offers_ms, sizes, strict=True):
        link.send([], float(b), 0.0, offer_ms=float(t))
    return [r[4] for r in log]


@pytest.mark.parametrize("case", range(len(HOPS)))
def test_emulator_schedules_exactly_what_the_des_schedules(case):
    """Same seed, same hop of the same ring, same offers: the emulator's scheduler and the DES's
    link deliver every message at the same time (to the ns the emulator rounds to)."""
    lat, bw, jit, loss, rto = HOPS[case]
    spec = LinkSpec(
        latency_ms=lat,
        bandwidth_mbps=bw,
        loss_rate=loss,
        retransmit_ms=rto,
        seed=11 + case,
        ring_stages=len(HOPS),
        hop=case,
        **jit,
    )
    rng = np.random.default_rng(case)
    gaps = np.where(rng.random(3000) < 0.5, 0.0, rng.exponential(40.0, 3000))  # bursts queue
    offers = np.cumsum(gaps)
    offers -= offers[0]  # the emulator's clock starts at its first message (drift, trace)
    sizes = rng.choice([56, 120, 14_000, 57_400], 3000)
    sched = LinkScheduler(spec)
    emulated = [
        sched.schedule(round(t * MS), int(b))[0] for t, b in zip(offers, sizes, strict=False)
    ]
    des = np.array(_des_deliveries(spec, offers, sizes))
    assert np.abs(np.array(emulated) / MS - des).max() < 2e-6
    if loss:
        assert sched.draws.loss_rate == loss


def test_link_spec_from_a_scenario(tmp_path):
    """A scenario's hop as the DES runs it: resolved values, tcp, drift and trace, its streams;
    through JSON (the relay processes) unchanged."""
    from wansim.config.scenario import load_scenario

    trace = tmp_path / "t.csv"
    trace.write_text("t_ms,latency_factor,bandwidth_factor\n0,1,1\n500,2,0.5\n")
    sc = load_scenario(
        data={
            "stages": 3,
            "seed": 9,
            "network": {
                "latency_ms": 7.0,
                "transport": "tcp",
                "drift": {"latency_factor": 1.2, "over_ms": 1000.0},
                "trace_file": str(trace),
                "hops": [{}, {"bandwidth_mbps": 30.0}, {}],
            },
        }
    )
    spec = LinkSpec.from_scenario(sc, 1)
    assert (spec.latency_ms, spec.bandwidth_mbps, spec.transport) == (7.0, 30.0, "tcp")
    assert (spec.seed, spec.ring_stages, spec.hop) == (9, 3, 1)
    assert spec.drift_latency_factor == 1.2 and spec.drift_over_ms == 1000.0
    assert spec.trace_t_ms == (0.0, 500.0) and spec.trace_bandwidth_factor == (1.0, 0.5)
    assert LinkSpec.from_json(spec.to_json()) == spec
    assert spec.modulation().at(750.0) == pytest.approx((1.15 * 2.0, 0.5))


def test_emulator_retransmission_pays_serialisation_again():
    # 1250 B at 1 Mbit/s = 10 ms a transmission, rto 100 ms, L = 50 ms: find lost messages
    s = LinkScheduler(
        LinkSpec(latency_ms=50, bandwidth_mbps=1.0, loss_rate=0.4, retransmit_ms=100, seed=2)
    )
    t = 0
    seen = 0
    for _ in range(200):
        t += 10**12  # idle link between messages
        deliver_ns, busy, prop, _, g = s.schedule(t, 1250)
        assert busy == pytest.approx(10.0 * (1 + g))
        assert prop == pytest.approx(50.0 + 100.0 * g)
        assert (deliver_ns - t) / MS == pytest.approx(10.0 * (1 + g) + 100.0 * g + 50.0)
        seen += g > 0
    assert seen > 40  # about 0.4 * 200 messages had a loss
    # queueing: a message offered while a lost one is re-sent waits for both transmissions
    s2 = LinkScheduler(LinkSpec(latency_ms=0, bandwidth_mbps=1.0, loss_rate=0.4, seed=2))
    for _ in range(50):
        _d1, _busy1, *_rest, g1 = s2.schedule(0, 1250)
        if g1:
            break
    before = s2.free_ms
    _d2, busy2, *_ = s2.schedule(0, 1250)
    assert before == pytest.approx(s2.free_ms - busy2)  # started when the link was free again


@pytest.mark.parametrize("shape", ["chain", "tree", "batch", "lossless chain"])
def test_a_pass_is_one_message_on_the_link_whatever_frames_it_has(shape, tmp_path):
    """A pass's leading frames (drafts, draft distributions, a tree's shape, a batch's blocks)
    wait for its activations and go as one message (one schedule from the last frame's
    arrival, one set of bytes), as the engines send a pass; the verdict, a cancellation and a
    job are messages of their own. Before the tree's shape and the batch's blocks were leading
    kinds, a tree or batched pass went as two messages (shape first), so the middle hops'
    per-message costs of a 6-stage tree were a third of the first hop's (docs/calibrate.md,
    "Run V")."""
    from wansim.real.frames import (
        Kind,
        array_frame,
        batch_frame,
        encode_header,
        message_frame,
        tree_frame,
    )
    from wansim.real.relay import _Relay

    def wire(f):
        return encode_header(f.header) + f.payload

    ids = array_frame(Kind.DRAFT_IDS, np.arange(4, dtype=np.int32), 1)
    hidden = array_frame(Kind.HIDDEN, np.zeros((5, 8), np.float32), 1)
    lead = {
        "chain": [ids],
        "tree": [ids, tree_frame([-1, 0, 0, 1], [], 1)],
        "batch": [ids, batch_frame([(0, 3, 5, 4)], 1)],
        "lossless chain": [ids, array_frame(Kind.DRAFT_PROBS, np.zeros((4, 6), np.float32), 1)],
    }[shape]
    frames = [
        message_frame(Kind.JOB, "{}"),
        *lead,
        hidden,
        array_frame(Kind.CANCEL, np.zeros(0, np.int32), 1),
    ]
    clock = iter(range(0, 10**9, 1000))
    relay = _Relay(LinkSpec(latency_ms=1.0), 0, None, clock=lambda: next(clock))

    data = b"".join(wire(f) for f in frames)
    for at in range(0, len(data), 7):  # in pieces, as a socket may hand them over
        relay.feed(data[at : at + 7], next(clock))
    relay.end_of_stream()
    messages = list(relay.pending)
    kinds = [[h.kind for _, h, _, _ in m[1]] for m in messages]
    assert kinds == [[Kind.JOB], [f.kind for f in lead] + [Kind.HIDDEN], [Kind.CANCEL]]
    pass_message = messages[1][1]
    assert sum(len(d) for _, _, d, _ in pass_message) == sum(len(wire(f)) for f in [*lead, hidden])
    assert relay.error is None


def test_relay_process_groups_frames_into_messages_and_matches_the_des():
    """Through a real relay process: a pass's draft-id frame and its activations are one message
    (one jitter and one loss draw), and the relay's schedule, given the arrival times it
    recorded, is the DES link's schedule on the same seed."""
    import csv
    import multiprocessing
    import os
    import socket
    import tempfile
    import threading

    from wansim.real.frames import Kind, array_frame, recv_frame, send_frame
    from wansim.real.relay import start_relay

    spec = LinkSpec(
        latency_ms=3.0,
        bandwidth_mbps=50.0,
        jitter_kind="normal",
        jitter_std_ms=1.0,
        loss_rate=0.2,
        retransmit_ms=4.0,
        seed=5,
        ring_stages=3,
        hop=1,
        busy_wait_ms=0.0,
    )
    passes = 40
    ctx = multiprocessing.get_context("spawn")
    sink = socket.create_server(("127.0.0.1", 0))
    with tempfile.TemporaryDirectory() as tmp:
        rec = os.path.join(tmp, "link.csv")
        proc, conn, port = start_relay(ctx, spec, 1, "127.0.0.1", sink.getsockname()[1], rec)
        recv_sock, _ = sink.accept()
        sink.close()
        send_sock = socket.create_connection(("127.0.0.1", port))
        got = []
        t = threading.Thread(target=lambda: got.extend(recv_frame(recv_sock) for _ in range(80)))
        t.start()
        for step in range(passes):
            send_frame(send_sock, array_frame(Kind.DRAFT_IDS, np.arange(4, dtype=np.int32), step))
            send_frame(send_sock, array_frame(Kind.HIDDEN, np.zeros((5, 64), np.float32), step))
        t.join(60)
        send_sock.close()
        proc.join(10)
        recv_sock.close()
        conn.close()
        with open(rec) as fh:
            rows = list(csv.DictReader(fh))
    assert [f.kind for f in got] == [Kind.DRAFT_IDS, Kind.HIDDEN] * passes  # order kept
    assert len(rows) == 2 * passes
    messages = {}
    for r in rows:
        messages.setdefault(int(r["message"]), []).append(r)
    assert len(messages) == passes
    for frames in messages.values():  # one schedule, one draw per message
        assert len({f["scheduled_ns"] for f in frames}) == 1
        assert len({f["losses"] for f in frames}) == 1
        assert {int(f["step"]) for f in frames} == {int(frames[0]["step"])}
    ordered = [messages[m] for m in sorted(messages)]
    origin = int(ordered[0][-1]["arrival_ns"])
    offers = [(int(m[-1]["arrival_ns"]) - origin) / MS for m in ordered]
    sizes = [sum(int(f["bytes"]) for f in m) for m in ordered]
    des = np.array(_des_deliveries(spec, offers, sizes))
    relay = np.array([(int(m[0]["scheduled_ns"]) - origin) / MS for m in ordered])
    assert np.abs(relay - des).max() < 2e-6
    assert sum(int(m[0]["losses"]) for m in ordered) > 0  # the loss path was exercised


def test_a_relay_asks_for_a_priority_that_takes_frames_as_they_are_sent():
    """``priority: realtime`` (the default): a started relay runs SCHED_FIFO where the host
    allows it (root, CAP_SYS_NICE), else nice -10, else as it is; ``normal`` leaves it alone.
    What it reports when listening is what the scheduler says it has; a bad value is one
    line naming ``link.priority``."""
    import multiprocessing
    import os
    import socket

    from wansim.real.relay import process_priority, raise_priority, start_relay

    assert LinkSpec().priority == "realtime" and raise_priority("normal") == "normal"
    with pytest.raises(RealConfigError, match=r"link\.priority.*realtime"):
        LinkSpec(priority="high")
    may_fifo = hasattr(os, "sched_setscheduler")
    ctx = multiprocessing.get_context("spawn")
    for wanted in ("realtime", "normal"):
        sink = socket.create_server(("127.0.0.1", 0))
        proc, conn, _port = start_relay(
            ctx, LinkSpec(priority=wanted), 0, "127.0.0.1", sink.getsockname()[1], None
        )
        try:
            got = process_priority(proc.pid)
            if wanted == "normal":
                assert got == "normal"
            else:
                assert got in ("realtime", "nice", "normal")
                if may_fifo and os.geteuid() == 0:  # root may always take SCHED_FIFO
                    assert got == "realtime"
        finally:
            proc.kill()
            proc.join(10)
            conn.close()
            sink.close()


def test_the_relay_waits_in_microseconds_then_busy_waits():
    """A relay waits in ``select(2)`` until ``busy_wait_ms`` (0.1 ms) before a due time and
    spins the rest, so its wait must be finer than a millisecond (asyncio's default epoll
    selector rounded every timeout up to a whole millisecond, and the relay spun 1 ms a frame
    at real-time priority). The relay waits in ``select.select`` itself (microsecond
    timeouts); on a virtual clock a message due 0.35 ms ahead is waited for with a timeout of
    0.25 ms, then written at its due time."""
    import select

    from wansim.real.frames import decode_header, encode_header
    from wansim.real.relay import _Relay

    assert _Relay(LinkSpec(), 0, None).select is select.select
    vt = _VirtualTime(0.0)
    timeouts: list[float] = []

    def recorder(r, w, x, timeout=None):
        timeouts.append(timeout)
        return vt.select(r, w, x, timeout)

    relay = _Relay(LinkSpec(latency_ms=0.35), 0, None, clock=vt.clock, select=recorder)
    frame = array_frame(Kind.HIDDEN, np.zeros(8, np.uint8))
    data = encode_header(frame.header) + frame.payload
    relay._offer(0, [(0, decode_header(data[:HEADER_BYTES]), data, 0)])
    vt.now_ns = 0
    writer = _Writer(vt)
    relay.run(None, writer)
    assert timeouts == [pytest.approx(0.00025, abs=2e-6)]
    assert writer.written_ns == [pytest.approx(0.35 * MS, abs=2_000)]
    assert LinkSpec().busy_wait_ms < 1.0


@pytest.mark.parametrize(
    ("tail", "error"),
    [
        (b"", None),
        (b"\x00" * 70, "malformed frame from upstream: bad magic"),
        ("header", "malformed frame from upstream: truncated header: 20 of"),
        ("payload", "malformed frame from upstream: truncated payload: 10 of 256 bytes"),
    ],
)
def test_the_relay_delivers_what_came_whole_and_names_what_did_not(tail, error):
    """The relay between two socket pairs: a whole frame sent before the sender closes is
    delivered, byte for byte; then a bad header, a header cut short or a payload cut short at
    the close is the relay's one error, naming what was wrong (the stage's runner reports it
    with the hop)."""
    import socket

    from wansim.real.frames import encode_header
    from wansim.real.relay import _Relay

    good = array_frame(Kind.HIDDEN, np.arange(64, dtype=np.uint8))
    big = array_frame(Kind.HIDDEN, np.zeros(256, np.uint8))
    wire = encode_header(good.header) + good.payload
    cut = encode_header(big.header) + big.payload
    tail = {"header": cut[:20], "payload": cut[: HEADER_BYTES + 10]}.get(tail, tail)
    up_in, up_out = socket.socketpair()
    down_in, down_out = socket.socketpair()
    with up_in, up_out, down_in, down_out:
        up_in.sendall(wire + tail)
        up_in.shutdown(socket.SHUT_WR)
        relay = _Relay(LinkSpec(latency_ms=0.5), 0, None)
        down_out.setblocking(False)
        relay.run(up_out, down_out)
        down_in.settimeout(5)
        assert down_in.recv(1 << 16) == wire
    if error is None:
        assert relay.error is None
    else:
        assert relay.error.startswith(error), relay.error


def test_a_relay_process_imports_neither_torch_nor_scipy_nor_pandas():
    """A relay starts fast because its module needs numpy and the standard library only
    (``wansim.real.relay`` and what it imports: the link's spec and schedule, the frames)."""
    import subprocess
    import sys

    code = (
        "import sys, wansim.real.relay, wansim.real.link_accuracy; "
        "print(sorted(m for m in ('torch', 'scipy', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
