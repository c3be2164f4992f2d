"""The delivery rule of one message on one hop (the DES, the analytical engine and the emulator).

A message of ``b`` bytes is offered to hop h at time ``t``; the hop's sender is free from ``f``:

    start    = max(t, f)                                   FIFO: it waits for the sender (TCP)
    software = per_message_ms + codec_ms_per_mb * b / 1e6  framing, codec, sidecar: paid once
    wire     = b * 8 / B                                   one transmission's serialisation
    busy     = software + (1 + G) * wire                   every transmission occupies the link
    free     = start + busy                                the next message may start
    delivery = max(free + G * rto + max(0, L + J), previous delivery on this hop)

G is the number of lost transmissions of the message (geometric, P(G = g) = q^g (1 - q) for a
loss rate q), ``rto`` the wait before each retransmission, L the latency, J the jitter
(:mod:`wansim.links.draws` draws G and max(0, L + J) once per message, never per frame).
Propagation does not occupy the link: the next message may start as soon as ``free``. No
overtaking: a message is never delivered before the one sent before it.

A retransmission pays serialisation again. On a TCP-like link loss is recovered by sending the
lost bytes again: the copy crosses the same bottleneck, occupies it for its serialisation time
(delaying every message queued behind it) and the receiver cannot deliver the message until that
copy has arrived. Charging serialisation once would make a retransmission free of bandwidth,
which understates both the delay of the lost message and the queueing behind it exactly where
loss matters (a 100 kB activation at 40 Mbit/s serialises in 20 ms). The model loses whole
messages (one loss draw per message, as in the engines); real TCP re-sends only the lost
segment, so for messages of many segments at a per-packet loss rate this rule over-charges: set
``loss_rate`` to the per-message rate (about 1 - (1 - p)^segments for a packet loss rate p).

The software cost is the sender's own work before the bytes go out; it occupies the sender (the
next message waits for it, as a single sender thread or sidecar process does) and is not paid
again by a retransmission (the transport re-sends bytes already framed and encoded).

Expected values on an idle hop (the analytical engine; G's mean is q / (1 - q)):

    E[busy]     = software + (1 + E[G]) * wire
    E[one-way]  = E[busy] + rto * E[G] + E[max(0, L + J)]
"""

from __future__ import annotations


def wire_ms(n_bytes, bandwidth_mbps):
    """One transmission's serialisation: ``n_bytes`` at ``bandwidth_mbps`` Mbit/s (ms).
    Plain arithmetic: floats (DES, emulator) or numpy arrays (analytical) alike."""
    return n_bytes * 8.0 / (bandwidth_mbps * 1e3)


def software_ms(n_bytes, per_message_ms, codec_ms_per_mb):
    """The sender's fixed per-message cost plus its codec cost per 10^6 bytes (ms)."""
    return per_message_ms + codec_ms_per_mb * n_bytes / 1e6


def busy_ms(n_bytes, bandwidth_mbps, per_message_ms, codec_ms_per_mb, losses):
    """How long a message holds its hop's sender: software + (1 + losses) * wire (ms).
    ``losses`` is the message's count (DES, emulator) or its expectation (analytical: busy is
    linear in the count, so its expectation is exact)."""
    return software_ms(n_bytes, per_message_ms, codec_ms_per_mb) + wire_ms(
        n_bytes, bandwidth_mbps
    ) * (1.0 + losses)


def deliver(
    offer_ms: float,
    free_ms: float,
    last_delivery_ms: float,
    busy: float,
    losses: int,
    retransmit_ms: float,
    propagation_ms: float,
) -> tuple[float, float, float]:
    """(start, free, delivery) of one message (module docstring); ``busy`` from
    :func:`busy_ms` with the message's own loss count, ``propagation_ms`` = max(0, L + J)."""
    start = free_ms if free_ms > offer_ms else offer_ms
    free = start + busy
    delivery = free + propagation_ms
    if losses:
        delivery += losses * retransmit_ms
    if delivery < last_delivery_ms:
        delivery = last_delivery_ms
    return start, free, delivery
