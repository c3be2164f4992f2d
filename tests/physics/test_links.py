"""The shared link rule (wansim.links): hand-worked deliveries, and the engines' expectations of
it against Monte Carlo through the DES's own link."""

from __future__ import annotations

import numpy as np
import pytest

from wansim.config.network import Hop, Jitter
from wansim.links.delivery import HopSender, busy_ms, software_ms, wire_ms
from wansim.links.draws import hop_streams, ring_seeds
from wansim.links.expected_delay import hop_mean_ms
from wansim.sim.kernel import Kernel
from wansim.sim.link import Link


def test_a_retransmission_pays_serialisation_again_hand_worked():
    # 1250 B at 1 Mbit/s = 10 ms per transmission; 2 lost transmissions, rto 100 ms, L = 50 ms
    assert wire_ms(1250, 1.0) == pytest.approx(10.0)
    busy = busy_ms(1250, 1.0, 0.0, 0.0, 2)
    assert busy == pytest.approx(30.0)  # three transmissions occupy the link
    hop = HopSender(1.0, 0.0, 0.0, 100.0, 50.0)
    hop.free_ms = 8.0  # a message before it holds the sender until 8 ms
    start, free, delivery = hop.send(5.0, 1250, 2, 50.0)
    assert (start, free, delivery) == pytest.approx((8.0, 38.0, 38.0 + 200.0 + 50.0))
    assert hop.wire_bytes(1250, 2) == 3 * 1250
    # FIFO: a message offered next, without loss and with no latency, is not delivered before
    start, free, delivery = hop.send(5.0, 1250, 0, 0.0)
    assert (start, free, delivery) == pytest.approx((38.0, 48.0, 288.0))


def test_software_cost_is_paid_once_and_holds_the_sender():
    # 3 ms per message + 2 ms per MB: a 500 kB message costs 3 + 1 = 4 ms of software
    assert software_ms(500_000, 3.0, 2.0) == pytest.approx(4.0)
    # at 100 Mbit/s the 500 kB take 40 ms per transmission; one loss re-sends only the bytes
    assert busy_ms(500_000, 100.0, 3.0, 2.0, 1) == pytest.approx(4.0 + 2 * 40.0)


def test_rule_is_the_same_on_floats_and_arrays():
    n = np.array([1e3, 1e5])
    arr = busy_ms(n, 40.0, 2.0, 1.5, np.array([0.0, 0.25]))
    one = [busy_ms(float(b), 40.0, 2.0, 1.5, g) for b, g in zip(n, [0, 0.25], strict=True)]
    assert arr == pytest.approx(one)


@pytest.mark.parametrize(
    "hop",
    [
        Hop(20.0, 40.0, Jitter(kind="lognormal", std_ms=4.0), 0.1, 150.0),
        Hop(5.0, 10.0, Jitter(kind="normal", std_ms=8.0), 0.3, 60.0),
    ],
    ids=["lognormal-10%", "normal-30%"],
)
def test_des_link_mean_one_way_is_the_analytical_expectation(hop):
    """Idle hop (messages far apart): the DES link's mean one-way time, run through the shared
    rule with its own draws, against hop_mean_ms (the engines' closed form of the same rule)."""
    n_bytes, count = 20_000.0, 20_000
    env = Kernel()
    log: list = []
    link = Link(env, 0, hop, lambda _p: None, *hop_streams(ring_seeds(7, 1), 0), log)
    for i in range(count):
        link.send([], n_bytes, 0.0, offer_ms=i * 1e4)
    one_way = np.array([r[4] - r[1] for r in log])
    se = one_way.std() / np.sqrt(count)
    assert abs(one_way.mean() - float(hop_mean_ms(*_fields(hop), n_bytes))) < 5 * se


def _fields(hop):
    return hop.latency_ms, hop.bandwidth_mbps, hop.jitter, hop.loss_rate, hop.retransmit_ms
