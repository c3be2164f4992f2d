"""A window-limited sender (``network.transport: tcp``): how long a message holds its hop when
the bytes go out as TCP segments under a congestion window, and what a loss costs.

Model (segment level, one connection per hop, ACK-clocked; RFC 5681 congestion control):

- A message of b bytes is ceil(b / MSS) segments. A segment may leave when the previous one
  has left (serialisation MSS*8/B holds the link) and fewer than ``cwnd`` bytes are in flight;
  its ACK returns one round trip after it left (RTT = 2 x the hop's latency: the ACK path
  mirrors the data path; jitter is not applied to ACKs).
- Each ACK grows the window: by one MSS below ``ssthresh`` (slow start, doubling per RTT), by
  MSS^2 / cwnd above it (congestion avoidance, one MSS per RTT); never above
  ``max_window_bytes`` (the receiver's window). Throughput is at most cwnd / RTT and at most B.
- Restart after idle (a switch, since stacks differ: Linux's ``tcp_slow_start_after_idle``):
  a message offered after the sender sent nothing for longer than the retransmission timeout
  (``network.retransmit_ms``) with nothing in flight starts from min(cwnd, IW)
  (``idle_restart: initial_window``, RFC 5681 section 4.1), or from cwnd halved once per
  RTO of idle beyond the first, down to that (``halve_per_rto``: RFC 2861 as Linux's
  tcp_cwnd_restart does it, with ssthresh raised to 3/4 of the old cwnd; measured with reno
  on this kernel's loopback: 72 segments after 1.2 RTOs of idle -> 36, 108 after 2.2 -> 27,
  162 after 3.2 -> 20, 100 after 4.2 -> 10, tests/physics/test_tcp_linux.py).
  One frame per lap on a long ring is such a message; back-to-back frames keep the window open.
- Loss: the message's G lost transmissions are lost segments (one draw per message, as in the
  ideal transport), taken at its last segment. With at least 4 segments' worth of window
  (three duplicate ACKs can follow) a loss is repaired by fast retransmit: the segment is
  re-sent one RTT after it left (one MSS of serialisation more) and ssthresh = cwnd =
  max(flight / 2, 2 MSS). Otherwise by timeout: re-sent ``retransmit_ms`` after it left,
  ssthresh = max(flight / 2, 2 MSS), cwnd = 1 MSS. Each loss adds its repair time to the
  message's delivery; the re-sent segment's serialisation is not charged to the link (one MSS).

:class:`TcpSender` holds one hop's state; the DES and the real-path emulator call the same
``send`` per message, and the analytical engine runs it on a periodic message train
(:func:`periodic_busy_ms`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np

LOSSY_PREFILLS = 128  # requests followed when losses keep moving the window


@dataclasses.dataclass(frozen=True)
class TcpParams:
    mss_bytes: int = 1448
    initial_window_segments: int = 10
    max_window_bytes: float = 4 * 1024 * 1024
    restart_after_idle: bool = True
    idle_restart: str = "initial_window"  # or "halve_per_rto" (module docstring)


def tcp_params(network) -> TcpParams | None:
    """The scenario's ``network.tcp`` as TcpParams when ``network.transport`` is tcp, else None."""
    if network.transport != "tcp":
        return None
    t = network.tcp
    return TcpParams(
        t.mss_bytes,
        t.initial_window_segments,
        t.max_window_bytes,
        t.restart_after_idle,
        t.idle_restart,
    )


MAX_CYCLE = 6  # the longest cycle of busy times a settled train is looked for in


class TcpSender:
    """One hop's sender state: cwnd, ssthresh, in-flight segments' ACK times, last send."""

    __slots__ = (
        "acks",
        "bandwidth_mbps",
        "cwnd",
        "last_sent_ms",
        "params",
        "rto_ms",
        "rtt_ms",
        "ssthresh",
        "stall_hop",
        "stall_log",
    )

    def __init__(self, params: TcpParams, bandwidth_mbps: float, latency_ms: float, rto_ms: float):
        self.params = params
        self.bandwidth_mbps = bandwidth_mbps
        self.rtt_ms = 2.0 * latency_ms
        self.rto_ms = rto_ms
        self.cwnd = float(params.initial_window_segments * params.mss_bytes)
        self.ssthresh = math.inf
        self.acks: deque[tuple[float, int]] = deque()  # (ack time, bytes) of segments in flight
        self.last_sent_ms = -math.inf
        self.stall_log: list | None = None  # (hop, from, to) of window stalls (a timeline)
        self.stall_hop = 0

    def _ack_until(self, t: float) -> int:
        """Process the ACKs that arrived by ``t`` (window growth); returns the bytes acked."""
        p = self.params
        acks = self.acks
        acked = 0
        while acks and acks[0][0] <= t:
            _, nbytes = acks.popleft()
            acked += nbytes
            if self.cwnd < self.ssthresh:
                self.cwnd += nbytes
            else:
                self.cwnd += p.mss_bytes * nbytes / self.cwnd
            if self.cwnd > p.max_window_bytes:
                self.cwnd = p.max_window_bytes
        return acked

    def in_flight(self) -> int:
        return sum(b for _, b in self.acks)

    def idle_ms(self, start_ms: float) -> float:
        """How long the sender will have sent nothing when a message starts at ``start_ms``
        (inf before its first send): what decides the window's restart after idle."""
        return start_ms - self.last_sent_ms

    def restarts(self, start_ms: float) -> bool:
        """Whether a message starting at ``start_ms`` restarts from the initial window: restart
        after idle is on, every segment is acknowledged by then, and the sender idled longer
        than the RTO. No state changes."""
        acks = self.acks
        return (
            self.params.restart_after_idle
            and (not acks or acks[-1][0] <= start_ms)
            and self.idle_ms(start_ms) > self.rto_ms
        )

    def restart_margin_ms(self, idle_ms: float) -> float:
        """How far an idle of ``idle_ms`` lies from the nearest instant at which the restart
        would decide otherwise: the RTO (``initial_window``), or the nearest whole number of
        RTOs, one or more (``halve_per_rto``: each is one halving more)."""
        k = 1.0
        if self.params.idle_restart == "halve_per_rto":
            k = max(1.0, float(round(idle_ms / self.rto_ms)))
        return abs(idle_ms - k * self.rto_ms)

    def restarted_cwnd(self, idle_ms: float) -> float:
        """The window after ``idle_ms`` of idle past the RTO: the initial window (no more than
        cwnd: ``initial_window``), or cwnd halved once for every RTO the idle lasts beyond the
        first, never below that (``halve_per_rto``: Linux's tcp_cwnd_restart, which also
        raises ssthresh to 3/4 of the old cwnd, so the window slow-starts back there)."""
        p = self.params
        restart = min(self.cwnd, float(p.initial_window_segments * p.mss_bytes))
        if p.idle_restart == "initial_window":
            return restart
        self.ssthresh = max(self.ssthresh, 0.75 * self.cwnd)
        segments, left = int(self.cwnd // p.mss_bytes), idle_ms - self.rto_ms
        while left > 0 and segments * p.mss_bytes > restart:  # (whole segments, as Linux)
            segments >>= 1
            left -= self.rto_ms
        return max(float(segments * p.mss_bytes), restart)

    def send(self, start_ms: float, n_bytes: float, losses: int) -> tuple[float, float]:
        """(busy_ms, repair_ms): the message's bytes leave from ``start_ms`` (the link free)
        until ``start_ms + busy_ms``; its losses delay delivery by ``repair_ms`` more."""
        p = self.params
        mss = p.mss_bytes
        self._ack_until(start_ms)
        if self.restarts(start_ms):
            self.cwnd = self.restarted_cwnd(self.idle_ms(start_ms))
        ms_per_byte = 8.0 / (self.bandwidth_mbps * 1e3)
        remaining = max(math.ceil(n_bytes), 1)
        t = start_ms
        flight = self.in_flight()
        while remaining > 0:
            seg = mss if remaining > mss else remaining
            while flight + seg > self.cwnd and self.acks:  # window full: wait for the next ACK
                if self.acks[0][0] > t:
                    if self.stall_log is not None:
                        self.stall_log.append((self.stall_hop, t, self.acks[0][0]))
                    t = self.acks[0][0]
                flight -= self._ack_until(t)
            t += seg * ms_per_byte
            self.acks.append((t + self.rtt_ms, seg))
            flight += seg
            remaining -= seg
        self.last_sent_ms = t
        repair = 0.0
        for _ in range(losses):
            half = max(flight / 2.0, 2.0 * mss)
            if self.cwnd >= 4 * mss:  # fast retransmit after three duplicate ACKs
                repair += self.rtt_ms + mss * ms_per_byte
                self.ssthresh = self.cwnd = half
            else:  # retransmission timeout
                repair += self.rto_ms + mss * ms_per_byte
                self.ssthresh = half
                self.cwnd = float(mss)
        return t - start_ms, repair


def periodic_busy_ms(
    params: TcpParams,
    bandwidth_mbps: float,
    latency_ms: float,
    rto_ms: float,
    n_bytes: float,
    period_ms: float,
    messages: int = 64,
) -> float:
    """Mean busy time of a message of ``n_bytes`` in a lossless train offered every
    ``period_ms`` (the sync schedule's one frame per lap), once the train has settled: over
    the last cycle the busy times repeat with (up to :data:`MAX_CYCLE` messages; one where the
    window saturates at max_window_bytes or restarts every message), else the last of
    ``messages``. A train whose busy time nearly fills the period idles past the RTO only
    every few messages (hunt seed 902031, 244 kB every 242 ms on a 30 ms hop: 240, 58, 2 ms
    again and again, mean 100; its last message alone said 240). An infinite period: a cold
    connection (the initial window)."""
    sender = TcpSender(params, bandwidth_mbps, latency_ms, rto_ms)
    if not math.isfinite(period_ms):  # one message on a cold connection
        return sender.send(0.0, n_bytes, 0)[0]
    busy = [b for b, _ in periodic_train(sender, n_bytes, period_ms, messages)]
    if not busy:
        return 0.0
    cycle = settled_cycle(busy)
    return busy[-1] if cycle <= 1 else math.fsum(busy[-cycle:]) / cycle


def open_window_busy_ms(
    params: TcpParams, bandwidth_mbps: float, latency_ms: float, rto_ms: float, n_bytes: float
) -> float:
    """Busy time of a message of ``n_bytes`` on a connection whose window is as wide as it
    gets (``max_window_bytes``) with nothing in flight: its serialisation, and a round trip
    per further window where the message is bigger than one. No message can leave faster
    (the least window cost; :func:`periodic_busy_ms` with an infinite period is the most)."""
    sender = TcpSender(params, bandwidth_mbps, latency_ms, rto_ms)
    sender.cwnd = float(params.max_window_bytes)
    sender.last_sent_ms = 0.0  # (sent just now: no restart after idle)
    return sender.send(0.0, n_bytes, 0)[0]


def settled_cycle(values: list[float]) -> int:
    """The shortest c <= :data:`MAX_CYCLE` with which the last 3c values repeat (each equal to
    the one c before it, to 1e-9 relative); 0 when none."""
    for c in range(1, MAX_CYCLE + 1):
        if 3 * c > len(values):
            break
        tail = values[-3 * c :]
        if all(abs(tail[i] - tail[i + c]) <= 1e-9 * max(abs(tail[i]), 1.0) for i in range(2 * c)):
            return c
    return 0


def periodic_train(
    sender: TcpSender, n_bytes: float, period_ms: float, messages: int, lost=frozenset()
):
    """(busy, repair) ms of each of ``messages`` messages of ``n_bytes`` offered every
    ``period_ms`` on ``sender``, each sent when the one before has left (the messages whose
    index is in ``lost`` lose one transmission)."""
    free = 0.0
    for i in range(messages):
        start = max(i * period_ms, free)
        busy, repair = sender.send(start, n_bytes, 1 if i in lost else 0)
        free = start + busy
        yield busy, repair


def prefill_busy_ms(
    params: TcpParams,
    bandwidth_mbps: float,
    latency_ms: float,
    rto_ms: float,
    prefill_bytes: float,
    verify_bytes: float,
    period_ms: float,
    requests: int,
    frames_per_request: int,
    to_first_frame_ms: float | None = None,
    to_prefill_ms: float | None = None,
    simulated: int = 16,
    loss_rate: float = 0.0,
) -> float:
    """Mean busy time of the requests' prefill messages on a hop that carries one frame per
    lap (the sync schedule, one request at a time): request after request on one connection,
    each a prefill, its first frame ``to_first_frame_ms`` after the prefill left (start to
    start; default one period), then ``frames_per_request`` frames of ``verify_bytes`` one
    ``period_ms`` apart, and the next request's prefill ``to_prefill_ms`` after the last frame
    (default one period). So the first prefill leaves from the initial window, a later one
    from what the previous requests left (the initial window again when the sender idled past
    the RTO and ``restart_after_idle``; else the window the previous prefills opened). The
    first ``simulated`` requests are run; the rest repeat the last (with ``loss_rate``: the
    mean over the first ``LOSSY_PREFILLS``). ``loss_rate``: the messages lose a transmission at that
    rate, spread evenly (E[G] = q / (1 - q) per message, as :func:`lossy_train_costs_ms`), so
    a prefill meets the window the losses before it left."""
    first = period_ms if to_first_frame_ms is None else to_first_frame_ms
    gap = period_ms if to_prefill_ms is None else to_prefill_ms
    sender = TcpSender(params, bandwidth_mbps, latency_ms, rto_ms)
    losses = loss_rate / (1.0 - loss_rate)
    if losses > 0:  # the losses keep moving the window: follow the run further
        simulated = max(simulated, LOSSY_PREFILLS)
    runs = max(min(int(requests), simulated), 1)
    due = 0.0

    def lost() -> int:
        nonlocal due
        due += losses
        if due >= 1.0:
            due -= 1.0
            return 1
        return 0

    pre, total, t = 0.0, 0.0, 0.0
    for _ in range(runs):
        pre = sender.send(t, prefill_bytes, lost())[0]
        total += pre
        held, step = pre, first
        for _ in range(max(int(frames_per_request), 1)):  # one frame per lap
            t += max(step, held)
            held = sender.send(t, verify_bytes, lost())[0]
            step = period_ms
        t += max(gap, held)
    if losses > 0:
        return total / runs
    return (total + (max(int(requests), 1) - runs) * pre) / max(int(requests), 1)


def lossy_train_costs_ms(
    params: TcpParams,
    bandwidth_mbps: float,
    latency_ms: float,
    rto_ms: float,
    n_bytes: float,
    period_ms: float,
    loss_rate: float,
    max_messages: int = 2048,
    run_messages: int | None = None,
) -> tuple[float, float]:
    """(mean busy time, mean repair time) per message of ``n_bytes`` in a train offered every
    ``period_ms`` whose messages lose a transmission at ``loss_rate`` (E[G] = q / (1 - q)
    losses per message): the losses are spread evenly, one every 1 / E[G] messages, from the
    settled lossless train on; the means are taken over the messages from the first loss on
    (a loss leaves ssthresh at half the flight, and the windows after it grow from there: the
    train's degraded regime, which the DES's sender reaches too). At most ``max_messages``
    are run. A run of ``run_messages`` that expects fewer than one loss per such stretch
    (rare losses): one loss's excess busy time after it, e_j at j messages on, weighted by
    where the run's first loss falls (at rate E[G] per message, from the run's start), so the
    mean over the run's n messages is (1 / n) sum_m sum_(i <= m) E[G] (1 - E[G])^i e_(m - i)
    (a window a loss shrank does not recover within the run: its later messages all pay)."""
    sender = TcpSender(params, bandwidth_mbps, latency_ms, rto_ms)
    settle = 32
    losses = loss_rate / (1.0 - loss_rate)
    if not math.isfinite(period_ms):  # every message on an idle connection
        period_ms = 1e12
    room = max_messages - settle
    if run_messages is not None:
        room = max(1, min(room, int(run_messages)))
    k = min(8, int(room * losses))
    if k >= 1:  # k losses at settle + round((j + 1/2) / E[G]) over round(k / E[G]) messages
        stretch = max(round(k / losses), 1)
        at = {settle + round((j + 0.5) / losses) for j in range(k)}
    else:  # rarer: one loss at the stretch's start, its excess weighted by where it falls
        k, stretch, at = 1, room, {settle}
    busy_sum, repair_sum, settled = 0.0, 0.0, 0.0
    excess = []
    train = periodic_train(sender, n_bytes, period_ms, settle + stretch, at)
    for i, (busy, repair) in enumerate(train):
        if i == settle - 1:
            settled = busy
        if i >= settle:
            busy_sum += busy
            repair_sum += repair
            excess.append(busy - settled)
    per_loss = repair_sum / k
    if stretch == room and k == 1 and run_messages is not None:
        e = np.asarray(excess, dtype=float)  # e_j: j messages after the loss
        n = len(e)
        first = losses * (1.0 - losses) ** np.arange(n)  # the first loss i messages in
        behind = np.convolve(first, e)[:n]  # message m: the first loss at i <= m, e_(m - i)
        return settled + float(behind.sum()) / n, per_loss * losses
    if stretch == room and k == 1:
        return settled + (busy_sum - stretch * settled) * losses, per_loss * losses
    return busy_sum / stretch, per_loss * losses
