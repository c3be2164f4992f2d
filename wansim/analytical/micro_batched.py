"""Micro-batched pipeline parallelism in steady state (``schedule.micro_batches: N``), vectorised.

The rules (both engines): :mod:`wansim.serving.micro_batching`. B = the requests in flight
(:func:`~wansim.serving.micro_batching.serving_slots`), N' = min(N, B) micro-batches of b = B / N'
sequences each (the DES's sizes differ by at most one when N' does not divide B).

Model and assumptions:

- **A slot's cycle.** A request admitted at its micro-batch's verdict rides its prompt in the
  micro-batch's next c = ceil(prompt / C) passes (c = 1 without a chunk budget C), takes its
  first token at the last of them, then E[N] verify passes (step-weighted over difficulty).
  The budget serves at most C / prompt prompts per pass, so a slot spends
  Y = max(c + E[N], b prompt / C) passes per request (beyond c + E[N] the prompts queue for
  the budget: saturated prefill), a share q = E[N] / Y of them verifying.
- **The mean pass.** A micro-batch's pass carries n = b (q v + prompt / Y) tokens
  (v tokens per verify pass and sequence); b q sequences are verified and drafted for; the
  return message holds one verdict record per sequence that stays, b (Y - 1) / Y; the pass
  holds b q + b c / Y sequences (each beyond the first: ``model.sequence_ms``). Stage services are taken at the mean pass (exact for linear compute models, whose
  mean service is the service of the mean pass); prompts of replacements admitted together
  are taken to spread out (no bunching).
- **The lap (max-plus).** The micro-batches circulate a ring of single servers (each stage's
  compute plus the drafting it hosts; each hop's sender: software and serialisation) and pure
  delays (propagation). For N' identical batches cycling with deterministic services the
  periodic regime of this cyclic max-plus system has one batch's lap

      T = max(L, N' s_max)

  L: the lap of a lone micro-batch (all services plus the propagation delays: the ring
  circuit, N' batches on it); s_max: the slowest station's service (a self-loop, one batch at
  a time). L > N' s_max: latency-bound (the batches never queue; more batches add throughput
  for free); otherwise bottleneck-bound (the slowest station is never idle; more batches only
  lengthen everyone's lap). Exact for deterministic services in steady state (hand-worked in
  the tests); jitter, the random mix of prompt chunks and verify passes, and refills are not
  modelled beyond their means, except for the following.
- **Head-of-line waits.** Links deliver in order, so a pass also waits for the other
  micro-batches' messages that drew a longer delay (a retransmission: 200 ms by default, often
  several laps): L gains the resequencing wait W of :mod:`wansim.analytical.resequencing` at
  (N' - 1) / T offered messages per ms on each hop, T = max(L + W(T), N' s_max) solved as a
  fixed point (:func:`hol_wait_ms`). The offers are taken as Poisson; a long hold releases
  the held batches together (bunches) and the next loss then holds them all, which the
  Poisson law understates (hunt seeds 32, 62, 285: +190%, +150%, +134% -> +14%, +12%, -23%). Whole prompts (no chunk budget) make rare passes far heavier
  than the mean (their convoys, below, are long) and refills bunch in waves (not modelled),
  so such points are not validated (measured: -20% to +36% on tokens/s,
  :mod:`wansim.analytical.regime`).
- **Convoys.** Passes that carry prompt chunks are heavier than passes that do not, and
  stations and links serve FIFO: a lighter pass catches up with the nearest heavier one ahead
  and follows it (:func:`convoy_wait_ms`, :func:`chunk_convoy`: the share of passes with
  chunks is the chunk budget's busy share, or the chance that one of the b sequences is in
  its c chunk passes where prompts fit a pass together). The wait joins the head-of-line wait
  in the fixed point; a pass carrying the request's own chunk leads its convoy (TTFT).
  Measured on the approximation grid: 1 ms hops, 4 micro-batches of 4 (point 69 of
  docs/approximations.md's grid): the DES's steady lap 267 ms, the cycle 224 ms, with
  convoys 251 ms.
- **Per request.** Every decode lap takes T: tokens_per_s = E_w[M / N] / T, TPOT = E[N] T / M,
  TTFT = (Y - E[N] - c) T + c T_c for a replacement (T_c: the lap of a pass carrying its
  chunk, prompt / c tokens beside the others' mean share, next to N' - 1 mean passes), plus (U / B - 1) Y T waiting for a slot when more
  users U than slots B take turns (Little's law) (the first wave: its micro-batches' first passes, queued at S0,
  then its prompt chunks at the cold cycle).
- **The last wave.** With a steady state (R >= 2 U: the DES measures the requests past the
  first U), the B requests in flight at the last admission, at phases uniform over their
  cycle, decode through a ring that nobody refills: its passes lose the prompts first, then
  the sequences that finish (:func:`last_wave`: the passes' contents as the phases run out,
  their laps by :func:`ring` at the steady waits, every batch kept until fewer requests than
  batches are left). They are B of the R - U measured requests: tokens/s and the mean TPOT
  mix their decode times with the steady ones (10 stages, 2 micro-batches of 35, 3 ms hops:
  the last wave's requests 7.5-14 tokens/s against 6.2 steady; the mean +23% over the
  steady rate, the model +26%). Synchronised waves (no speculation, no chunk budget: every
  phase alike) are not modelled.
- **Throughput** of R requests through B slots: makespan = TTFT_cold + E[N] T +
  (R / B - 1) Y T + X L_1 (X: the slowest slot's passes beyond the mean,
  :func:`wansim.analytical.concurrent.slowest_excess`; the drain's passes at the lap L_1 of a
  micro-batch of one sequence).
- **Utilisation** of a stage: R Y / b + X passes of its service over the makespan.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim import speculation
from wansim.analytical.concurrent import slowest_excess
from wansim.analytical.path import hop_bytes, hop_service_ms, per_hop, ring_sums
from wansim.analytical.resequencing import ring_hol_ms
from wansim.analytical.sync import prefill_sizes
from wansim.links.expected_delay import expected_losses, hop_mean, hop_var
from wansim.links.wire_bytes import tree_mask_bytes
from wansim.serving.micro_batching import active_batches, prefill_chunks, serving_slots
from wansim.stages.compute import mean_stage_ms, stage_ms_each

HOL_STEPS = 10  # regula falsi steps of the head-of-line fixed point (8: 4e-7 relative)
DRAIN_STEPS = 32  # quadrature steps over the last wave's passes and phases


@dataclasses.dataclass(frozen=True)
class Ring:
    """One micro-batch's pass around the ring: its lone lap, the slowest station's service,
    the per-stage services, and the hops' parts."""

    lone_lap_ms: np.ndarray  # L
    bottleneck_ms: np.ndarray  # s_max
    stage_ms: list  # per stage, drafting included where it runs
    draft_ms: np.ndarray
    forward_hops_ms: np.ndarray
    return_hop_ms: np.ndarray
    hop_var_ms2: np.ndarray
    forward_bytes: np.ndarray | tuple  # per forward hop with payload.extra_tensors
    return_bytes: np.ndarray


def ring(scenario, tokens, verified, records, terms, sequences) -> Ring:
    """A pass of ``tokens`` tokens over ``sequences`` sequences (verify passes and prompt
    chunks: ``model.sequence_ms`` each beyond the first) holding ``verified`` verified
    sequences (drafted for; tree masks) and ``records`` verdict records on the return hop
    (arrays broadcast)."""
    stages = np.asarray(scenario.stages)
    pmax = int(np.max(stages))
    tree = terms["tree_nodes"]
    first = scenario.drafter.placement == "first_stage"
    draft = np.where(
        verified > 0, speculation.drafter_ms(scenario, terms, verified), 0.0
    ) * np.asarray(scenario.k > 0, dtype=float)
    masks = verified * tree_mask_bytes(tree)
    fwd = per_hop(prefill_sizes(scenario, tokens), lambda n: n + masks)  # (the DES's sizes)
    # one verdict record a sequence, each the DES's (its ids, drafts and return-hop features)
    record = speculation.return_message_bytes(scenario, tree, 1, terms["tokens"], terms["nodes"])
    ret = np.maximum(records, 1.0) * record
    m = scenario.model
    if m.stage_compute or m.stage_overhead_ms or m.stage_sequence_ms:
        each = [
            np.asarray(x, dtype=float) for x in stage_ms_each(scenario, tokens, sequences=sequences)
        ]
    else:
        each = [np.asarray(mean_stage_ms(scenario, tokens, sequences), dtype=float)] * pmax
    live = [stages > i for i in range(pmax)]
    where = [(stages - 1 == i) if not first else np.asarray(i == 0) for i in range(pmax)]
    each = [s + np.where(w, draft, 0.0) for s, w in zip(each, where, strict=True)]
    compute = sum((np.where(on, s, 0.0) for s, on in zip(each, live, strict=True)), np.zeros(()))
    slowest = np.max(
        np.stack(
            np.broadcast_arrays(*(np.where(on, s, 0.0) for s, on in zip(each, live, strict=True)))
        ),
        axis=0,
    )
    fwd_ms, ret_ms = ring_sums(scenario, hop_mean, fwd, ret)
    var = sum(ring_sums(scenario, hop_var, fwd, ret))
    if scenario.network.hops or isinstance(fwd, tuple):
        senders = [hop_service_ms(scenario, i, hop_bytes(fwd, i)) for i in range(pmax - 1)]
        senders.append(hop_service_ms(scenario, pmax - 1, ret))
    else:
        senders = [
            np.where(stages > 1, hop_service_ms(scenario, 0, fwd), 0.0),
            hop_service_ms(scenario, 0, ret),
        ]
    for s in senders:
        slowest = np.maximum(slowest, s)
    return Ring(compute + fwd_ms + ret_ms, slowest, each, draft, fwd_ms, ret_ms, var, fwd, ret)


def cycle_ms(lone_lap_ms, bottleneck_ms, batches) -> np.ndarray:
    """One batch's lap when ``batches`` identical batches cycle: max(L, N' s_max)."""
    return np.maximum(lone_lap_ms, batches * bottleneck_ms)


@dataclasses.dataclass(frozen=True)
class Convoy:
    """Passes that carry prompt chunks and passes that do not: the share of passes with a
    chunk and how much longer such a pass's lone lap is (ms)."""

    share: np.ndarray
    slower_ms: np.ndarray


def convoy_wait_ms(convoy: Convoy | None, batches, lap) -> np.ndarray:
    """A pass's wait per lap behind heavier passes (FIFO stations and links): the N'
    micro-batches rotate T / N' apart; a pass with a chunk is ``slower_ms`` longer around the
    ring, so a pass without one catches up with the nearest chunk pass ahead of it, k spacings
    ahead with probability share (1 - share)^(k - 1), and loses max(slower - k T / N', 0)
    (passes between them bunch behind it too). Per pass and lap: (1 - share) times that mean
    over k = 1 .. N' - 1."""
    if convoy is None:
        return np.zeros(np.shape(lap))
    n = np.asarray(batches, dtype=float)
    spacing = lap / n
    share = convoy.share
    total = np.zeros(np.broadcast_shapes(np.shape(lap), np.shape(share)))
    for k in range(1, int(np.max(n))):
        ahead = share * (1.0 - share) ** (k - 1) * (k < n)
        total = total + ahead * np.maximum(convoy.slower_ms - k * spacing, 0.0)
    return (1.0 - share) * total


def hol_wait_ms(
    scenario, steady: Ring, batches, steps: int = HOL_STEPS, convoy: Convoy | None = None
) -> np.ndarray:
    """A pass's head-of-line waits per lap: the resequencing wait of
    :mod:`wansim.analytical.resequencing` summed over the ring's hops (the other N' - 1
    micro-batches' messages offered to each hop at (N' - 1) / T per ms) and, with ``convoy``,
    the wait behind heavier passes (:func:`convoy_wait_ms`). T = max(L + W(T), N' s_max)
    (:func:`cycle_ms`), W falling in T: the fixed point by the Illinois variant of regula
    falsi on T between the lone cycle and the cycle with the wait at the lone cycle's rate
    (``steps`` evaluations of W). Zero without loss, jitter and convoys, or with one
    micro-batch."""
    lone = cycle_ms(steady.lone_lap_ms, steady.bottleneck_ms, batches)
    others = np.maximum(np.asarray(batches, dtype=float) - 1.0, 0.0)

    def wait(lap):
        return ring_hol_ms(
            scenario, others / lap, steady.forward_bytes, steady.return_bytes
        ) + convoy_wait_ms(convoy, batches, lap)

    def excess(lap, w):  # the cycle the wait gives, less the lap assumed (falls in lap)
        return cycle_ms(steady.lone_lap_ms + w, steady.bottleneck_ms, batches) - lap

    top = wait(lone)
    if not np.any(top > 0):
        return np.zeros(np.shape(top))
    lo, f_lo = lone, excess(lone, top)  # >= 0
    hi = cycle_ms(steady.lone_lap_ms + top, steady.bottleneck_ms, batches)
    f_hi = excess(hi, wait(hi))  # <= 0
    side = np.zeros(np.shape(f_lo))
    for _ in range(steps):
        span = f_lo - f_hi
        mid = np.where(span > 0, (lo * f_hi - hi * f_lo) / np.where(span > 0, -span, 1.0), lo)
        mid = np.clip(mid, np.minimum(lo, hi), np.maximum(lo, hi))
        f_mid = excess(mid, wait(mid))
        up = f_mid > 0
        # Illinois: a bracket end kept twice in a row has its value halved
        f_hi = np.where(up & (side > 0), 0.5 * f_hi, f_hi)
        f_lo = np.where(~up & (side < 0), 0.5 * f_lo, f_lo)
        lo, f_lo = np.where(up, mid, lo), np.where(up, f_mid, f_lo)
        hi, f_hi = np.where(up, hi, mid), np.where(up, f_hi, f_mid)
        side = np.where(up, 1.0, -1.0)
    return wait(0.5 * (lo + hi))


@dataclasses.dataclass(frozen=True)
class MicroBatchedRun:
    means: dict[str, np.ndarray]
    stage_busy_ms: list  # per stage over the run
    ring: Ring


def pass_tokens(scenario, parts: dict) -> dict:
    """The mean pass (module docstring): b, c, Y, the sequences verified a pass, its tokens,
    and the tokens of a pass carrying one request's prompt chunk."""
    wl = scenario.workload
    slots = np.asarray(serving_slots(scenario), dtype=float)
    b = slots / np.asarray(active_batches(scenario), dtype=float)
    passes = np.asarray(parts["passes"], dtype=float)
    prompt = np.asarray(wl.prompt_tokens, dtype=float)
    chunk = scenario.schedule.prefill_chunk_tokens
    c = np.asarray(prefill_chunks(wl.prompt_tokens, chunk), dtype=float)
    cycle = c + passes
    if chunk is not None:  # the budget serves C / prompt prompts a pass at most
        cycle = np.maximum(cycle, b * prompt / chunk)
    verified = b * passes / cycle
    tokens = verified * np.asarray(parts["tokens"], dtype=float) + b * prompt / cycle
    heavy = prompt / c + (b - 1.0) / b * tokens
    return {
        "slots": slots,
        "b": b,
        "c": c,
        "cycle": cycle,
        "verified": verified,
        "tokens": tokens,
        "chunk_pass_tokens": heavy,
    }


def cold_wave_ttft_ms(scenario, prompt_tokens, terms: dict, member: float = 0.5) -> np.ndarray:
    """The first token of a wave of prompts of ``prompt_tokens`` entering an idle ring
    together, b per micro-batch (the first wave; a failover's re-prefills,
    :mod:`wansim.analytical.faults`): the micro-batches' first passes queue at S0 (``member``
    x (N' - 1) slowest services), then ``member`` x (c - 1) more of their c = ceil(b prompt /
    C) chunk passes at the cold cycle max(L_c, N' s_c). ``member`` 0.5: the wave's mean, 1:
    its last prompt."""
    batches = np.asarray(active_batches(scenario), dtype=float)
    b = np.asarray(serving_slots(scenario), dtype=float) / batches
    prompt = np.asarray(prompt_tokens, dtype=float)
    c_cold = np.asarray(
        prefill_chunks(b * prompt, scenario.schedule.prefill_chunk_tokens), dtype=float
    )
    cold = ring(scenario, b * prompt / c_cold, np.zeros(()), b, terms, b)
    cold_cycle = cycle_ms(cold.lone_lap_ms, cold.bottleneck_ms, batches)
    return (
        cold.lone_lap_ms
        + member * (batches - 1.0) * cold.bottleneck_ms
        + member * (c_cold - 1.0) * cold_cycle
    )


def _at(cum: np.ndarray, x: np.ndarray, steps: int) -> np.ndarray:
    """Linear interpolation along axis 0 of ``cum`` (values at ``steps`` + 1 equal steps over
    [0, 1]) at the points ``x`` in [0, 1] (axis 0: the queries; the other axes broadcast)."""
    pos = np.clip(x, 0.0, 1.0) * steps
    lo = np.minimum(np.floor(pos), steps - 1).astype(int)
    shape = np.broadcast_shapes(cum.shape[1:], lo.shape[1:])
    cum = np.broadcast_to(cum, cum.shape[:1] + shape)
    lo = np.broadcast_to(lo, lo.shape[:1] + shape)
    pos = np.broadcast_to(pos, lo.shape)
    left = np.take_along_axis(cum, lo, axis=0)
    right = np.take_along_axis(cum, lo + 1, axis=0)
    return left + (pos - lo) * (right - left)


def last_wave(scenario, parts: dict, mean: dict, lap, hol, steps: int = DRAIN_STEPS) -> dict:
    """The last wave (module docstring): the B requests in flight when the last request is
    admitted, at phases u uniform over their cycle of Y passes (u Y passes done), decode
    through a ring that nobody refills. s passes after the last admission the requests with
    (1 - u) Y in (s, s + E[N]] decode, those with it in (s + E[N], s + E[N] + c] ride prompt
    chunks, those with it beyond s are left, spread over min(N', left) micro-batches; the lap
    of that pass (:func:`ring`, :func:`cycle_ms`, ``hol`` added) on ``steps`` + 1 points of
    [0, Y], integrated by the trapezoid rule. A request decodes its last E[N] passes: those
    before the last admission at ``lap``, the rest at the drain's laps. Returns the mean over
    the phases (``steps`` midpoints) of 1 / decode time (``inverse_ms``) and of the decode
    time (``decode_ms``)."""
    batches = np.asarray(active_batches(scenario), dtype=float)
    slots, c, cycle = mean["slots"], mean["c"], mean["cycle"]
    passes = np.asarray(parts["passes"], dtype=float)
    v = np.asarray(parts["tokens"], dtype=float)
    prompt = np.asarray(scenario.workload.prompt_tokens, dtype=float)
    lead = (slice(None),) + (None,) * np.ndim(cycle)
    s = (np.arange(steps + 1, dtype=float) / steps)[lead] * cycle  # passes since then
    decoding = slots * np.minimum(passes, cycle - s) / cycle
    prefilling = slots * (np.minimum(s + passes + c, cycle) - np.minimum(s + passes, cycle)) / cycle
    left = slots * (cycle - s) / cycle
    active = np.clip(left, 1.0, batches)
    dec, pre, stay = decoding / active, prefilling / active, left / active
    pass_ring = ring(
        scenario,
        dec * v + pre * prompt / c,
        dec,
        stay * (cycle - 1.0) / cycle,
        parts,
        np.maximum(dec + pre, 1.0),
    )
    laps = cycle_ms(pass_ring.lone_lap_ms + hol, pass_ring.bottleneck_ms, active)
    cum = np.concatenate(
        [np.zeros((1, *np.shape(laps)[1:])), np.cumsum(0.5 * (laps[1:] + laps[:-1]), axis=0)]
    ) * (cycle / steps)
    u = ((np.arange(steps, dtype=float) + 0.5) / steps)[lead]
    end = 1.0 - u  # in cycles after the last admission
    start = end - passes / cycle
    decode_ms = (
        lap * np.maximum(-start, 0.0) * cycle
        + _at(cum, end, steps)
        - _at(cum, np.maximum(start, 0.0), steps)
    )
    return {
        "inverse_ms": np.mean(1.0 / decode_ms, axis=0),
        "decode_ms": np.mean(decode_ms, axis=0),
    }


def chunk_convoy(scenario, parts: dict, mean: dict, records, sequences) -> Convoy:
    """Passes with and without prompt chunks (:func:`convoy_wait_ms`). Each of the b
    sequences rides its c chunks in a cycle of Y passes: where prompts fit a pass together, a
    share 1 - (1 - c / Y)^b of the passes carry chunks; where they queue for the chunk budget
    C, its busy share b prompt / (C Y) (all passes when saturated); the larger of the two.
    The b prompt / Y prompt tokens of the mean pass ride in those passes, the verify tokens in
    every pass; the heavier pass's lone lap less the lighter's is ``slower_ms``."""
    b, c, cycle, verified = mean["b"], mean["c"], mean["cycle"], mean["verified"]
    prompt = np.asarray(scenario.workload.prompt_tokens, dtype=float)
    share = 1.0 - (1.0 - np.minimum(c / cycle, 1.0)) ** b
    chunk = scenario.schedule.prefill_chunk_tokens
    if chunk is not None:  # prompts that do not fit a pass together queue for the budget
        share = np.maximum(share, b * prompt / (np.asarray(chunk, dtype=float) * cycle))
    share = np.clip(share, 1e-12, 1.0)
    verify = verified * np.asarray(parts["tokens"], dtype=float)
    light = ring(scenario, verify, verified, records, parts, np.maximum(verified, 1.0))
    heavy = ring(
        scenario,
        verify + b * prompt / (cycle * share),
        verified,
        records,
        parts,
        verified + (sequences - verified) / share,
    )
    return Convoy(share, np.maximum(heavy.lone_lap_ms - light.lone_lap_ms, 0.0))


def micro_batched_run(scenario, parts: dict) -> MicroBatchedRun:
    """Mean metrics (the keys of :func:`wansim.analytical.sync.sync_metrics`) in steady state
    (module docstring), with per-stage busy time and the mean pass's ring."""
    wl = scenario.workload
    batches = np.asarray(active_batches(scenario), dtype=float)
    v = np.asarray(parts["tokens"], dtype=float)
    m = np.asarray(parts["m"], dtype=float)
    passes = np.asarray(parts["passes"], dtype=float)
    prompt = np.asarray(wl.prompt_tokens, dtype=float)
    mean = pass_tokens(scenario, parts)
    slots, b, c, cycle = mean["slots"], mean["b"], mean["c"], mean["cycle"]
    verified, tokens, heavy_tokens = mean["verified"], mean["tokens"], mean["chunk_pass_tokens"]
    records = b * (cycle - 1.0) / cycle
    # its sequences: the verify passes and the c prompt chunks per request and cycle
    sequences = verified + b * c / cycle
    steady = ring(scenario, tokens, verified, records, parts, sequences)
    # a pass carrying one request's prompt chunk: that chunk beside the others' mean share
    heavy = ring(
        scenario,
        heavy_tokens,
        verified * (b - 1.0) / b,
        records,
        parts,
        1.0 + sequences * (b - 1.0) / b,
    )
    convoy = chunk_convoy(scenario, parts, mean, records, sequences)
    hol = hol_wait_ms(scenario, steady, batches, convoy=convoy)
    lap = cycle_ms(steady.lone_lap_ms + hol, steady.bottleneck_ms, batches)
    # the passes carrying the request's own chunks: their lap, beside N - 1 mean passes
    # (it leads its convoy: it waits behind no lighter pass)
    behind = convoy_wait_ms(convoy, batches, lap)
    heavy_lap = np.maximum(
        heavy.lone_lap_ms + hol - behind,
        (batches - 1.0) * steady.bottleneck_ms + heavy.bottleneck_ms,
    )

    ttft_cold = cold_wave_ttft_ms(scenario, prompt, parts)
    ttft = (cycle - passes - c) * lap + c * heavy_lap
    # closed loop: users beyond the slots wait for one (Little: U / X in the system)
    users = np.minimum(np.asarray(wl.concurrency, dtype=float), np.asarray(wl.requests))
    queued = np.maximum(users / slots - 1.0, 0.0) * cycle * lap
    requests = np.asarray(wl.requests, dtype=float)
    measured = queued + np.where(
        requests >= 2 * slots, ttft, (slots * ttft_cold + (requests - slots) * ttft) / requests
    )

    from wansim.analytical.blocks import acceptance_nodes

    acc = acceptance_nodes(scenario, m)
    rounds = np.maximum(requests / slots, 1.0)
    excess = slowest_excess(acc["w"], acc["n_mean"], acc["n_var"], slots, rounds)
    one = ring(scenario, v, np.ones(()), np.ones(()), parts, 1.0)
    # with a steady state (past the warm-up, the first U requests, as the DES's
    # wansim.sim.metrics.warmup_requests) the last wave's B requests drain the ring: their
    # own decode times in the per-request means
    steady_run = (users > 1) & (requests >= 2 * users)
    wave = last_wave(scenario, parts, mean, lap, hol)
    last = np.where(steady_run, slots / np.maximum(requests - users, 1.0), 0.0)
    makespan = ttft_cold + passes * lap + (rounds - 1.0) * cycle * lap + excess * one.lone_lap_ms
    # a cycle per request, and the slowest slot's passes beyond the mean (as in the makespan)
    total_passes = requests * cycle / b + excess
    busy = [total_passes * s for s in steady.stage_ms]
    stages = np.asarray(scenario.stages)
    live = [stages > i for i in range(len(busy))]
    util = (
        sum(
            (
                np.where(on, np.minimum(x / makespan, 1.0), 0.0)
                for x, on in zip(busy, live, strict=True)
            ),
            np.zeros(()),
        )
        / stages
    )

    share = verified * v / tokens  # decode share of a forward message (the DES's rule)
    wire = sum(
        ring_sums(
            scenario,
            lambda link, n: n * (1 + expected_losses(link.loss_rate)),
            per_hop(steady.forward_bytes, lambda n: n * share),
            steady.return_bytes,
        )
    )
    ones = np.ones_like(lap)
    means = {
        "tokens_per_s": 1e3
        * np.asarray(parts["rate_factor"])
        * ((1.0 - last) / lap + last * passes * wave["inverse_ms"]),
        "throughput_tokens_per_s": 1e3 * requests * (m + 1) / makespan,
        "tau": parts["tau"],
        "lap_ms_mean": lap,
        "tpot_ms_mean": ((1.0 - last) * passes * lap + last * wave["decode_ms"]) / m,
        "ttft_ms_mean": measured,
        "bubble_fraction": 1.0 - util,
        "bytes_per_token": cycle * wire / (b * m),
        "wasted_token_fraction": 1.0 - m / (passes * v),
        "target_exact": np.full(np.shape(lap), speculation.target_exact(scenario)),
        "tokens_per_pass": v * ones,
        "draft_ms": steady.draft_ms * ones,
        "stage_compute_ms": (sum(steady.stage_ms, np.zeros(())) - steady.draft_ms) / stages,
        "forward_hops_ms": steady.forward_hops_ms * ones,
        "return_hop_ms": steady.return_hop_ms * ones,
        "prefill_ms": ttft,
        "passes_per_request": passes * ones,
        "lap_ms_var": steady.hop_var_ms2 * ones,
        "lone_lap_ms": steady.lone_lap_ms * ones,
        "bottleneck_ms": steady.bottleneck_ms * ones,
        "convoy_wait_ms": behind * ones,
        "micro_batch_size": b * ones,
        "pass_tokens": tokens * ones,
        "chunk_pass_tokens": heavy_tokens * ones,
        "makespan_ms": makespan,
    }
    return MicroBatchedRun(means, busy, steady)


def micro_batched_metrics(scenario, parts: dict) -> dict:
    """:func:`micro_batched_run`'s mean metrics (the grid's entry point)."""
    return micro_batched_run(scenario, parts).means
