"""``network.tcp.idle_restart: halve_per_rto`` against Linux's own TCP: the window after an
idle past the RTO is halved once per RTO beyond the first, down to the initial window
(tcp_cwnd_restart, RFC 2861), where ``initial_window`` restarts from the initial window at
once (RFC 5681 section 4.1). Checked against numbers measured with reno on this machine
kind's loopback (hand-worked from them), against the kernel live where it allows it, and the
two engines against each other."""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from wansim.analytical import analyze
from wansim.config.scenario import load_scenario
from wansim.errors import ScenarioError
from wansim.links.tcp import TcpParams, TcpSender
from wansim.sim import simulate

MSS = 1448
RTO_MS = 204.0  # the loopback connection's RTO (TCP_INFO: tcpi_rto 204,000 us)

# measured 2026-12-07 on this machine kind (kernel 6.18, reno on loopback, TCP_INFO before the
# idle and after one byte sent after it): cwnd segments before, idle ms -> cwnd after
MEASURED = [(72, 250, 36), (83, 350, 41), (108, 450, 27), (162, 650, 20), (100, 850, 10)]


def sender(idle_restart: str) -> TcpSender:
    return TcpSender(TcpParams(MSS, 10, 1e9, True, idle_restart), 1e5, 0.01, RTO_MS)


@pytest.mark.parametrize(("before", "idle_ms", "after"), MEASURED)
def test_halving_per_rto_reproduces_the_kernels_windows(before, idle_ms, after):
    """Each measured row: ceil(idle / RTO) - 1 halvings of the segment count (72 -> 36 after
    1.2 RTOs, 162 -> 20 after 3.2), never below the initial window (100 -> 6 -> 10 after
    4.2), and ssthresh raised to 3/4 of the old window; ``initial_window`` gives 10 segments
    for every row."""
    halving = sender("halve_per_rto")
    halving.cwnd, halving.ssthresh = before * MSS, 20.0 * MSS  # (an earlier loss's ssthresh)
    assert halving.restarted_cwnd(idle_ms) == after * MSS
    assert halving.ssthresh == max(20.0, 0.75 * before) * MSS  # slow start back to 3/4 of it
    reset = sender("initial_window")
    reset.cwnd = before * MSS
    assert reset.restarted_cwnd(idle_ms) == 10 * MSS


def test_a_send_after_idle_takes_the_restarted_window():
    """Through ``send``: 4 frames of 1 MB (each from a window the last one grew) then one after
    1.7 RTOs of idle leaves from half the window (one halving) and so in fewer round trips than
    from the initial window."""
    costs = {}
    for mode in ("initial_window", "halve_per_rto"):
        s = TcpSender(TcpParams(MSS, 10, 4 * 2**20, True, mode), 1000.0, 20.0, 200.0)
        t = 0.0
        for _ in range(4):
            t += s.send(t, 1e6, 0)[0] + 50.0
        costs[mode] = s.send(t + 340.0, 1e6, 0)[0]
    # 1 MB = 691 segments: from 10 it takes 6 round trips of 40 ms; from half a window of
    # several hundred segments, at most 1
    assert costs["initial_window"] >= 5 * 40.0
    assert costs["halve_per_rto"] <= 40.0 + 1e6 * 8 / 1e6 + 1e-6


def test_the_restart_margin_is_the_distance_to_the_next_decision():
    """What the analytical walk's restart-on-the-edge check reads: 350 ms of idle on a 204 ms
    RTO is 146 ms past the one decision of ``initial_window``, but 58 ms short of the second
    halving of ``halve_per_rto`` (at 2 RTOs); 100 ms is 104 ms short of the first in both."""
    assert sender("initial_window").restart_margin_ms(350.0) == pytest.approx(146.0)
    assert sender("halve_per_rto").restart_margin_ms(350.0) == pytest.approx(58.0)
    for mode in ("initial_window", "halve_per_rto"):
        assert sender(mode).restart_margin_ms(100.0) == pytest.approx(104.0)


def test_idle_restart_is_validated_and_named(run_cli):
    """A value outside the two: ScenarioError naming the field, and from the command line
    exit 2 with that one line."""
    data = {"stages": 2, "network": {"transport": "tcp", "tcp": {"idle_restart": "linux"}}}
    with pytest.raises(ScenarioError, match=r"^network.tcp.idle_restart: must be one of"):
        load_scenario(data=data)
    path = ROOT / "scenarios" / "tcp-ring-frame-per-lap.yaml"
    code, out, err = run_cli("run", path, "--set", "network.tcp.idle_restart=linux")
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "network.tcp.idle_restart" in err and "linux" in err


def _kernel_reno() -> str | None:
    """Why a live check cannot run here, or None."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "TCP_INFO"):
        return "needs Linux's TCP_INFO"
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
    idle = Path("/proc/sys/net/ipv4/tcp_slow_start_after_idle")
    try:
        if "reno" not in allowed.read_text().split() or idle.read_text().strip() != "1":
            return "reno not allowed, or tcp_slow_start_after_idle off"
    except OSError:
        return "cannot read the kernel's TCP settings"
    return None


def _cwnd_and_rto(s: socket.socket) -> tuple[int, float]:
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    rto_us = struct.unpack_from("I", info, 8)[0]
    cwnd = struct.unpack_from("I", info, 80)[0]  # tcpi_snd_cwnd (segments)
    return cwnd, rto_us / 1000.0


@pytest.mark.skipif(_kernel_reno() is not None, reason=str(_kernel_reno()))
@pytest.mark.parametrize("rtos", [1.5, 2.5, 3.5])
def test_the_kernels_window_after_idle_is_the_models(rtos):
    """Live, on loopback with reno: grow a window with 12 MB, idle ``rtos`` RTOs (midway
    between the kernel's decision points), send a byte, read the window; the model from the
    same window and the measured idle gives the same segment count."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def drain():
        conn, _ = server.accept()
        while conn.recv(1 << 20):
            pass

    threading.Thread(target=drain, daemon=True).start()
    s = socket.socket()
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.connect(server.getsockname())
        for _ in range(20):
            s.sendall(b"x" * 600_000)
        time.sleep(0.03)  # every ACK in
        before, rto = _cwnd_and_rto(s)
        start = time.monotonic()
        time.sleep(rtos * rto / 1000.0)
        s.sendall(b"y")
        idle = (time.monotonic() - start) * 1000.0
        after, _ = _cwnd_and_rto(s)
    finally:
        s.close()
        server.close()
    assert before > 10  # the window grew

    def model(idle_ms: float) -> float:
        m = TcpSender(TcpParams(MSS, 10, 1e9, True, "halve_per_rto"), 1e5, 0.01, rto)
        m.cwnd = before * MSS
        return m.restarted_cwnd(idle_ms)

    # the kernel's idle runs from its last segment (sent before the 30 ms wait) to the byte:
    # between ours and ours + 30 ms (both ends agree unless a decision point lies between)
    assert after * MSS in {model(idle), model(idle + 30.0)}, (before, idle, rto, after)
    assert after < before  # halved at least once (1.5 RTOs and more)


def test_both_engines_follow_the_halving_one_frame_per_lap():
    """The frame-per-lap ring (one request, laps ~470 ms from the initial window: each hop
    idles ~1.7 RTOs between frames): halving once keeps most of the window, so a 131 kB frame
    needs about one round trip where the initial window's needs three; the lap then falls
    below the RTO and the windows stay open (112 against 469 ms). Both engines run the same
    sender: the laps agree exactly, and the halving's lap is shorter by at least a round trip
    on each of the 3 forward hops."""
    path = ROOT / "scenarios" / "tcp-ring-frame-per-lap.yaml"
    laps = {}
    for mode in ("initial_window", "halve_per_rto"):
        sc = load_scenario(path, [f"network.tcp.idle_restart={mode}", "workload.requests=6"])
        answer = analyze(sc)
        des, ana = simulate(sc).metrics["lap_ms_mean"], answer.metrics["lap_ms_mean"]
        assert des == pytest.approx(ana, rel=1e-9), mode
        laps[mode] = ana
        halving = mode == "halve_per_rto"  # (not on the approximation grid: named)
        assert answer.approximation["validated"] is not halving
        assert ("idle_restart halve_per_rto" in answer.approximation.get("why", "")) is halving
    assert laps["halve_per_rto"] < laps["initial_window"] - 3 * 40.0
