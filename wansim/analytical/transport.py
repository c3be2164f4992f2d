"""``network.transport: tcp`` in the analytical engine: the sync schedule, one request (or one
micro-batch) followed from its start; several frames a lap as trains, with a window range.

Each hop carries one message per lap. Its busy time under the window
(:class:`wansim.links.tcp.TcpSender`, the code the DES and the emulator run) beyond the ideal
transport's serialisation becomes the hop's per-message cost, and the ideal closed forms do
the rest. Which window a frame meets depends on the lap (a longer lap lets the window
restart), and the lap on the windows: a ring can be bistable, warm (frames back inside the RTO
keep the windows open, so the lap stays short) or cold (every frame from the initial window,
so the lap stays long). The DES picks by its start, so the model follows the ring from its
start (:func:`ring_start_costs_ms`): the first pass carries the prompt(s) from cold
connections, then verify frames each leave when the one before has returned (mean compute and
sizes, the DES's sender), and the settled frames' costs are the per-message costs. A first
wave whose prompts open the windows for frames that come back within the RTO leaves the ring
warm (100 Mbit/s, 5 ms, one micro-batch of 4: a fixed point started cold stayed cold, -26% on
tokens/s; followed from the start -3.5%). One request at a time, the ring is followed request
by request (:func:`request_walk_ms`): a prefill, which skips a first-stage drafter, can come
back inside the RTO where the verify laps idle past it, so a ring cold for its first request
can run warm for the rest (agreement hunt seed 1429); and a prompt's slow frames lengthen the
gaps after them, so the windows restart behind it (seed 58). The prefill message's window
cost, from that walk, is added to TTFT (:func:`prefill_extra_ms`). Requests that differ in
length are walked together, each meeting the windows its neighbours left
(:func:`mixed_request_walk_ms`), and each length node answered from its share of that walk.

Several requests or async blocks in flight (lossless, without batching): each hop sees
``in_flight`` messages a lap (:func:`messages_in_flight`), taken as a periodic train of period
lap / in_flight, whose settled busy time becomes the per-message cost; the lap is the full
ideal model's (concurrent requests, the block schedule), iterated from a cold connection as
above; a frame carrying a prompt costs at least its open-window cost (a round trip per
window beyond the first where it is bigger than ``max_window_bytes``:
:func:`_with_prompt_window`); the prefill's own walk is for one request at a time only.
Assumes the messages evenly spaced: bunched frames and prefills among them (slow links) change when the
window restarts (100 Mbit/s, 8 requests: +33% on tokens/s, tests/physics/test_tcp_loaded.py;
an async window, whose blocks leave S0 back to back and empty at each lost bet, comes as a
burst once a lap: window 4 on the 40 Mbit/s consumer ring +101%), so such points are
``validated: false``. A mean-value walk of the ring's frames (deterministic compute, no
cancellations; tried) bunched them for good and missed the other way where the DES's random
acceptance spreads them (-57% to -62% on the frame-per-lap ring with 8 requests or a window
of 4, +93% on agreement hunt seed 276): not kept.

One micro-batch (``batching: continuous``, ``micro_batches: 1``, lossless): the batch's
members and joiners' prompts share each pass, so each hop carries one frame a lap, the batch's
(its members: the serving slots, :func:`one_pass`), followed from its start as above; the
costs go into the micro-batched model (:mod:`wansim.analytical.micro_batched`). A
replacement's prompt rides a pass whose frame is bigger: its window cost beyond the verify
frame's is added to TTFT (:func:`prompt_window_ms`; the other members' laps through that pass
are not charged). On the frame-per-lap ring against the DES: tokens/s -3.5% to +2.1%, TTFT
-8.7% to -0.8% (without the prompt's window -15.6% and -10.7% with restart after idle;
tests/physics/test_tcp_loaded.py). Several micro-batches: one frame a lap per micro-batch
(:func:`messages_in_flight`), a frame holding one micro-batch's members (:func:`one_pass`),
taken as an evenly spaced train as for several requests (no prompt window in TTFT). They
start together and travel as a platoon, bunched or spread by their history, and the window
restarts or stays open accordingly (2 and 4 micro-batches of 8 requests on that ring: the
evenly spaced train +458% and +403% on tokens/s; a platoon spaced by the slowest station
fixed these and broke agreement hunt seeds 174 and 276, -19% -> +61% and -14% -> +92%, not
kept). Continuous batching without micro-batches (:func:`batch_runs_apart`): a stage takes
every pass waiting in its mailbox as one batch, so the batch holds together only where passes
queue; a replacement's prompt and then its verify passes travel as a group of their own, and
on a lightly loaded ring the groups never meet again. Under the window they drift apart even
more: the whole batch's frame, from a cold window, takes round trips that a request's frame
does not. On the frame-per-lap ring (96 requests, 4 to 16 users, 1 Gbit/s and 100 Mbit/s)
the DES's tokens/s lay within 2% of the same requests without batching in 5 of 8 variants
and up to 42% below it where compute dominates (groups merge). So the point answer is the
requests apart (:func:`requests_apart`, the loaded model above, ``validated: false``), and
its range spans the structures the batch can take: the requests apart, the lockstep batch
(:mod:`wansim.analytical.batched`) and, sync, 2, 4, ... micro-batches
(:func:`batch_structures`), each with every window closed and open. The lockstep
batch's window range alone had the DES 14% to 55% above its open end (8 and 16 users on that
ring, 100 Mbit/s and 5 ms).

The window range. Where the walk does not follow the windows (several frames a lap, a lossy
micro-batch: :func:`walk_misses_windows`) the answer is ``validated: false`` and carries
``approximation["range"]``: tokens/s, throughput and the mean lap with every frame's window
closed and with every window open (:func:`window_extremes`), prompts' frames included (the
point answer charges them a verify frame's window: hunt seed 1571, 1 MB prompts on 120 ms
round trips, +224%). Each message's window cost lies between the two whatever the spacing
the run gives the frames, so the DES lies between, up to the loaded models' own error: on
the frame-per-lap ring (2 to 8 requests, 1% loss, an async window, 1 to 4 micro-batches)
within 15% plus twice the DES's half-width of the range where the point answer was -45% to
+458% off (tests/physics/test_tcp_loaded.py); likewise all 90 such points of the agreement
hunts (seeds 0-299, 1450-3599; the per-round hybrid, whose two schedules' frames differ,
carries no range).

Loss, one request in the sync schedule: a loss leaves ssthresh at half the flight, and the
windows after it grow from there (with restart after idle, every frame slow-starts only up to
that ssthresh): the hop's train is run with its losses spread evenly, one every 1 / E[G]
messages (:func:`wansim.links.tcp.lossy_train_costs_ms`), its mean busy time the per-message
cost and its mean repair the equivalent ring's retransmission wait; the prefills meet the
windows those losses leave (:func:`wansim.links.tcp.prefill_busy_ms` with ``loss_rate``).
Evenly spaced losses understate the clumps of random ones (1% loss on the frame-per-lap
ring: tokens/s -1%, TTFT -13%; ``validated: false``). Where the run expects fewer than one
loss a stretch, one loss's excess is weighted by where the run's first loss falls (its window
does not recover within the run; hunt seed 127, 0.1%: -76% -> -12%). Loss with several
requests or async blocks: the lossy train at lap / in_flight apart, with the window range
(above): a prefill on a shrunken window holds the FIFO sender for every frame behind it, which
the train does not see (+136% to +170% at 4 requests, 1% loss); a lossy micro-batch likewise
(-45% on tokens/s with one micro-batch of 8).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from wansim.config.network import HopOverride
from wansim.config.scenario import Scenario
from wansim.links.delivery import wire_ms
from wansim.links.tcp import (
    lossy_train_costs_ms,
    open_window_busy_ms,
    periodic_busy_ms,
    prefill_busy_ms,
    tcp_params,
)

ITERATIONS = 8
REQUEST_WALK_PASSES = 256  # one request at a time: walked request by request up to this E[N]
SETTLE_LAPS = 16  # laps a ring followed from its start runs before it may stop as settled


def tcp_as_ideal(
    scenario: Scenario,
    lap_ms,
    parts: dict,
    in_flight: float = 1.0,
    settled=None,
) -> Scenario:
    """The ideal-transport scenario whose hops cost what TCP costs at a lap of ``lap_ms`` with
    ``in_flight`` messages a lap on each hop; ``settled``: the lossless hops' window costs
    of one frame a lap followed from the start (:func:`ring_start_costs_ms`), which the lap
    does not move (module docstring)."""
    from wansim.analytical.sync import ring_message_bytes
    from wansim.links.expected_delay import expected_losses

    net = scenario.network
    tcp = tcp_params(net)
    hops = scenario.resolved_hops()
    sizes = ring_message_bytes(scenario, parts)
    period = float(lap_ms) / max(float(in_flight), 1.0)
    # the run's messages on a hop: every request's prefill and verify frames
    run = int(scenario.workload.requests * (float(np.asarray(parts["passes"])) + 1.0))
    prompts = _prompt_frames(scenario, [float(x) for x in sizes])
    overrides, repairs = [], []
    for h, (hop, size) in enumerate(zip(hops, sizes, strict=True)):
        wire = float(wire_ms(size, hop.bandwidth_mbps))
        per_byte = 0.0
        if hop.loss_rate > 0:  # the lossy train's means (module docstring)
            busy, repair = lossy_train_costs_ms(
                tcp,
                hop.bandwidth_mbps,
                hop.latency_ms,
                hop.retransmit_ms,
                float(size),
                period,
                hop.loss_rate,
                run_messages=run,
            )
            losses = float(expected_losses(hop.loss_rate))
            repairs.append((hop.loss_rate, repair / losses - wire))
            extra = max(busy - wire * (1.0 + losses), 0.0)  # the ideal ring re-sends the frame
        elif settled is not None:  # one frame a lap: the ring followed from its start
            extra = max(settled[h] - wire, 0.0)
        else:  # a train of in_flight frames a lap
            busy = periodic_busy_ms(
                tcp, hop.bandwidth_mbps, hop.latency_ms, hop.retransmit_ms, size, period
            )
            extra = max(busy - wire, 0.0)
        if settled is None and h < len(prompts) and prompts[h] > size:
            extra, per_byte = _with_prompt_window(tcp, hop, float(size), prompts[h], extra)
        overrides.append(
            HopOverride(
                latency_ms=hop.latency_ms,
                bandwidth_mbps=hop.bandwidth_mbps,
                jitter=hop.jitter,
                loss_rate=hop.loss_rate,
                per_message_ms=hop.per_message_ms + extra,
                codec_ms_per_mb=hop.codec_ms_per_mb + per_byte * 1e6,
            )
        )
    return _ideal_with(scenario, overrides, repairs)


def _prompt_frames(scenario: Scenario, sizes: list[float]) -> list[float]:
    """Per forward hop, the bytes of a frame that carries a prompt (or its chunk): a request's
    own prefill message without batching, else the batched pass's frame (``sizes``) plus a
    joiner's prompt."""
    from wansim.analytical.path import hop_bytes
    from wansim.analytical.sync import prefill_sizes

    if scenario.schedule.batching == "none":
        pre = prefill_sizes(scenario, prompt_chunk_tokens(scenario))
        return [float(hop_bytes(pre, h)) for h in range(len(sizes) - 1)]
    return [v + p for v, p in zip(sizes, prompt_frame_bytes(scenario), strict=False)]


def _with_prompt_window(tcp, hop, size: float, prompt: float, extra: float):
    """(fixed ms, ms per byte) beyond serialisation on a hop of a loaded train: a verify
    frame of ``size`` bytes costs ``extra``, a frame carrying a prompt at least what it costs
    with the window open (:func:`~wansim.links.tcp.open_window_busy_ms`: one bigger than the
    widest window waits a round trip per window it needs, a cost no spacing of the train
    removes; seed 3442 of the agreement hunt: 4.2 MB prompts on 10 Gbit/s hops with 50 ms
    round trips and a 4 MB window, the answer +140% against the DES and above its own
    range's open end without it). A part per byte through the two sizes; never a negative
    fixed part (then the part per byte alone, exact at the prompt)."""
    args = (tcp, hop.bandwidth_mbps, hop.latency_ms, hop.retransmit_ms, prompt)
    grown = open_window_busy_ms(*args) - float(wire_ms(prompt, hop.bandwidth_mbps))
    per_byte = max((grown - extra) / (prompt - size), 0.0)
    fixed = extra - per_byte * size
    if fixed < 0.0:
        return 0.0, max(grown, 0.0) / prompt
    return fixed, per_byte


def _ideal_with(scenario: Scenario, overrides: list, repairs: list) -> Scenario:
    """``scenario`` on the ideal transport with hops ``overrides`` and, for lossy hops, one
    retransmission wait for the ring: the loss-weighted mean of ``repairs`` ((q, wait ms))."""
    network = dataclasses.replace(scenario.network, transport="ideal", hops=tuple(overrides))
    if repairs:
        weight = sum(q for q, _ in repairs)
        wait = sum(q * r for q, r in repairs) / weight
        network = dataclasses.replace(network, retransmit_ms=max(wait, 0.0))
    return dataclasses.replace(scenario, network=network)


def prompt_window_ms(scenario: Scenario) -> float:
    """One micro-batch: what a replacement's prompt adds to its TTFT under the window beyond
    the ideal equivalent's charge (its bytes' serialisation and the verify frame's window
    cost): per forward hop, the window cost of a settled ring's pass whose frame also carries
    the prompt (or, chunked, each of its chunks' passes) less the verify frame's
    (:func:`ring_start_costs_ms`)."""
    from wansim.analytical.sync import lap_parts, ring_message_bytes
    from wansim.serving.micro_batching import prefill_chunks

    parts = lap_parts(one_pass(scenario))
    prompts = prompt_frame_bytes(scenario)
    verify, probe = ring_start_costs_ms(scenario, parts, prompts)
    sizes = ring_message_bytes(scenario, parts)
    extra = 0.0
    for h, hop in enumerate(scenario.resolved_hops()[:-1]):
        grown = float(wire_ms(sizes[h] + prompts[h], hop.bandwidth_mbps))
        probe_window = probe[h] - grown
        verify_window = verify[h] - float(wire_ms(sizes[h], hop.bandwidth_mbps))
        extra += max(probe_window - max(verify_window, 0.0), 0.0)
    chunks = float(
        np.asarray(
            prefill_chunks(scenario.workload.prompt_tokens, scenario.schedule.prefill_chunk_tokens)
        )
    )
    return chunks * extra


def one_pass(scenario: Scenario) -> Scenario:
    """The scenario whose :func:`~wansim.analytical.sync.lap_parts` describe one frame of the
    ring: with one micro-batch its members are the serving slots
    (:func:`~wansim.serving.micro_batching.serving_slots`: ``max_batch_size`` caps them), not
    every user; with N' micro-batches holding sequences, a frame holds one of them (the
    slots / N', rounded)."""
    from wansim.serving.micro_batching import active_batches, serving_slots

    if scenario.schedule.batching == "none":
        return scenario
    slots = int(np.asarray(serving_slots(scenario)))
    if scenario.schedule.micro_batches is not None:  # N' micro-batches: a frame holds one
        slots = max(round(slots / int(np.asarray(active_batches(scenario)))), 1)
    return dataclasses.replace(
        scenario, workload=dataclasses.replace(scenario.workload, concurrency=slots)
    )


def prompt_chunk_tokens(scenario: Scenario) -> int:
    """The prompt tokens one pass carries for a request: its prompt, or a chunk of it."""
    prompt = scenario.workload.prompt_tokens
    return min(prompt, scenario.schedule.prefill_chunk_tokens or prompt)


def prompt_frame_bytes(scenario: Scenario) -> list[float]:
    """Per forward hop, the bytes a prompt (or its chunk) adds to a batched pass's frame."""
    from wansim.analytical.path import hop_bytes
    from wansim.analytical.sync import prefill_sizes

    header = float(scenario.payload.header_bytes)
    sizes = prefill_sizes(scenario, prompt_chunk_tokens(scenario))
    return [float(hop_bytes(sizes, h)) - header for h in range(int(scenario.stages) - 1)]


@dataclasses.dataclass
class _Ring:
    """A ring that carries one frame a lap, for following it pass by pass (deterministic: mean
    compute, mean sizes, latencies; :class:`wansim.links.delivery.HopSender`, the DES's sender).
    ``first``: the first pass's frames (the first wave's prompts, every slot's of one
    micro-batch; the return hop a verify frame's), ``prefill_ms`` its per-stage times (with a
    last-stage drafter's first block), ``verify``/``verify_ms`` a verify pass's, ``final_ms``
    a request's final pass's (a finished request leaves: no drafting after its verdicts)."""

    scenario: Scenario
    first: list[float]
    prefill_ms: list[float]
    verify: list[float]
    verify_ms: list[float]
    final_ms: list[float]
    # the closest any send came to the RTO when the window's restart after idle was decided
    # (ms; :func:`restart_margin_ms`), the walk's running minimum as the ring is followed
    margin_ms: float = dataclasses.field(default=math.inf, repr=False)

    @classmethod
    def of(cls, scenario: Scenario, parts: dict) -> _Ring:
        from wansim.analytical.path import hop_bytes
        from wansim.analytical.sync import prefill_sizes, ring_message_bytes
        from wansim.stages.compute import stage_ms_each

        p = int(scenario.stages)
        verify = [float(x) for x in ring_message_bytes(scenario, parts)]
        batch = float(np.asarray(parts["batch"]))  # the frame's members (one_pass)
        wave_tokens = batch * prompt_chunk_tokens(scenario)
        wave = prefill_sizes(scenario, wave_tokens)
        first = [float(hop_bytes(wave, h)) for h in range(p - 1)] + [verify[-1]]
        tokens = batch * float(parts["tokens"])
        verify_ms = [float(x) for x in stage_ms_each(scenario, tokens, sequences=batch)]
        prefill_ms = [float(x) for x in stage_ms_each(scenario, wave_tokens, sequences=batch)]
        final_ms = list(verify_ms)
        if scenario.speculation.policy != "none":  # the drafter's passes, where it is hosted
            draft = float(np.asarray(parts["draft_ms"]))
            if scenario.drafter.placement == "first_stage":
                verify_ms[0] += draft
                final_ms[0] += draft
            else:  # after the verdicts: the first block after the prefill, none after the last
                verify_ms[p - 1] += draft
                prefill_ms[p - 1] += draft
        return cls(scenario, first, prefill_ms, verify, verify_ms, final_ms)

    def senders(self) -> list:
        from wansim.links.delivery import HopSender

        tcp = tcp_params(self.scenario.network)
        return [
            HopSender(
                h.bandwidth_mbps,
                h.per_message_ms,
                h.codec_ms_per_mb,
                h.retransmit_ms,
                h.latency_ms,
                tcp,
            )
            for h in self.scenario.resolved_hops()
        ]

    def lap(self, senders, sizes, stages, at, closes=True) -> tuple[list[float], float]:
        """One pass leaving S0 at ``at``: each hop's window cost (busy time beyond its
        software cost) and when it is back at S0; with ``closes`` False a request's final
        pass, which ends at the last stage's verdict (nothing returns: a cost of 0)."""
        from wansim.links.delivery import software_ms

        hops = self.scenario.resolved_hops()
        costs = []
        for h, (hop, sender) in enumerate(zip(hops, senders, strict=True)):
            if not closes and h == len(hops) - 1:
                return [*costs, 0.0], at + stages[h]
            soft = software_ms(sizes[h], hop.per_message_ms, hop.codec_ms_per_mb)
            tcp = sender.tcp
            if tcp is not None and tcp.params.restart_after_idle:
                idle = sender.window_idle_ms(at + stages[h], sizes[h])
                if idle is not None:
                    self.margin_ms = min(self.margin_ms, tcp.restart_margin_ms(idle))
            start, free, at = sender.send(at + stages[h], sizes[h], 0, hop.latency_ms)
            costs.append(free - start - float(soft))
        return costs, at


def ring_start_costs_ms(
    scenario: Scenario,
    parts: dict,
    probe_bytes: list[float] | None = None,
    laps: int = 64,
    walked: Walked | None = None,
) -> tuple[list[float], list[float] | None]:
    """Each hop's window cost per verify frame (busy time beyond its software cost) on a ring
    that carries one frame a lap (``parts``: ``lap_parts(one_pass(scenario))``), followed from
    the run's start (:class:`_Ring`): a first pass carrying the first wave's prompts from cold
    connections, then verify passes, each leaving stage 0 when the one before has returned;
    the mean over the settled cycle of the last laps. So a prompt that opens the windows for
    verify frames that come back within the RTO leaves the ring warm, where a fixed point
    started cold would stay cold. One request at a time, the run's requests one after another
    (:func:`request_walk_ms`, or ``walked``: a mixed walk's). With ``probe_bytes`` (per hop),
    also the cost of one more pass
    whose forward frames are that much bigger (a pass that carries a prompt beside the verify
    blocks) in the settled ring."""
    from wansim.links.tcp import settled_cycle

    if probe_bytes is None:
        walked = walked or request_walk_ms(scenario)
        if walked is not None:
            return list(walked[0]), None
    ring = _Ring.of(scenario, parts)
    senders = ring.senders()
    _, t = ring.lap(senders, ring.first, ring.prefill_ms, 0.0)
    busy: list[list[float]] = [[] for _ in ring.verify]
    windows: list[list[float]] = [[] for _ in range(2 * len(ring.verify))]
    for n in range(1, laps + 1):
        costs, t = ring.lap(senders, ring.verify, ring.verify_ms, t)
        for h, cost in enumerate(costs):
            busy[h].append(cost)
        for series, value in zip(windows, _window_state(senders), strict=True):
            series.append(value)
        settled = all(map(settled_cycle, busy + windows))
        if probe_bytes is None and n >= SETTLE_LAPS and settled:
            break  # every hop repeats its cycle (a probe meets the window of all the laps)
    out = []
    for values in busy:
        cycle = settled_cycle(values)
        out.append(values[-1] if cycle <= 1 else math.fsum(values[-cycle:]) / cycle)
    if probe_bytes is None:
        return out, None
    probe = [v + x for v, x in zip(ring.verify, [*probe_bytes, 0.0], strict=True)]
    return out, ring.lap(senders, probe, ring.verify_ms, t)[0]


# (verify frame, prompt frame) window costs, and the restart decisions' closest margin (ms)
Walked = tuple[tuple[float, ...], tuple[float, ...], float]


@functools.lru_cache(maxsize=16)
def request_walk_ms(scenario: Scenario) -> Walked | None:
    """One request at a time (no batching, 1 <= E[N] <= :data:`REQUEST_WALK_PASSES`): per hop,
    the mean window cost of a verify frame, and per forward hop the mean window cost of a
    prompt's frame (its busy time beyond its software cost), over the run's requests walked
    one after another, and the walk's closest restart margin (:func:`restart_margin_ms`);
    None where the walk does not apply. Each request is a prefill pass (its prompt's frames; a
    first-stage drafter has not drafted yet) leaving S0 at the previous request's last verdict (a
    finished request leaves: its final pass sends nothing back, and a last-stage drafter
    drafts nothing after it), then its verify passes (E[N] spread evenly: request r makes
    floor((r + 1) E[N]) - floor(r E[N]) of them). The requests are walked until their costs
    repeat (a cycle of requests), the rest of the run counted as that cycle. So every gap a
    frame meets is the ring's own under the window (settled only where the windows repeat
    too: :func:`_window_state`): a prompt's slow frames lengthen the gap
    to the next hop's prompt and to the first verify frame, and the window restarts there
    (agreement hunt seed 58: a 1 MB prompt on a ring warmed only by 2 kB frames). A ring
    whose verify laps idle just past the RTO stays cold within a request but a prefill, which
    skips the drafter, can come back inside it and find the window the previous request
    opened (agreement hunt seed 1429: the first request cold, every other warm; the walk of
    one request from its start stayed cold, -31% on tokens/s)."""
    from wansim.links.tcp import settled_cycle

    walkable = _walkable(scenario)
    if walkable is None:
        return None
    ring, passes = walkable
    senders = ring.senders()
    requests = int(scenario.workload.requests)
    hops = len(ring.verify)
    totals: list[list[float]] = [[] for _ in range(hops)]  # per hop, each request's summed cost
    prompts: list[list[float]] = [[] for _ in range(hops - 1)]  # per forward hop, its busy
    windows: list[list[float]] = [[] for _ in range(2 * hops)]  # each sender's cwnd, ssthresh
    counts: list[int] = []
    t = 0.0
    for r in range(requests):
        n = math.floor((r + 1) * passes) - math.floor(r * passes)
        prompt, sums, t = _walk_request(ring, senders, n, t)
        for h in range(hops - 1):
            prompts[h].append(prompt[h])
        for h in range(hops):
            totals[h].append(sums[h])
        counts.append(n)
        for series, value in zip(windows, _window_state(senders), strict=True):
            series.append(value)
        if r + 1 >= 3 and all(settled_cycle(v) for v in totals + prompts + windows):
            break
    walked = len(counts)
    series = totals + prompts + windows
    cycle = max(settled_cycle(v) for v in series) if walked < requests else 0
    if cycle:  # the requests left repeat the last cycle
        repeats = (requests - walked) / cycle
        frames = sum(counts) + repeats * sum(counts[-cycle:])
        verify = [(math.fsum(v) + repeats * math.fsum(v[-cycle:])) / frames for v in totals]
        prompt = [(math.fsum(v) + repeats * math.fsum(v[-cycle:])) / requests for v in prompts]
    else:
        verify = [math.fsum(v) / max(sum(counts), 1) for v in totals]
        prompt = [math.fsum(v) / walked for v in prompts]
    return tuple(verify), tuple(prompt), ring.margin_ms


MIXED_WALK_REQUESTS = 128  # requests that differ: the most a mixed walk follows ...
MIXED_WALK_PASSES = 8192  # ... or fewer, once it has walked this many passes
MIXED_NODE_PASSES = 1024  # the longest node's E[N] a mixed walk takes on
MIXED_WALK_SEED = 0  # the walk's fixed sequence of kinds (the answer is deterministic)


def mixed_request_walk_ms(
    weighted: list[tuple[float, Scenario]], requests: int, order=None
) -> list | None:
    """Requests that differ (lengths), one at a time: each node's (weight, scenario of like
    requests; :func:`wansim.analytical.mixture.nodes`) :data:`Walked` costs from one walk in
    which the nodes' requests follow each other, as the run's do, instead of each node's own
    walk of like requests (:func:`request_walk_ms`); None where a node is not walkable. The
    windows a request meets are the ones its predecessors left, whatever their lengths: a ring
    is bistable where a short request's slow prompt restarts the windows behind it and a long
    one's many frames open them for the next prompt (3 stages, 20 ms hops, 10 Gbit/s,
    lognormal outputs of mean 128 and cv 0.78: the node of 31-token outputs walked alone stayed
    cold, TTFT 381 ms, where in the DES every request's was ~140 ms: the run's mean TTFT +22%,
    now +0.1%; tests/physics/test_tcp.py). The sequence: :data:`MIXED_WALK_REQUESTS`
    requests whose kinds are drawn by
    weight from a fixed generator (:data:`MIXED_WALK_SEED`; pairs of neighbours as independent
    as the run's draws), cut once :data:`MIXED_WALK_PASSES` passes are walked; each node's
    verify passes spread evenly over its own requests. ``order``: the run's own sequence of
    nodes where the workload fixes it (a trace's rows in order), walked instead. A node's
    means are over its requests after the first (warm); the run's first request is cold, which
    adds its node's cold excess (that request walked alone from fresh connections, less the
    node's warm mean) over the node's share of the run's requests -- with ``order`` the first
    request's node; else each node's, once in ``requests`` (the expectation over which node
    comes first) -- (over their E[N] frames for the verify costs). A node the sequence never
    drew keeps its own walk."""
    kinds = [_walkable(node, MIXED_NODE_PASSES) for _, node in weighted]
    if not kinds or any(k is None for k in kinds):
        return None
    w = np.array([float(x) for x, _ in weighted])
    w = w / w.sum()
    drawn = order is None
    if drawn:
        order = np.random.default_rng(MIXED_WALK_SEED).choice(
            len(kinds), size=MIXED_WALK_REQUESTS, p=w
        )
    hops = len(kinds[0][0].verify)
    prompt_sum = np.zeros((len(kinds), hops - 1))
    verify_sum = np.zeros((len(kinds), hops))
    seen = np.zeros(len(kinds), dtype=int)  # each kind's requests so far
    frames = np.zeros(len(kinds))
    senders = kinds[0][0].senders()
    t, walked_passes = 0.0, 0
    for r, k in enumerate(order):
        ring, passes = kinds[k]
        c = int(seen[k])
        n = math.floor((c + 1) * passes) - math.floor(c * passes)
        prompt, sums, t = _walk_request(ring, senders, n, t)
        seen[k] += 1
        walked_passes += n + 1
        if r > 0:  # the first request is cold: counted once in the run below
            prompt_sum[k] += prompt
            verify_sum[k] += sums
            frames[k] += n
        if walked_passes >= MIXED_WALK_PASSES:
            break
    warm = seen - (np.arange(len(kinds)) == order[0])
    margin = min(ring.margin_ms for ring, _ in kinds)
    out = []
    for k, (ring, passes) in enumerate(kinds):
        if warm[k] == 0:
            out.append(request_walk_ms(weighted[k][1]))
            continue
        prompt = prompt_sum[k] / warm[k]
        verify = verify_sum[k] / max(frames[k], 1.0)
        if drawn or k == order[0]:  # the cold first request's share of this node's requests
            share = requests if drawn else max(w[k] * requests, 1.0)
            n = math.floor(passes)
            cold_prompt, cold_sums, _ = _walk_request(ring, ring.senders(), n, 0.0)
            prompt = prompt + (np.asarray(cold_prompt) - prompt) / share
            verify = verify + (np.asarray(cold_sums) - n * verify) / (share * passes)
        out.append((tuple(float(x) for x in verify), tuple(float(x) for x in prompt), margin))
    return out


def restart_margin_ms(scenario: Scenario) -> float | None:
    """One request at a time on a tcp ring with restart after idle: how close to the RTO the
    request walk's closest restart decision came (ms: |idle - RTO| of a send after an idle,
    the walk's transient included), None where the walk does not apply. A ring can be
    bistable (warm: short prompt laps keep the windows open; cold: slow prompts behind
    restarted windows make the laps that restart them), and a decision within a few ms of the
    RTO lets the run's jitter pick the branch for many requests: a 3-stage ring at 20 ms hops with
    2.45 ms of lognormal jitter (decided 2.4 ms from its 300 ms RTO) ran its first 12
    requests cold (TTFT ~520 ms each, mean 242 ms) on one DES seed and warm on two others
    (mean ~137 ms), the walk warm (137.6)."""
    walked = request_walk_ms(scenario)
    return None if walked is None else walked[2]


def _walkable(scenario: Scenario, most: float = REQUEST_WALK_PASSES) -> tuple[_Ring, float] | None:
    """The ring and E[N] of a scenario the walks follow: one request's frame a lap (no
    batching), E[N] from 1 (two output tokens: a prefill and a verify pass) to ``most``."""
    from wansim.analytical.sync import lap_parts

    parts = lap_parts(one_pass(scenario))
    passes = float(np.asarray(parts.get("passes", 0.0)))
    if not (
        float(np.asarray(parts["batch"])) <= 1
        and scenario.schedule.batching == "none"
        and 1.0 <= passes <= most
    ):
        return None
    return _Ring.of(scenario, parts), passes


def _window_state(senders) -> list[float]:
    """Each hop's congestion window and slow-start threshold (bytes; a large finite stand-in
    for an unset threshold): a walk has settled only where these repeat too, since equal
    busy times can hide a window still growing underneath (a 262 kB prompt that takes the
    same round trips request after request while the window grows by it each time, until it
    fits: 19 requests at TTFT ~186 ms, then ~111)."""
    out = []
    for sender in senders:
        tcp = sender.tcp
        out += [tcp.cwnd, min(tcp.ssthresh, 1e300)] if tcp is not None else [0.0, 0.0]
    return out


def _walk_request(ring: _Ring, senders, n: int, t: float):
    """One request from ``t`` (its prompt leaving S0): its prefill pass and ``n`` verify
    passes, the last ending at its verdict. (per forward hop its prompt frame's window cost,
    per hop its frames' summed window cost -- the return hop: the prefill's and n - 1
    verdicts' --, when the next request's prompt leaves S0)."""
    opened, t = ring.lap(senders, ring.first, ring.prefill_ms, t)
    sums = [0.0] * (len(opened) - 1) + [opened[-1]]
    for i in range(n):
        last = i == n - 1
        stages = ring.final_ms if last else ring.verify_ms
        costs, t = ring.lap(senders, ring.verify, stages, t, closes=not last)
        sums = [a + c for a, c in zip(sums, costs, strict=True)]
    return opened[:-1], sums, t


def batch_runs_apart(scenario: Scenario) -> bool:
    """A tcp ring with continuous batching and no ``schedule.micro_batches``: the batch's
    groups drift apart (module docstring), answered as :func:`requests_apart`."""
    sched = scenario.schedule
    return (
        scenario.network.transport == "tcp"
        and sched.batching == "continuous"
        and sched.micro_batches is None
    )


def requests_apart(scenario: Scenario) -> Scenario:
    """The scenario's requests without batching (each its own group of one): the same
    requests, drafter and schedule kind, ``schedule.batching: none``."""
    return dataclasses.replace(
        scenario, schedule=dataclasses.replace(scenario.schedule, batching="none")
    )


def batch_structures(scenario: Scenario) -> list[Scenario]:
    """The groups a continuous batch without micro-batches can travel as, besides its
    requests apart: the lockstep batch (the scenario itself) and, in the sync schedule, its
    users as G = 2, 4, 8, ... micro-batches up to one each (``schedule.micro_batches``: G
    lockstep groups that pipeline; a group of a few both pipelines and batches, so the DES can
    outrun the lockstep batch and the requests apart alike: 16 users on the frame-per-lap ring
    +27% above both, inside the 8 micro-batches' answer)."""
    from wansim.serving.micro_batching import serving_slots

    out = [scenario]
    if scenario.schedule.kind != "sync" or scenario.drafter.overlap:  # micro-batches: sync only
        return out
    slots = int(np.asarray(serving_slots(scenario)))
    groups = [g for g in (2**i for i in range(1, slots.bit_length())) if g < slots] + [slots]
    for g in dict.fromkeys(g for g in groups if g > 1):
        sched = dataclasses.replace(scenario.schedule, micro_batches=g)
        out.append(dataclasses.replace(scenario, schedule=sched))
    return out


def messages_in_flight(scenario: Scenario) -> float:
    """Messages a hop carries per lap: without batching one per request in flight, times the
    block schedule's window under async; micro-batched, one per micro-batch holding
    sequences (:func:`~wansim.serving.micro_batching.active_batches`)."""
    from wansim.serving.micro_batching import active_batches

    wl, sched = scenario.workload, scenario.schedule
    if sched.batching != "none":  # a frame a lap per micro-batch holding sequences
        return float(np.asarray(active_batches(scenario))) if sched.micro_batches else 1.0
    out = float(min(wl.concurrency, wl.requests))
    if sched.kind == "async":
        out *= float(sched.max_inflight_blocks)
    return out


def walk_misses_windows(scenario: Scenario) -> bool:
    """A tcp ring whose windows the ring's walk does not follow: several frames a lap
    (several requests without batching, an async window or an overlapped drafter's blocks,
    several micro-batches), whose spacing the run decides and an evenly spaced train stands
    in for, or a lossy micro-batch (its losses spread evenly over one frame a lap). Its
    answer carries the range of :func:`window_extremes` (not the per-round hybrid's, whose
    answer mixes two schedules' frames of different sizes)."""
    if scenario.network.transport != "tcp":
        return False
    from wansim.analytical.coverage import concurrent
    from wansim.speculation.block_schedule import uses_blocks
    from wansim.speculation.hybrid_rounds import is_hybrid

    if is_hybrid(scenario):  # two schedules' frames, each its own sizes: no one range
        return False
    if scenario.schedule.batching != "none":
        lossy = any(h.loss_rate > 0 for h in scenario.resolved_hops())
        return messages_in_flight(scenario) > 1 or lossy
    return bool(uses_blocks(scenario) or concurrent(scenario))


def window_extremes(scenario: Scenario) -> tuple[Scenario, Scenario]:
    """The ideal-transport equivalents of a tcp ring with every message's window closed and
    with every window open (:func:`window_cost_ms`), verify frames and frames carrying a prompt
    alike (each hop's cost beyond its serialisation as a fixed and a per-byte part through
    the two sizes). Every message's window cost lies between the two, whatever the frames'
    spacing: the run's own (a platoon that restarts its windows every lap, a train that keeps
    them open, frames that drift between) decides where (module docstring). The range spans
    the windows only: the loaded models' other approximations (queueing, faults, KV
    admission) come on top."""
    from wansim.analytical.sync import lap_parts, ring_message_bytes

    parts = lap_parts(one_pass(scenario))
    sizes = [float(x) for x in ring_message_bytes(scenario, parts)]
    prompts = _prompt_frames(scenario, sizes)
    tcp = tcp_params(scenario.network)
    run = int(scenario.workload.requests * (float(np.asarray(parts["passes"])) + 1.0))
    out = []
    for extreme in ("closed", "open"):
        overrides, repairs = [], []
        for h, hop in enumerate(scenario.resolved_hops()):
            prompt = prompts[h] if h < len(prompts) else 0.0
            override, repair = _hop_at_extreme(tcp, hop, sizes[h], prompt, extreme, run)
            overrides.append(override)
            if repair is not None:
                repairs.append((hop.loss_rate, repair))
        out.append(_ideal_with(scenario, overrides, repairs))
    return out[0], out[1]


def _hop_at_extreme(tcp, hop, size: float, prompt: float, extreme: str, run: int):
    """(the ideal hop, its repair wait beyond the frame's serialisation or None) whose costs
    are ``hop``'s window cost at ``extreme`` for a frame of ``size`` bytes and, where
    ``prompt`` is bigger, one of ``prompt`` bytes: a fixed part and a per-byte part through
    the two (never a negative fixed part: then the per-byte part alone, exact at the
    prompt's frame, a little dearer for the verify frame)."""
    from wansim.links.expected_delay import expected_losses

    resent = 1.0 + float(expected_losses(hop.loss_rate))  # the ideal ring re-sends the frame
    busy, repair = window_cost_ms(tcp, hop, size, extreme, run)
    wire = float(wire_ms(size, hop.bandwidth_mbps))
    extra, per_byte = busy - wire * resent, 0.0
    if prompt > size:
        grown = window_cost_ms(tcp, hop, prompt, extreme, run)[0]
        grown -= float(wire_ms(prompt, hop.bandwidth_mbps)) * resent
        per_byte = max((grown - extra) / (prompt - size), 0.0)
        extra = grown - per_byte * prompt
        if extra < 0.0:
            extra, per_byte = 0.0, max(grown, 0.0) / prompt
    override = HopOverride(
        latency_ms=hop.latency_ms,
        bandwidth_mbps=hop.bandwidth_mbps,
        jitter=hop.jitter,
        loss_rate=hop.loss_rate,
        per_message_ms=hop.per_message_ms + max(extra, 0.0),
        codec_ms_per_mb=hop.codec_ms_per_mb + per_byte * 1e6,
    )
    return override, None if repair is None else repair - wire


def window_cost_ms(tcp, hop, n_bytes: float, extreme: str, run_messages: int):
    """(busy ms, repair ms per loss or None without loss) of a message of ``n_bytes`` on
    ``hop`` at an extreme of its window. "open": a window as wide as it gets with nothing in
    flight (:func:`wansim.links.tcp.open_window_busy_ms`), a loss repaired by a fast
    retransmit (a round trip and a segment). "closed": the most a window costs, a cold
    connection's (the initial window; with loss, the lossy train of idle messages,
    :func:`wansim.links.tcp.lossy_train_costs_ms`) or the message at the full window's own
    rate (max_window_bytes a round trip: frames that queue, where the window and not the
    link sets the rate), whichever is more."""
    from wansim.links.expected_delay import expected_losses

    args = (tcp, hop.bandwidth_mbps, hop.latency_ms, hop.retransmit_ms, float(n_bytes))
    rtt = 2.0 * hop.latency_ms
    if extreme == "open":
        busy = open_window_busy_ms(*args)
        if hop.loss_rate <= 0:
            return busy, None
        return busy, rtt + min(tcp.mss_bytes, float(n_bytes)) * 8.0 / (hop.bandwidth_mbps * 1e3)
    saturated = float(n_bytes) * rtt / tcp.max_window_bytes
    if hop.loss_rate <= 0:
        return max(periodic_busy_ms(*args, math.inf), saturated), None
    busy, repair = lossy_train_costs_ms(*args, math.inf, hop.loss_rate, run_messages=run_messages)
    return max(busy, saturated), repair / float(expected_losses(hop.loss_rate))


def tcp_equivalent(
    scenario: Scenario, lap_of, in_flight: float = 1.0, walked: Walked | None = None
) -> Scenario:
    """Fixed point of lap -> TCP busy times -> lap; ``lap_of(scenario)`` is the ideal engine's
    mean lap and ``lap_parts`` its message sizes (``wansim.analytical.sync``). One frame a
    lap (``in_flight`` 1): the lossless hops' costs followed from the start instead
    (:func:`ring_start_costs_ms`), which the lap does not move."""
    from wansim.analytical.sync import lap_parts

    parts = lap_parts(one_pass(scenario))
    one = float(in_flight) <= 1.0
    settled = ring_start_costs_ms(scenario, parts, walked=walked)[0] if one else None
    lap = math.inf  # a connection starts cold (cwnd = IW), as the DES's and a real one do
    out = scenario
    for _ in range(ITERATIONS):
        out = tcp_as_ideal(scenario, lap, parts, in_flight, settled)
        new = float(np.asarray(lap_of(out)))
        if math.isfinite(lap) and abs(new - lap) <= 1e-9 * max(lap, 1.0):
            break
        lap = new
    return out


def prefill_extra_ms(
    scenario: Scenario, equivalent: Scenario, lap_ms: float, walked: Walked | None = None
) -> float:
    """TTFT under TCP beyond what the ideal ``equivalent`` (:func:`tcp_equivalent`) charges:
    per forward hop, the prefill message's mean busy time under the window less the
    equivalent's (its serialisation plus the verify frame's window cost). The busy time is
    the request walk's (:func:`request_walk_ms`, or ``walked``: a mixed walk's) on lossless
    hops where it applies; else
    (lossy hops, E[N] beyond the walk) :func:`wansim.links.tcp.prefill_busy_ms`: each
    request's prefill, then its verify frames one ``lap_ms`` apart, with gaps from the ideal
    equivalent's pass (not the prompt's own window: its slow frames' restarts behind it are
    the walk's). The sender's idle gaps around a prefill follow where the hop lies on the
    ring: a pass reaches hop h after the stages and hops before it, a verify pass sooner than
    a prefill (less compute, smaller messages), so the gap from a request's last frame to the
    next prefill is a lap plus that difference, less what a finished request skips: the
    return hop (the next request enters at the last verdict) and a last-stage drafter's
    drafting; its first frame follows the prefill by the prefill's lap (with a last-stage
    drafter's first block) less that difference."""
    from wansim.analytical.path import hop_bytes
    from wansim.analytical.sync import lap_parts, prefill_sizes, ring_message_bytes
    from wansim.links.expected_delay import hop_mean
    from wansim.stages.compute import stage_ms_each

    tcp = tcp_params(scenario.network)
    parts = lap_parts(scenario)
    sizes = ring_message_bytes(scenario, parts)
    batch = float(np.asarray(parts["batch"]))
    prompt = batch * scenario.workload.prompt_tokens
    pre = prefill_sizes(scenario, prompt)
    hops, eq_hops = scenario.resolved_hops(), equivalent.resolved_hops()
    verify_stage = [
        float(x) for x in stage_ms_each(scenario, batch * float(parts["tokens"]), sequences=batch)
    ]
    prefill_stage = [float(x) for x in stage_ms_each(scenario, prompt, sequences=batch)]
    drafting = scenario.drafter.placement == "first_stage" and scenario.speculation.policy != "none"
    at_verify = float(np.asarray(parts["draft_ms"])) if drafting else 0.0  # pass start -> hop h
    at_prefill = 0.0
    p = int(scenario.stages)
    legs = []
    for h in range(p - 1):
        at_verify += verify_stage[h]
        at_prefill += prefill_stage[h]
        legs.append((at_verify, at_prefill))
        at_verify += float(hop_mean(eq_hops[h], sizes[h]))
        at_prefill += float(hop_mean(eq_hops[h], float(hop_bytes(pre, h))))
    back = float(hop_mean(eq_hops[p - 1], sizes[-1]))
    prefill_lap = at_prefill + prefill_stage[p - 1] + back
    # a finished request leaves at its last verdict: no drafting after it, nothing sent back
    # and a last-stage drafter drafts the first block after the prefill, a verify block after
    # each pass but the last
    after = 0.0
    if scenario.speculation.policy != "none" and not drafting:
        after = float(np.asarray(parts["draft_ms"]))
    closing = back + after
    walked = walked or request_walk_ms(scenario)
    extra = 0.0
    for h in range(p - 1):
        hop, size = hops[h], float(hop_bytes(pre, h))
        verify_at, prefill_at = legs[h]
        if walked is not None and hop.loss_rate <= 0:  # the ring's own gaps, walked
            charged = float(wire_ms(size, hop.bandwidth_mbps)) + eq_hops[h].per_message_ms
            extra += walked[1][h] + hop.per_message_ms - charged
            continue
        busy = prefill_busy_ms(
            tcp,
            hop.bandwidth_mbps,
            hop.latency_ms,
            hop.retransmit_ms,
            size,
            sizes[h],
            float(lap_ms),
            int(scenario.workload.requests),
            round(float(np.asarray(parts["passes"]))),
            to_first_frame_ms=prefill_lap + after - prefill_at + verify_at,
            to_prefill_ms=float(lap_ms) - closing - verify_at + prefill_at,
            loss_rate=hop.loss_rate,
        )
        charged = float(wire_ms(size, hop.bandwidth_mbps)) + eq_hops[h].per_message_ms
        extra += busy + hop.per_message_ms - charged
    return extra
