"""S0's mailbox under async in-pipe speculation (without the overlapped drafter), loaded by N
requests: the queue where each request holds at most one item, its next block (or its
prefill), waiting or in service (:mod:`wansim.sim.async_speculation`: S0 creates a request's
next block when it finishes the last one, drops it when a lost bet is heard, and queues the
restart at the back).

- :func:`mailbox_wait`: the mean wait there once S0 saturates, by Little's law at S0. A
  queueing formula for Poisson arrivals (:func:`wansim.analytical.concurrent.ring_waits`) gives
  about half of it, and spreading the closed ring's missing residence over every visit
  (the saturation excess) charges the prefill the queue twice.
- :func:`queue_wait_spread`: how that wait is spread, for the stale blocks it decides (the
  blocks S0 starts before a lost bet is heard). A saturated round robin's wait hardly moves;
  a lightly loaded queue's is exponential.

Measured against the DES (agreement hunt seed 3816: 2 stages of 12.6 ms, a 75 ms lap, K = 3,
window 4): 16 requests, TTFT +81% -> +14%; at alpha 0.7, 16 requests, tokens/s -27% -> -1%; 4
requests, a served block waits 30.5 ms on average in the DES and 29.9 ms here (tokens/s
-24% -> -18%: the stale blocks are a step function of the wait, near a step there).
"""

from __future__ import annotations

import numpy as np

MAILBOX_BISECTIONS = 80  # halvings of [0, residence / V]: far below a nanosecond


def mailbox_wait(
    residence_ms, travel_ms, tail_ms, visits, service_ms, passes, lost_bets, window
) -> np.ndarray:
    """The mean wait (ms) of an item in S0's saturated mailbox.

    A request holds one item there all the time except while its prefill's first token
    travels back (``travel_ms``: the prefill alone less its S0 service), while its last
    verdict travels (``tail_ms``) and while its window of B blocks is full: after S0 finishes
    a block, the oldest of the B in flight returns ``tail_ms`` less the B - 1 sojourns since.
    A lost bet is heard ``tail_ms`` after S0 finished the lost block and drops the item
    waiting since S0 finished the request's last block: after ``tail_ms`` if that was the
    lost one, half a sojourn on average if stale ones followed (min(tail, s / 2)); the restart
    queues at the back. With V items served (``visits``, the prefill's included) and L lost
    bets, Little's law per request reads

        residence - travel - tail = s V + L min(tail, s / 2) + passes max(0, tail - (B - 1) s) / B

    with s = wait + ``service_ms`` (the mean over the items). The right side increases in s
    (V >= passes), so the root is unique: found by bisection."""
    free = np.asarray(residence_ms, dtype=float) - travel_ms - tail_ms
    visits, lost = np.asarray(visits, dtype=float), np.asarray(lost_bets, dtype=float)
    b = np.asarray(window, dtype=float)

    def held(s):
        return (
            s * visits
            + lost * np.minimum(tail_ms, 0.5 * s)
            + passes * np.maximum(tail_ms - (b - 1.0) * s, 0.0) / b
        )

    lo = np.zeros(np.shape(free))
    hi = np.maximum(free / np.maximum(visits, 1e-300), 0.0)  # held(s) >= s V
    for _ in range(MAILBOX_BISECTIONS):
        mid = 0.5 * (lo + hi)
        low = held(mid) < free
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    return np.maximum(0.5 * (lo + hi) - service_ms, 0.0)


def queue_wait_spread(wait, others, service):
    """A block's wait in a queue where each of ``others`` requests holds at most one item of
    ``service`` ms, as (fixed, spread) ms: the wait is taken as fixed + Exp(mean spread).

    With L ~ Binomial(others, p) items ahead (p = wait / (others service), at most 1) the
    wait has variance (others p (1 - p) + 1/12) service^2 (the one in service leaves a uniform
    residue); spread is its sd, up to the mean, and fixed the rest. A lightly loaded queue
    comes out exponential (fixed 0), a saturated one nearly fixed (hunt seed 3816 at alpha
    0.7: an exponential wait started 1.7x the stale blocks the DES computes, tokens/s -27%)."""
    wait = np.asarray(wait, dtype=float)
    full = np.maximum(np.asarray(others, dtype=float) * service, 1e-300)
    p = np.clip(wait / full, 0.0, 1.0)
    sd = service * np.sqrt(others * p * (1.0 - p) + 1.0 / 12.0)
    spread = np.minimum(wait, sd)
    return wait - spread, spread
