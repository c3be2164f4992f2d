"""Approximation for N concurrent requests without batching (``workload.concurrency`` = N,
``schedule.batching: none``): each request's passes travel the pipe as their own messages and
queue FIFO behind other requests' at every stage and link. A closed network of N customers.

Assumptions (vectorised over grid points):

- Stations around the ring: S0, hop 0, S1, ..., S(P-1), the return hop (and, with an
  overlapped drafter, the drafter device before S0 / after S(P-1)). A request visits each with
  its prefill once and with each of its E[N] verify passes (plus the cancelled blocks of the
  block schedule, :mod:`wansim.analytical.blocks`); service is deterministic per class (compute
  of n or prompt tokens, serialisation of the message), propagation is a pure delay.
- Waiting at a station (per visit): G/D/1, W = c_a^2 s rho' / (2 (1 - rho')), s the verify
  pass's deterministic service and rho' the utilisation the arriving pass sees: that of the
  other N - 1 requests (the arrival theorem), so one request alone never waits. The
  arrivals' variability (:func:`arrival_scv`) is Poisson's where the links' jitter mixes the
  requests' phases every lap; on a ring without it a deterministic rotation locks, and
  requests of random length unsettle it once per request (a successor's prefill enters at a
  fresh phase), not once per lap.
- Prefill convoys: a prefill crosses the pipe slower than a verify pass (its compute and, on a
  slow link, its serialisation: a 512-token prefill holds a 1 Gbit/s hop ~60 ms) and links are
  FIFO, so a pass of another request that enters within that much behind it catches up and
  stays behind it to the last stage (:func:`convoy_wait`), if it is decoding when the prefill
  enters; this is most of the loss at 1 Gbit/s.
- A prefill's waits: a new request enters in the phase its predecessor leaves
  (``prefill_scv``: only the links' randomness mixes it with the others), which spares it the
  queues of a ring below capacity. A saturated bottleneck (N s > the lap alone: beyond a
  deterministic cyclic network's capacity) parks every customer whatever its phase: there the
  prefill waits at least what a verify pass waits, less the slot its predecessor leaves
  unused (a last-stage drafter drafts nothing after a request's last verdict: hunt seed 43,
  its 60 ms drafting the bottleneck, the prefill waits for no one). Agreement hunt seed
  3816's sync variant (16 requests on 2 stages of 12.6 ms over a 75 ms lap, 0.5 ms of
  jitter): TTFT -69% -> -31%. What the prefill parks there the decode does not: TTFT +
  decode stays N / X (Little).
- A long prefill idles a saturated bottleneck (sync): the other requests' passes are held
  behind it until it has passed (on its way to the bottleneck or after it), so the bottleneck
  serves each other request once and waits (:func:`prefill_trap_ms`); its capacity is
  1 / (D + that idle) requests per ms, and the residence the idle adds is the held passes'
  (the decode's), not a wait the prefill parks at the bottleneck.
- Closed loop: throughput X (requests/s) solves X = N / (TTFT(X) + decode(X)) with the waits
  added to every pass's lap (bisection; X < 1 / the bottleneck's demand per request); a
  request's decode rate is its rate alone times decode alone / decode loaded.
- ``throughput_tokens_per_s`` in the DES is measured over the makespan of
  ``workload.requests`` requests run through N slots: the slowest slot finishes last. The
  makespan is taken as (R / N) residence + X (decode per pass) (1 - rho_max), with X the
  slowest slot's passes beyond the mean (:func:`slowest_excess`: exact over the difficulty
  mixture for one round, its skew kept for more) and rho_max the bottleneck's utilisation (a
  saturated bottleneck is work-conserving: the slots' spread does not lengthen the run).
- Block schedule (async) on the ring: its stale blocks load the stations too; a request's
  blocks wait in S0's queue behind other requests', so fewer are started before a loss is heard
  (the stale counts are recomputed with S0's wait, spread as :mod:`wansim.analytical.s0_mailbox`
  says, as a fixed point found by bisection); a chain's time gains one lap's waits plus S0's
  wait per extra block; S0 hears a lost bet later by the waits after S0 (``verdict_wait``).
  S0's mailbox under async serves its items one after another: the stations after it see
  departures of c^2 (1 - rho_S0^2) c_a^2 (Whitt's QNA), and where it saturates every item
  there (the prefill's too) waits the round robin's wait
  (:func:`~wansim.analytical.s0_mailbox.mailbox_wait`) and nothing downstream queues for the
  prefill (hunt seed 3816: TTFT +81% -> +14%; at alpha 0.7, tokens/s -27% -> -1%).
"""

from __future__ import annotations

import functools

import numpy as np

from wansim.analytical.resequencing import Resequencing, delay_atoms
from wansim.analytical.s0_mailbox import mailbox_wait, queue_wait_spread
from wansim.numerics import normal_functions as nf
from wansim.speculation.block_schedule import flushes

BISECTION_STEPS = 60
CONVOY_SWEEPS = 30


def expected_max_normal(n) -> np.ndarray:
    """E[max of n standard normals] (Blom's approximation; 0 for n = 1)."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, nf.norm_ppf((n - 0.375) / (n + 0.25)), 0.0)


MAX_GRID = 512  # points of the passes axis for the slowest of b requests


def slowest_excess(w, n_mean, n_var, n_slots, rounds) -> np.ndarray:
    """E[max over b slots of (S - E[S])], S a slot's passes over ``rounds`` requests, each
    request's passes a mixture over difficulty nodes (weights ``w``, node means and variances
    on the last axis). One round: exactly, E[max] = x0 + int (1 - F(x)^b) dx with F the
    mixture of normals. More rounds: the normal part grows as sqrt(rounds) and the skew part
    stays (Cornish-Fisher: a quantile's skew term sigma_r gamma_r (z^2 - 1) / 6 does not
    depend on r), so e_b sd sqrt(rounds) + (excess(1) - e_b sd)."""
    w, mu, var = (np.asarray(x, dtype=float) for x in (w, n_mean, n_var))
    b = np.asarray(n_slots, dtype=float)
    mean = (w * mu).sum(axis=-1)
    sd = np.sqrt(np.maximum((w * (var + mu**2)).sum(axis=-1) - mean**2, 0.0))
    node_sd = np.sqrt(np.maximum(var, 1e-12))
    live = w > 0
    lo = np.min(np.where(live, mu - 8 * node_sd, np.inf), axis=-1)
    hi = np.max(np.where(live, mu + 8 * node_sd, -np.inf), axis=-1)
    t = np.linspace(0.0, 1.0, MAX_GRID)
    x = lo[..., None] + (hi - lo)[..., None] * t  # (..., G)
    cdf = (
        w[..., None, :] * nf.norm_cdf((x[..., None] - mu[..., None, :]) / node_sd[..., None, :])
    ).sum(-1)
    tail = 1.0 - np.clip(cdf, 0.0, 1.0) ** b[..., None]
    e_max = lo + np.trapezoid(tail, x, axis=-1)
    one = np.maximum(e_max - mean, 0.0)
    e_b = expected_max_normal(b)
    return np.where(b > 1, e_b * sd * np.sqrt(rounds) + (one - e_b * sd), 0.0)


def ring_waits(x, n_customers, s_d, s_p, v_d, v_p, arrival_scv=1.0):
    """Per station waiting time of a verify pass at request throughput ``x`` (per ms).

    Arrays (pts, S): service per verify visit / prefill visit, visits per request. G/D/1
    waiting (Kingman) W = c_a^2 s rho' / (2 (1 - rho')) with rho' the load of the other N - 1
    requests (the arrival theorem), s the verify pass's deterministic service and c_a^2
    (``arrival_scv``, per point) the arrivals' squared coefficient of variation: 1 (Poisson,
    M/D/1) when the requests' phases around the ring are mixed, 0 when nothing random moves
    them (:func:`arrival_scv`). The load counts both classes, the prefills' long services are
    the convoy's (:func:`convoy_wait`)."""
    rho = x[:, None] * (v_d * s_d + v_p * s_p)
    seen = rho * (n_customers[:, None] - 1.0) / n_customers[:, None]
    seen = np.minimum(seen, 0.999999)
    ca2 = np.asarray(arrival_scv, dtype=float)
    ca2 = ca2[:, None] if ca2.ndim else ca2
    wait = np.where(v_d > 0, ca2 * s_d * seen / (2.0 * (1.0 - seen)), 0.0)
    return wait, rho


def arrival_scv(lap_ms, lap_var_ms2, passes, passes_var, relocks=False, slack_ms=0.0) -> np.ndarray:
    """Squared coefficient of variation of the arrivals at a station of the ring, in [0, 1].

    N requests circulating a ring of FIFO stations with deterministic services lock into a
    rotation: if nothing random moves them, they arrive evenly spaced and never wait below
    the bottleneck's capacity (a deterministic cyclic network: X = min(N / lap, 1 / s_max)).
    Randomness mixes their phases. The laps' jitter and retransmissions move a request's phase
    by Var = E[N] Var(lap) over its life; once that reaches the variance of a uniform phase,
    lap^2 / 12, the arrivals are taken as Poisson (c_a^2 = 1, M/D/1); in between, linearly.
    Requests of random length (Var N) put each successor's prefill at a fresh phase, taken as
    mixing every lap (lap^2 Var N in the drift). On a ring whose laps nothing random moves,
    with one pass of each request in flight (``relocks``), that happens once per request: the
    newcomer queues on the laps it takes to find a free slot and the rotation then locks
    again, so the mixing spreads over the request's E[N] passes, min(1, 12 Var N) / E[N] of a
    lap's worth (hunt seed 4250: 8 requests of 22 passes without jitter, tokens/s -24% ->
    0%; 6 such rings of 4-11 users against the DES: -2.5% to +0.4%, against -4% to -11%).
    Randomness in the laps keeps the rotation from relocking once a lap moves a pass by about
    the rotation's slack at its bottleneck (``slack_ms``: lap / N - s_max, the idle between
    two requests' passes there; 0 for a saturated ring): in between, the every-lap mixing is
    weighted by min(1, Var(lap) / slack^2). The grid's loaded rings with 3 ms of jitter
    (Var(lap) >= 36 ms^2, 16-32 users whose passes leave the bottleneck no slack) queue as
    mixed every lap (the jitter's drift alone there: throughput up to +9% against the DES);
    the held-out real cells' per-message residue (sd ~0.1 ms a hop; 4 users, 4-5 ms of slack)
    leaves their rotation locked (the DES's tokens/s moves < 0.3% with it; mixed every lap,
    the analytical engine lay 7-13% under the DES).
    The block schedule's hunt points and rings whose stages fail (a fail-over re-prefills the
    requests in flight at a random instant) mix every lap."""
    lap = np.maximum(np.asarray(lap_ms, dtype=float), 1e-12)
    n = np.asarray(passes, dtype=float)
    lap_var = np.asarray(lap_var_ms2, dtype=float)
    per_life = 12.0 * n * lap_var / lap**2
    fresh = np.minimum(12.0 * np.asarray(passes_var, dtype=float), 1.0) / np.maximum(n, 1.0)
    every_lap = np.minimum(12.0 * np.asarray(passes_var, dtype=float), 1.0)
    slack2 = np.maximum(np.asarray(slack_ms, dtype=float), 0.0) ** 2
    unlocked = np.where(lap_var > 0.0, np.minimum(lap_var / np.maximum(slack2, 1e-300), 1.0), 0.0)
    relocked = fresh + unlocked * (every_lap - fresh)
    return np.clip(per_life + np.where(np.asarray(relocks), relocked, every_lap), 0.0, 1.0)


def convoy_wait(n, lap, slower, passes, decoding=1.0):
    """Per verify pass: the mean delay from riding behind other requests' prefills.

    A prefill crosses the pipe ``slower`` ms later than a verify pass would (its compute and
    serialisation exceed a pass's at every station), and links are FIFO: a pass of another
    request that enters S0 within ``slower`` ms behind it catches up and stays behind it to
    the last stage, losing ``slower - gap``. Each of the other N - 1 requests is decoding when
    the prefill enters with the share of its life it spends decoding (``decoding``: D /
    (TTFT + D), D its decode; it is prefilling itself otherwise, and no pass of it follows),
    and then has a pass at a uniform phase of its lap: one prefill costs them
    (N - 1) decoding (slower m - m^2 / 2) / lap in total, m = min(slower, lap), spread over
    the ``passes`` verify passes per request. (Hunt seed 369296, 2 requests of 3
    passes behind 56 ms prefills: counting every prefill as landing on a decode gave tokens/s
    -35% against the DES, and a shorter lap a longer convoy than it saved.)"""
    m = np.minimum(slower, lap)
    return decoding * (n - 1.0) * (slower * m - 0.5 * m**2) / (lap * passes)


def prefill_trap_ms(n, window_ms, lap_ms, neck_ms, cycle_ms) -> np.ndarray:
    """Per request: the time its prefill leaves the bottleneck idle on a sync ring.

    The prefill crosses the ring's other stations ``window_ms`` later than a verify pass would
    (``window_ms``: its excess over a pass at every station of its path but the bottleneck).
    Links and stages are FIFO, so the passes behind it are held until it has passed: those
    that enter the pipe after it until it reaches the bottleneck, those that leave the
    bottleneck after it until it ends. The bottleneck serves each other request once, the
    last of them by max(lap, (N - 1) s) (s: a pass's service there; the pass just ahead of the
    prefill comes round after its travel, lap - s; N - 1 queued ones take (N - 1) s), and
    then idles until they come back: max(0, window - s - max(0, (N - 1) s - lap)). Another
    prefill in flight releases its own convoy into that idle; taken as absent with the chance
    that none of the N - 1 others starts one within the window, exp(-(N - 1) window / cycle),
    cycle >= N s_D the request's cycle at the bottleneck's capacity. A saturated bottleneck
    then serves X = 1 / (D + idle) requests per ms where its waits alone would give 1 / D.
    Hunt seed 108 without jitter (2 requests of a tree on 10 stages behind 512-token
    prefills, the first stage's 60 ms drafting the bottleneck): tokens/s +15% against the
    DES; 2-4 requests behind 256-1024-token prefills, the DES's idle per request within 7% of
    this. The approximation grid's 16 users behind 1,800-token prompts, the last stage the
    bottleneck: throughput +15% / +16% -> +3% / +4% (tests/engines/test_concurrent_phases.py).
    Past s + (what the queue takes) + cycle / (N - 1) the chance falls faster than the idle
    grows; the window is held there, so a slower link never idles the bottleneck less."""
    n = np.asarray(n, dtype=float)
    others = np.maximum(n - 1.0, 0.0)
    window = np.asarray(window_ms, dtype=float)
    s = np.asarray(neck_ms, dtype=float)
    queued = np.maximum(others * s - np.asarray(lap_ms, dtype=float), 0.0)
    per_other = np.maximum(np.asarray(cycle_ms, dtype=float), 1e-12) / np.maximum(others, 1.0)
    window = np.minimum(window, s + queued + per_other)
    alone = np.exp(-window / per_other)
    return np.where(n > 1.0, np.maximum(window - s - queued, 0.0) * alone, 0.0)


def _settled(now: np.ndarray, before: np.ndarray) -> bool:
    """An iteration (a deterministic function of its state) whose state did not move by a
    bit: every further step repeats it, so stopping gives the full count's answer exactly."""
    return np.array_equal(now, before)


def _hol_groups(atoms, visits) -> list:
    """The hops with a resequencing wait, grouped by identical delay atoms and visit counts:
    a homogeneous ring's hops share one evaluation (the same numbers, computed once)."""
    groups: dict = {}
    for c, pair in enumerate(atoms):
        if not pair:
            continue
        key = (pair[0].tobytes(), pair[1].tobytes(), pair[0].shape, visits[:, c].tobytes())
        groups.setdefault(key, ([], pair))[0].append(c)
    return list(groups.values())


def solve(
    n_customers,
    alone,
    stations,
    *,
    chain_blocks=None,
    window=1,
    scv=1.0,
    convoy_share=1.0,
    prefill_scv=None,
):
    """Throughput and loaded times of N requests (module docstring).

    ``alone``: prefill_ms, decode_ms, passes (arrays); ``stations``: s_d, s_p, v_d, v_p and
    the masks ``decode_path``/``prefill_path`` (a pass on its lap / a prefill crosses the
    station). ``chain_blocks``: E[G] of the block schedule (valid blocks per chain; a chain's
    time gains one lap's waits plus S0's wait per extra block), None for sync.
    ``convoy_share``: the share of the other requests' prefills that land while a request
    continues (:func:`wansim.analytical.slots.synchrony`). ``prefill_scv``: the arrivals'
    c_a^2 a prefill sees (default ``scv``): a new request enters in the phase its predecessor
    leaves, so only the links' randomness mixes it with the others, not the requests'
    lengths (hunt seed 43, a deterministic ring: TTFT +85% -> 0%)."""
    n = np.asarray(n_customers, dtype=float)
    s_d, s_p, v_d, v_p = (stations[k] for k in ("s_d", "s_p", "v_d", "v_p"))
    dpath, ppath = stations["decode_path"], stations["prefill_path"]
    prefill, decode, passes = alone["prefill_ms"], alone["decode_ms"], alone["passes"]
    demand = v_d * s_d + v_p * s_p
    res_alone = prefill + decode
    slower = (np.maximum(s_p - s_d, 0.0) * ppath).sum(axis=1)
    messages = (v_d * ppath).max(axis=1)  # verify messages per request on the forward path
    eg = None if chain_blocks is None else np.maximum(chain_blocks, 1.0)
    neck = np.argmax(demand, axis=1)
    rows = np.arange(len(neck))
    neck_demand = demand[rows, neck]
    trap = np.zeros_like(n)
    if eg is None:  # (sync) the bottleneck idles while a prefill holds every other pass
        elsewhere = np.arange(demand.shape[1])[None, :] != neck[:, None]
        window = (np.maximum(s_p - s_d, 0.0) * ppath * elsewhere).sum(axis=1)
        cycle = np.maximum(n * neck_demand, res_alone)
        idle = prefill_trap_ms(n, window, decode / passes, s_d[rows, neck], cycle)
        trap = idle * np.broadcast_to(convoy_share, n.shape)
    cap = 1.0 / (neck_demand + trap)
    hi = np.minimum(n / res_alone, cap)
    lo = np.zeros_like(hi)
    # in-order links: the messages offered to a hop that can hold a request's pass are the
    # other requests' (its own in flight: one under sync; under the block schedule its own
    # blocks' holds are the stalls of the schedule alone, wansim.analytical.blocks.loss_stalls)
    own = (n - 1.0) / n
    hol = [
        (cols, Resequencing(values, weights))
        for cols, (values, weights) in _hol_groups(stations.get("delay_atoms", ()), v_d + v_p)
    ]

    # a prefill enters in the phase its predecessor leaves: only the links' randomness mixes
    # it with the others (prefill_scv), not the requests' lengths
    ratio = np.where(
        np.asarray(scv) > 0,
        np.asarray(prefill_scv if prefill_scv is not None else scv) / np.maximum(scv, 1e-300),
        1.0,
    )
    ratio = np.broadcast_to(ratio, n.shape)[:, None]
    rr_cols = np.broadcast_to(np.asarray(stations.get("round_robin", 0.0)) > 0, v_d.shape)

    def waits(x):
        """(a verify pass's wait, a prefill's, rho) per station at throughput x."""
        wait, rho = ring_waits(x, n, s_d, s_p, v_d, v_p, scv)
        # S0's mailbox (async) serves its items one after another, deterministic: the stations
        # after it see its departures, whose c^2 is (1 - rho_S0^2) c_a^2 (Whitt's QNA; a
        # saturated S0 spaces them evenly)
        smooth = np.where(rr_cols[:, 1:2] & ~rr_cols, 1.0 - np.minimum(rho[:, 1:2], 1.0) ** 2, 1.0)
        wait = wait * smooth
        # (S0's mailbox under async holds the others' blocks, in whatever phase: no ratio)
        pre_wait = np.where(rr_cols, wait, wait * ratio)
        for cols, resequencing in hol:
            offered = x * (v_d[:, cols[0]] + v_p[:, cols[0]]) * own
            extra = resequencing(offered)[:, None]
            wait[:, cols] = wait[:, cols] + extra
            pre_wait[:, cols] = pre_wait[:, cols] + extra
        return wait, pre_wait, rho

    def loaded(x, parts=False):
        # the prefill's own variability is the convoy's; the queues see verify passes only
        wait, pre_wait, rho = waits(x)
        lap_wait = (wait * dpath).sum(axis=1)
        if eg is not None:
            lap_wait = lap_wait / eg + wait[:, 0] * (1.0 - 1.0 / eg)
        lap = decode / passes + lap_wait
        pre = prefill + (pre_wait * ppath).sum(axis=1)
        for _ in range(CONVOY_SWEEPS):  # the convoy delay depends on the lap it lengthens
            decoding = passes * lap / (pre + passes * lap)
            conv = convoy_wait(n, lap, slower, messages, decoding) * messages / passes
            conv = conv * convoy_share
            lap, before = decode / passes + lap_wait + conv, lap
            if _settled(lap, before):  # a fixed point to the bit: the sweeps left repeat it
                break
        if parts:
            return lap_wait, conv, lap
        return pre, passes * lap, rho

    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        pre, dec, _ = loaded(mid)
        too_fast = mid * (pre + dec) > n
        hi, lo, before = np.where(too_fast, mid, hi), np.where(too_fast, lo, mid), (lo, hi)
        if _settled(lo, before[0]) and _settled(hi, before[1]):
            break  # no bound moved: every step left would repeat this one
    x = 0.5 * (lo + hi)
    pre, dec, rho = loaded(x)
    # Little: N requests in residence; at the bottleneck's capacity the waits the formulas
    # give no longer add up to it, the residence does
    residence = n / x
    excess = np.maximum(residence - pre - dec, 0.0)
    # the bottleneck's idle behind the prefills (N of them a cycle) is the decode's: its passes
    # wait held behind them, not parked at the bottleneck
    held = np.minimum(excess, n * trap)
    excess = excess - held
    # the rest queues at the bottleneck (a saturated closed network parks its customers
    # there): it is the wait per visit there, the prefill's visit included
    wait, pre_waits, _ = waits(x)
    visits = np.maximum(v_d[rows, neck] + v_p[rows, neck], 1e-300)
    per_visit = excess / visits
    wait[rows, neck] += per_visit
    # (sync) a new request enters in the slot its predecessor leaves: where that slot has
    # room the predecessor left unused there (a last-stage drafter's drafting after the last
    # verdict), its prefill parks that much less and the decode takes the rest of the
    # residence (hunt seed 43: 2 requests behind a 60 ms drafter, the DES's TTFT the prefill
    # alone; once the ring's arrivals relock the formulas' waits fall short of its
    # saturation, and parking the prefill too gave +71%)
    saturated = n * s_d[rows, neck] >= decode / passes
    freed = stations["skipped"][rows, neck]  # the slot the predecessor leaves unused
    pre_share = per_visit
    if eg is None:
        pre_share = np.where(saturated, np.maximum(per_visit - freed, 0.0), per_visit)
    pre = pre + pre_share * v_p[rows, neck]
    dec = dec + per_visit * v_d[rows, neck] + (per_visit - pre_share) * v_p[rows, neck] + held
    mailbox = rr_cols[rows, neck] & (excess > 0)
    if mailbox.any():
        # S0's mailbox saturated (async): the round robin's wait (:func:`mailbox_wait`, Little's
        # law at S0) for every item, the prefill's too, and no queue downstream of S0's
        # deterministic output. Reached continuously: the share theta of the way there is the
        # saturation excess per visit over the gap between the formulas' wait and it
        travel = prefill - s_p[rows, neck]  # the first token's way back
        not_neck = np.ones(ppath.shape, dtype=bool)
        not_neck[rows, neck] = False
        tail = travel - ((s_p - s_d) * ppath * not_neck).sum(axis=1)  # a verdict's way back
        service = demand[rows, neck] / visits
        w_sat = mailbox_wait(residence, travel, tail, visits, service, passes, passes / eg, window)
        kingman = wait[rows, neck] - per_visit
        gap = w_sat - kingman
        theta = np.where(gap > 0, np.clip(per_visit / np.where(gap > 0, gap, 1.0), 0, 1), 1.0)
        pre_wait = pre_waits * ppath
        at_neck = pre_wait[rows, neck]
        downstream = pre_wait.sum(axis=1) - at_neck
        pre_mail = prefill + (1.0 - theta) * downstream + at_neck + theta * (w_sat - at_neck)
        pre = np.where(mailbox, pre_mail, pre)
        dec = np.where(mailbox, residence - pre, dec)
        wait[rows, neck] = np.where(mailbox, kingman + theta * gap, wait[rows, neck])
    if eg is None:  # (sync) a saturated bottleneck parks every customer, whatever its phase
        parked = np.where(saturated, np.maximum(wait[rows, neck] - freed, 0.0), 0.0)
        parked_pre = prefill + np.maximum(pre - prefill, parked * v_p[rows, neck])
        # ... and Little's law still holds: the N requests' residence is N / X, so what the
        # prefill parks beyond its share the decode does not (hunt seed 6049, 4 requests
        # behind a saturated 60 ms drafter: halving the hops' latency raised TTFT + decode
        # above N / X and lowered the throughput 0.5%)
        dec = np.maximum(dec - (parked_pre - pre), decode)
        pre = parked_pre
    queue, conv, lap = loaded(x, parts=True)
    seen = np.minimum(rho * (n[:, None] - 1.0) / n[:, None], 1.0)
    ca2 = np.broadcast_to(np.asarray(scv, dtype=float), n.shape)[:, None]
    return {
        "x": x,
        "prefill_ms": pre,
        "decode_ms": dec,
        "rho": rho,
        "wait": wait,
        # a lap's waits (wait_parts): queueing and its probability, convoys, saturation
        "queue_ms": queue,
        "queue_prob": 1.0 - np.prod(np.where(dpath > 0, 1.0 - ca2 * seen, 1.0), axis=1),
        "convoy_ms": conv + held / passes,
        "convoy_slower_ms": slower,
        "convoy_reach_ms": np.minimum(slower, lap),
        "saturation_ms": per_visit * v_d[rows, neck] / passes,
        "bottleneck_rho": np.minimum(rho.max(axis=1), 1.0),
    }


def stations(scenario, parts: dict, alone: dict, blocks: dict | None = None) -> dict:
    """The ring's stations (arrays (pts, S), S = 2 max(P) + 1) for :func:`solve`."""
    from wansim.analytical.path import hop_bytes, hop_service_ms, stage_services_ms
    from wansim.analytical.sync import forward_sizes, prefill_sizes
    from wansim.links.wire_bytes import serialise_ms

    wl = scenario.workload
    stages = np.asarray(scenario.stages)
    n = np.asarray(parts["tokens"], dtype=float)
    b = np.asarray(parts["batch"], dtype=float)
    d = np.asarray(parts["draft_ms"], dtype=float)
    passes = np.asarray(alone["passes"], dtype=float)
    prompt = np.asarray(wl.prompt_tokens)
    pre_sizes = prefill_sizes(scenario, b * prompt)
    fwd_sizes = forward_sizes(parts)
    # (a one-stage ring has no forward hop: its per-hop sizes are an empty tuple)
    pre_bytes = 0.0 if isinstance(pre_sizes, tuple) and not pre_sizes else hop_bytes(pre_sizes, 0)
    extra = (
        ()
        if blocks is None
        else tuple(
            np.shape(blocks[k])
            for k in (
                "stale_blocks_s0_per_request",
                "stale_blocks_forwarded_per_request",
                "bet_win_rate",
                "stale_drafts_per_request",
            )
        )
    )
    net = scenario.network
    links = (
        [
            (h.latency_ms, h.bandwidth_mbps, h.jitter, h.loss_rate, h.retransmit_ms)
            for h in scenario.resolved_hops()
        ]
        if net.hops
        else None
    )
    one_link = (net.latency_ms, net.bandwidth_mbps, net.jitter, net.loss_rate, net.retransmit_ms)
    link_shapes = [np.shape(v) for v in one_link if not hasattr(v, "kind")]
    shape = np.broadcast_shapes(
        *(np.shape(x) for x in (stages, n, d, passes, parts["forward_bytes"], pre_bytes)),
        *extra,
        *link_shapes,
    )
    pmax = int(np.max(stages))
    dec_c = stage_services_ms(scenario, b * n, pmax, b)
    pre_c = stage_services_ms(scenario, b * prompt, pmax, b)
    hop_ser = functools.partial(hop_service_ms, scenario)
    cols = 2 * pmax + 1
    atoms: list = [None] * cols
    out = {k: np.zeros((*shape, cols)) for k in ("s_d", "s_p", "v_d", "v_p")}
    out["decode_path"] = np.zeros((*shape, cols))
    out["prefill_path"] = np.zeros((*shape, cols))
    out["skipped"] = np.zeros((*shape, cols))  # what a finishing request leaves undone there
    out["round_robin"] = np.zeros((*shape, cols))
    first = scenario.drafter.placement == "first_stage"
    overlap = blocks is not None and bool(scenario.drafter.overlap)
    stale_s0 = 0.0 if blocks is None else blocks["stale_blocks_s0_per_request"]
    stale_fwd = 0.0 if blocks is None else blocks["stale_blocks_forwarded_per_request"]
    win = 0.0 if blocks is None else blocks["bet_win_rate"]
    flushing = blocks is not None and flushes(scenario)
    d_stale = d
    if blocks is not None:  # drafting per valid pass (first blocks and bets), per stale block
        d, d_stale = (np.asarray(blocks[k], dtype=float) for k in ("draft_ms", "stale_draft_ms"))
    for i in range(pmax):
        live = stages > i
        last = stages - 1 == i
        col = 1 + 2 * i
        drafts_here = (first and i == 0) or (not first and last)
        at_last = stale_fwd if flushing else 0.0  # flush: the last stage computes them too
        visits = passes + (stale_s0 if i == 0 else np.where(last, at_last, stale_fwd))
        # per visit: the valid passes' mean drafting, the stale blocks' (bets) at S0
        stale_here = stale_s0 if i == 0 else 0.0
        drafted = d + stale_here * (d_stale - d) / np.maximum(visits, 1e-300)
        extra = np.where(drafts_here & (not overlap), drafted, 0.0)
        out["s_d"][..., col] = np.where(live, dec_c[i] + extra, 0.0)
        out["s_p"][..., col] = np.where(live, pre_c[i], 0.0)
        out["v_d"][..., col] = np.where(live, visits, 0.0)
        out["v_p"][..., col] = np.where(live, 1.0, 0.0)
        out["decode_path"][..., col] = live
        out["prefill_path"][..., col] = live
        # a finished request leaves at its last verdict: no drafting after it there
        out["skipped"][..., col] = np.where(live & last & ~first, extra, 0.0)
        # hop i: forward (i < P - 1) or the return hop (i = P - 1)
        hcol = col + 1
        fwd_i = hop_bytes(fwd_sizes, i) if i < pmax - 1 else parts["forward_bytes"]
        fwd = hop_ser(i, fwd_i)
        ret = hop_ser(i, parts["return_bytes"])
        out["s_d"][..., hcol] = np.where(live, np.where(last, ret, fwd), 0.0)
        pre_i = hop_bytes(pre_sizes, i) if i < pmax - 1 else pre_bytes
        out["s_p"][..., hcol] = np.where(live & ~last, hop_ser(i, pre_i), 0.0)
        out["v_d"][..., hcol] = np.where(live, passes + np.where(last, 0.0, stale_fwd), 0.0)
        out["v_p"][..., hcol] = np.where(live & ~last, 1.0, 0.0)
        out["decode_path"][..., hcol] = live
        out["prefill_path"][..., hcol] = live & ~last
        lat, bw, jit, loss, rto = links[i] if links else one_link
        if jit.kind != "none" or np.any(np.asarray(loss) > 0):
            ser = serialise_ms(np.where(last, parts["return_bytes"], fwd_i), bw)
            values, weights = delay_atoms(lat, jit, loss, rto, ser)
            a = values.shape[-1]
            atoms[hcol] = tuple(
                np.broadcast_to(v, (*shape, a)).reshape(-1, a) for v in (values, weights)
            )
    if blocks is not None and scenario.schedule.kind == "async" and not overlap:
        out["round_robin"][..., 1] = 1.0
    if overlap:  # the drafter device: one pass per drafted block, off the critical path
        stale = blocks["stale_drafts_per_request"]
        drafted = passes + stale
        out["s_d"][..., 0] = d + stale * (d_stale - d) / np.maximum(drafted, 1e-300)
        out["v_d"][..., 0] = drafted
        out["decode_path"][..., 0] = 1.0 - win
    ring = {k: v.reshape(-1, cols) for k, v in out.items()}
    ring["delay_atoms"] = atoms
    return ring


def stagger_fraction(n, spacings) -> np.ndarray:
    """Share of the pairs among ``n`` requests started together that never share a wave: their
    prefills queue at the slowest station and start decoding one prefill service s apart, so
    requests k and j, |j - k| = d, decode at the same time only if d s < D (``spacings`` =
    D / s, D a request's decode). Over the n (n - 1) ordered pairs, those with d >= r number
    (n - r)(n - r + 1) (the sum over d = r .. n - 1 of 2 (n - d)), taken continuous in r: 1
    for r <= 1 (no two requests decode together), 0 for r >= n (all of them do)."""
    n = np.asarray(n, dtype=float)
    r = np.clip(np.asarray(spacings, dtype=float), 1.0, n)
    return np.where(n > 1, (n - r) * (n - r + 1.0) / np.maximum(n * (n - 1.0), 1e-300), 0.0)


def convoy_share(w, n_mean, n_var, gap_laps, rounds) -> np.ndarray:
    """:func:`wansim.analytical.slots.synchrony` per point (rows of ``w``, ``n_mean``,
    ``n_var``: the difficulty nodes, lengths in laps): requests of equal length on a ring
    without randomness finish together, and their successors' prefills convoy nobody."""
    from wansim.analytical.slots import passes_pmf, synchrony, tractable

    return np.array(
        [
            synchrony(passes_pmf(w[i], n_mean[i], n_var[i]), gap_laps[i], rounds[i])
            if tractable(n_mean[i][w[i] > 0], n_var[i][w[i] > 0], gap_laps[i])
            else 1.0
            for i in range(len(rounds))
        ]
    )


STALE_SWEEPS = 12
WAIT_PARTS = (
    "queue_ms",
    "queue_prob",
    "convoy_ms",
    "convoy_slower_ms",
    "convoy_reach_ms",
    "saturation_ms",
    "bottleneck_rho",
)
WAIT_NODES = 4
STALE_KEYS = (
    "stale_blocks_s0_per_request",
    "stale_blocks_forwarded_per_request",
    "stale_drafts_per_request",
    "wasted_token_fraction",
    "bytes_per_token",
    "draft_ms",
    "stale_draft_ms",
)


def concurrent_metrics(scenario, alone: dict, parts: dict, blocks: bool) -> dict:
    """``alone`` (sync_metrics / block_schedule_metrics keys, one request at a time) -> the
    same keys for ``workload.concurrency`` requests without batching, plus ``stage_rho``
    (pts, S) utilisation columns (stages at odd columns).

    Block schedule: a request's blocks queue at S0 behind the other requests', which spaces
    them further apart and leaves fewer stale blocks behind each lost bet; the stale counts
    (S0's load) are recomputed with S0's wait before each block (a fixed point, bisected in
    ``STALE_SWEEPS`` steps); the request's own times stay those of the schedule alone plus
    the waits. With the overlapped drafter the queue that decides the stale work is the
    drafter device's: a draft that starts after the loss is heard drafts from the correction
    (hunt seed 139, 8 requests sharing a 15 ms drafter: -37.5% -> +0.1%)."""
    if not blocks:
        return _concurrent(scenario, alone, parts, None)
    from wansim.analytical.blocks import block_schedule_metrics

    x, wx = np.polynomial.laguerre.laggauss(WAIT_NODES)
    # the queue that decides the stale work: S0's, or the overlapped drafter's device (col 0)
    overlap = bool(scenario.drafter.overlap)
    queue, column = ("draft_wait", "draft_wait_ms") if overlap else ("s0_wait", "s0_wait_ms")

    first_out = _concurrent(scenario, alone, parts, alone)
    others = np.asarray(first_out["queue_others"], dtype=float)
    service = np.asarray(first_out["draft_service_ms" if overlap else "s0_service_ms"])
    verdict_wait = np.asarray(first_out["verdict_wait_ms"], dtype=float)

    def stale_at(wait):
        """Stale counts when each block waits ``wait`` on average in S0's queue, spread as
        :func:`queue_wait_spread` (a fixed wait would make them step functions of it)."""
        fixed, spread = queue_wait_spread(wait, others, service)
        schedule = functools.partial(block_schedule_metrics, verdict_wait=verdict_wait)
        return stale_over_nodes(scenario, queue, fixed, spread, x, wx, schedule)

    # S0's wait w solves w = f(w), f(w) = S0's wait when the stale blocks are those of a
    # request whose blocks wait w at S0; f decreases in w, so bisect on [0, f(0)]
    first = first_out[column]
    lo, hi = np.zeros(np.shape(first)), np.asarray(first, dtype=float)
    for _ in range(STALE_SWEEPS):
        mid = 0.5 * (lo + hi)
        f = _concurrent(scenario, alone, parts, stale_at(mid))[column]
        lo, hi = np.where(f > mid, mid, lo), np.where(f > mid, hi, mid)
    # the stale counts can step in w (a wait that crosses the time to the verdict at every
    # quadrature node at once): then f jumps across w at the fixed point and the queue runs a
    # mixture of the two states, the share theta of the lower one where theta f(lo) +
    # (1 - theta) f(hi) = w (continuous in the scenario: hunt seed 48, 4x the bandwidth gave
    # -18% when the last midpoint fell on the other side of the step)
    below, above = stale_at(lo), stale_at(hi)
    f_lo = _concurrent(scenario, alone, parts, below)[column]
    f_hi = _concurrent(scenario, alone, parts, above)[column]
    w = 0.5 * (lo + hi)
    theta = np.clip((w - f_hi) / np.where(f_lo > f_hi, f_lo - f_hi, np.inf), 0.0, 1.0)
    theta = np.where(f_lo > f_hi, theta, 0.5)
    stale = dict(above)
    for key in STALE_KEYS:
        stale[key] = theta * below[key] + (1.0 - theta) * above[key]
    out = _concurrent(scenario, alone, parts, stale)
    if overlap and scenario.schedule.kind == "sync":
        out = _drafter_saturated(scenario, alone, parts, out, block_schedule_metrics)
    # the wire, the waste and the counts follow the stale blocks actually computed under load
    for key in (
        "wasted_token_fraction",
        "bytes_per_token",
        "stale_blocks_s0_per_request",
        "stale_blocks_forwarded_per_request",
    ):
        out[key] = np.where(np.asarray(scenario.workload.concurrency) > 1, stale[key], alone[key])
    return out


def stale_over_nodes(scenario, queue: str, fixed, spread, x, wx, block_schedule_metrics) -> dict:
    """The block schedule's metrics with the stale keys (:data:`STALE_KEYS`) averaged over a
    wait at S0 (or the drafter's device: ``queue``) of ``fixed + spread * x_i`` with weights
    ``wx_i`` (the other keys: at the first node), in one vectorised call: the nodes are a leading
    axis of the wait (each node's values are those of a call with its own wait; the block
    schedule's cost is its calls per chain horizon, not the points')."""
    fixed, spread = np.broadcast_arrays(np.asarray(fixed, float), np.asarray(spread, float))
    nodes = np.asarray(x, dtype=float).reshape((-1,) + (1,) * fixed.ndim)
    stacked = block_schedule_metrics(scenario, **{queue: fixed + nodes * spread})

    def at(value, i):  # node i's value (a key the wait does not move has no node axis)
        if isinstance(value, np.ndarray) and value.ndim == fixed.ndim + 1:
            return value[i]
        return value

    out = {key: at(value, 0) for key, value in stacked.items()}
    for key in STALE_KEYS:
        out[key] = sum(wi * at(stacked[key], i) for i, wi in enumerate(wx))
    return out


def _drafter_saturated(scenario, alone, parts, out, block_schedule_metrics) -> dict:
    """The overlapped drafter (sync schedule: one block per request in flight) as the ring's
    bottleneck: its FIFO queue holds one draft of every request (queued when the request's previous block is released, while that block's
    pass travels), so a draft waits for the N - 1 ahead of it, (N - 1) d. Once that covers
    the pass's travel (release to verdict, T), every draft starts after its bet is settled and
    drafts from the correction: none is stale, and the drafter runs back to back (a lap of
    N d). The M/D/1 wait of the fixed point averages over visits and misses this state (hunt
    seed 297: 16 requests on a 4 ms drafter, -34% on tokens/s); where (N - 1) d >= T the
    answer is the ring without stale drafts."""
    fresh = block_schedule_metrics(scenario, draft_wait=1e12)  # every draft after its verdict
    cand = _concurrent(scenario, alone, parts, fresh)
    n = np.minimum(
        np.asarray(scenario.workload.concurrency, dtype=float),
        np.asarray(scenario.workload.requests, dtype=float),
    )
    d = np.asarray(parts["draft_ms"], dtype=float)
    travel = np.asarray(cand["lap_ms_mean"]) - d - np.asarray(cand["draft_wait_ms"])
    saturated = (n > 1) & ((n - 1.0) * d >= travel)
    if not np.any(saturated):
        return out
    merged = dict(out)
    for key, value in cand.items():
        if key in out and np.shape(value) == np.shape(out[key]):
            merged[key] = np.where(saturated, value, out[key])
    for key in ("wasted_token_fraction", "bytes_per_token"):
        merged[key] = np.where(saturated, fresh[key], out[key])
    return merged


def _concurrent(scenario, alone: dict, parts: dict, stale: dict | None) -> dict:
    blocks = stale is not None
    from wansim.analytical.blocks import acceptance_nodes

    wl = scenario.workload
    m = np.asarray(parts["m"], dtype=float)
    requests = np.asarray(wl.requests, dtype=float)
    n_conc = np.minimum(np.asarray(wl.concurrency, dtype=float), requests)
    decode_alone = np.asarray(alone["passes_per_request"]) * np.asarray(alone["lap_ms_mean"])
    shape = np.broadcast_shapes(
        np.shape(decode_alone), np.shape(n_conc), np.shape(alone["tokens_per_s"]), np.shape(m)
    )

    def flat(x):
        return np.broadcast_to(np.asarray(x, dtype=float), shape).ravel()

    base = {
        "prefill_ms": flat(alone["prefill_ms"]),
        "decode_ms": flat(decode_alone),
        "passes": flat(alone["passes_per_request"]),
    }
    size = int(np.prod(shape))
    ring = stations(scenario, parts, {"passes": alone["passes_per_request"]}, stale)
    ring = {
        k: (v if k == "delay_atoms" else np.broadcast_to(v, (size, v.shape[-1])))
        for k, v in ring.items()
    }
    ring["delay_atoms"] = [
        a and tuple(np.broadcast_to(v, (size, v.shape[-1])) for v in a) for a in ring["delay_atoms"]
    ]
    chain = None
    if blocks:
        chain = 1.0 / np.maximum(1.0 - flat(alone["bet_win_rate"]), 1e-9)
    # the makespan of R requests through N slots: the slowest slot ends the run
    acc = acceptance_nodes(scenario, m)
    q = acc["w"].shape[-1]
    w, n_mean, n_var = (
        np.broadcast_to(acc[k], (*shape, q)).reshape(size, q) for k in ("w", "n_mean", "n_var")
    )
    passes_var = (w * (n_var + n_mean**2)).sum(axis=1) - (w * n_mean).sum(axis=1) ** 2
    # one pass per request in flight (no block schedule) and no failures (a fail-over
    # re-prefills the requests in flight at random instants): a fresh phase settles once
    relocks = not blocks and not scenario.faults.events
    scv = arrival_scv(
        flat(alone["lap_ms_mean"]),
        flat(alone["lap_ms_var"]),
        base["passes"],
        passes_var,
        relocks=relocks,
        slack_ms=flat(alone["lap_ms_mean"]) / flat(n_conc) - ring["s_p"].max(axis=1),
    )
    # requests without batching keep their own laps: the laps' spread (jitter,
    # retransmissions) moves their completions apart in time as unequal lengths would, so in
    # laps a request's length varies by Var N + N Var(lap) / lap^2
    lap_alone = flat(alone["lap_ms_mean"])
    drift = n_mean * (flat(alone["lap_ms_var"]) / np.maximum(lap_alone, 1e-12) ** 2)[:, None]
    share = convoy_share(
        w, n_mean, n_var + drift, base["prefill_ms"] / lap_alone, flat(requests) / flat(n_conc)
    )
    # requests of equal length finish together only if they start together: their prefills
    # queue at the slowest station, so they start that station's prefill service apart, and
    # the pairs that many of those apart outlast a request's decode never share a wave: their
    # prefills land at random phases (hunt seed 210: 8 requests of 2 passes behind 590 ms
    # prefills on 100 Mbit/s hops, +391% -> see tests). Counted pair by pair, so the share
    # moves continuously with the decode (all or none of the pairs at N - 1 spacings made a
    # faster link lower tokens/s: hunt seed 2058, latency 60 -> 30 ms, -7%)
    apart = stagger_fraction(flat(n_conc), base["decode_ms"] / ring["s_p"].max(axis=1))
    share = apart + (1.0 - apart) * share
    prefill_scv = arrival_scv(
        flat(alone["lap_ms_mean"]), flat(alone["lap_ms_var"]), base["passes"], 0.0
    )
    res = solve(
        flat(n_conc),
        base,
        ring,
        chain_blocks=chain,
        window=flat(scenario.schedule.max_inflight_blocks if blocks else 1),
        scv=scv,
        convoy_share=share,
        prefill_scv=prefill_scv,
    )
    stretch = res["decode_ms"] / base["decode_ms"]
    per_pass = res["decode_ms"] / base["passes"]
    residence = res["prefill_ms"] + res["decode_ms"]
    rounds = flat(requests) / flat(n_conc)
    rho = res["rho"]
    # the spread of the slots' finishing times, shrunk by the bottleneck's load: a saturated
    # bottleneck serves whoever is left (work-conserving), an idle one lets each slot run alone
    idle = np.clip(1.0 - rho.max(axis=1), 0.0, 1.0)
    spread = slowest_excess(w, n_mean, n_var, flat(n_conc), rounds) * per_pass * idle
    makespan = rounds * residence + spread
    stage_cols = rho[:, 1::2]
    live = ring["v_p"][:, 1::2] > 0
    util = (stage_cols * live).sum(axis=1) / np.maximum(live.sum(axis=1), 1)
    out = dict(alone)
    loaded = {
        "tokens_per_s": flat(alone["tokens_per_s"]) / stretch,
        "throughput_tokens_per_s": 1e3 * flat(requests) * (flat(m) + 1) / makespan,
        "lap_ms_mean": flat(alone["lap_ms_mean"]) * stretch,
        "tpot_ms_mean": flat(alone["tpot_ms_mean"]) * stretch,
        "ttft_ms_mean": res["prefill_ms"],
        "prefill_ms": res["prefill_ms"],
        "bubble_fraction": 1.0 - util,
    }
    single = flat(n_conc) <= 1
    for key, value in loaded.items():
        out[key] = np.where(single, flat(alone[key]), value).reshape(shape)
    for key in WAIT_PARTS:
        out[key] = np.where(single, 0.0, res[key]).reshape(shape)
    out["stage_rho"] = stage_cols.reshape(*shape, -1) if shape else stage_cols[0]
    out["concurrency_throughput_per_s"] = (1e3 * res["x"]).reshape(shape)
    out["s0_wait_ms"] = res["wait"][:, 1].reshape(shape)
    # a block's way from S0 back to its verdict at S0: the waits after S0, the convoys
    after_s0 = (res["wait"] * ring["decode_path"])[:, 2:].sum(axis=1) + res["convoy_ms"]
    out["verdict_wait_ms"] = after_s0.reshape(shape)
    out["s0_service_ms"] = ring["s_d"][:, 1].reshape(shape)
    out["draft_service_ms"] = ring["s_d"][:, 0].reshape(shape)
    out["queue_others"] = np.maximum(flat(n_conc) - 1.0, 1.0).reshape(shape)  # S0's other requests
    out["draft_wait_ms"] = res["wait"][:, 0].reshape(shape)
    return out
