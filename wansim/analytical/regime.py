"""Which approximation answers a scenario, and how far it was measured to be from the DES.

Every analytical result carries ``approximation = {"regime", "validated", "error_band"}``:

- ``regime``: the model that produced it (the groups of ``docs/approximations.md``);
- ``error_band``: per metric, the largest error measured against the DES over that regime's
  grid (and over the agreement hunt's validated points, less twice the DES's half-width),
  rounded up (relative for tokens/s, throughput and TTFT; absolute for the bubble and
  wasted fractions) - the same numbers ``wansim.approximation_error`` checks;
- ``validated``: the scenario lies inside the measured domain of its regime. Outside it (a
  mechanism combination or a parameter range no measurement covered, or one where the
  agreement hunt found the model wrong) the result is still returned but says so, and
  ``optimize`` re-checks such a winner with the DES.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wansim.acceptance.model import quality_for
from wansim.analytical.transport import walk_misses_windows
from wansim.speculation.block_schedule import uses_blocks

RELATIVE = ("tokens_per_s", "throughput_tokens_per_s", "ttft_ms_mean")
ABSOLUTE = ("bubble_fraction", "wasted_token_fraction")


@dataclasses.dataclass(frozen=True)
class Regime:
    name: str
    model: str  # what is approximated (one line, with the module)
    error_band: dict[str, float]


def _band(tok, thr, ttft, bubble, wasted) -> dict[str, float]:
    return dict(zip(RELATIVE + ABSOLUTE, (tok, thr, ttft, bubble, wasted), strict=True))


# issue 13's regimes, measured by the approximation-error study (docs/approximations.md:
# the largest error over their grids, rounded up)
FAULTS_BAND = _band(
    0.03, 0.03, 0.11, 0.01, 0.01
)  # TTFT: the DES draws its Poisson failures (79 of the 96 expected at 30/h: -10.6%)
HYBRID_BAND = _band(0.12, 0.06, 0.01, 0.01, 0.02)

REGIMES: dict[str, Regime] = {
    r.name: r
    for r in (
        Regime(
            "sync",
            "sync schedule, one request at a time: closed forms (wansim/analytical/sync.py)",
            _band(0.03, 0.03, 0.01, 0.01, 0.01),
        ),
        Regime(
            "async",
            "async in-pipe speculation, one request: issue recursion at the mean lap, "
            "geometric chains of won bets (r = S_K p_{K+1}), restart after the block in "
            "progress, room rule at the request's end (wansim/analytical/blocks.py)",
            _band(0.10, 0.10, 0.03, 0.03, 0.04),
        ),
        Regime(
            "overlap",
            "sync schedule with the drafter on its own device (max(.) law): won bets cost "
            "max(draft, lap), lost ones max(lap, draft) + draft (wansim/analytical/blocks.py)",
            _band(0.05, 0.06, 0.01, 0.01, 0.03),
        ),
        Regime(
            "async+overlap",
            "both: S0 issues a block every max(draft, compute) (blocks.py)",
            _band(0.08, 0.08, 0.01, 0.01, 0.04),
        ),
        Regime(
            "concurrent",
            "N requests without batching: closed ring of FIFO stations, deterministic "
            "service, G/D/1 waits with the arrival theorem (a rotation that locks without "
            "link randomness), prefill convoys of the requests decoding, the bottleneck's "
            "cap, slot makespan (wansim/analytical/concurrent.py)",
            # TTFT: 42.8% measured (4 stages, 32 users); bubble: 0.100 since a prefill convoys
            # only the requests decoding (concurrent.convoy_wait), 0.094 before
            _band(0.15, 0.18, 0.45, 0.11, 0.02),
        ),
        Regime(
            "async+concurrent",
            "the block schedule's passes and stale blocks as the ring's load; a request's "
            "stale blocks recomputed with S0's queueing; S0's mailbox saturating as a round "
            "robin (concurrent.py, s0_mailbox.py)",
            # TTFT: the grid's 30% widened to the agreement hunt's validated points (seed 26,
            # 4 requests with windows of 8 on a ring without link randomness: +57% against
            # the DES's half-width of 12%); bubble: 0.101 measured once S0's mailbox was
            # modelled (wansim/analytical/s0_mailbox.py; 10 stages, K = 7, 16 users), 0.111
            # since a prefill convoys only the requests decoding (concurrent.convoy_wait)
            _band(0.20, 0.15, 0.35, 0.12, 0.10),
        ),
        Regime(
            "continuous batching",
            "continuous batching in steady state: the lockstep batch of N sequences, Binomial "
            "admissions per verdict whose prefill convoys the batch (max-plus tandem delay), "
            "TTFT of the replacements' shared prefill, cold start and drain in the makespan "
            "(wansim/analytical/batched.py)",
            _band(0.08, 0.08, 0.15, 0.04, 0.02),
        ),
        Regime(
            "micro-batched",
            "N micro-batches in flight (continuous batching) with chunked prefill: the cycle "
            "of a cyclic max-plus ring, max(lone lap, N x slowest station), at the mean pass "
            "(verify passes and prompt chunks), the chunk budget's saturation, a chunk's own "
            "heavier lap in TTFT, cold start and drain in the makespan "
            "(wansim/analytical/micro_batched.py)",
            # tokens/s: the grid's 7.1%, 57 fresh draws of the property test's 9.1% (one DES
            # seed each); throughput: the grid's 14.5%, the fresh draws' 20.3% (one seed);
            # bubble: the grid's 0.041, the fresh draws' 0.050, 8 stages in 8 micro-batches
            # at 1 ms (tests/engines/test_micro_batching.py) 0.062
            _band(0.12, 0.20, 0.35, 0.07, 0.02),
        ),
        Regime(
            "sync+faults",
            "stage failures on the sync schedule's lone request: the run's expected value over"
            " Poisson failures, outages and re-prefills or failed requests"
            " (wansim/analytical/faults.py)",
            FAULTS_BAND,
        ),
        Regime(
            "async+hybrid",
            "the per-round hybrid, one request: renewal-reward mix of the block schedule and"
            " the sync tree (wansim/analytical/hybrid.py)",
            HYBRID_BAND,
        ),
    )
}

# outside every measured regime: the band the agreement hunt measured over such points
UNVALIDATED_BAND = _band(4.0, 1.3, 1.0, 0.5, 0.5)  # the 300-point hunt: +391% worst (seed 210)


def unvalidated(approximation: dict | None, regime: str, why: str) -> dict:
    """An answer's approximation taken on by a model whose error is not measured across a
    regime: ``regime`` appended to the regime, ``validated: false``, the unvalidated band and
    ``why``."""
    out = dict(approximation or {})
    out.update(
        regime=f"{out.get('regime', '')} + {regime}",
        validated=False,
        error_band=dict(UNVALIDATED_BAND),
        why=why,
    )
    return out


@dataclasses.dataclass(frozen=True)
class Approximation:
    regime: str
    validated: bool
    error_band: dict[str, float]
    why: str = ""  # why a point is not validated (empty when it is)

    def to_json(self) -> dict:
        out = {"regime": self.regime, "validated": self.validated, "error_band": self.error_band}
        if self.why:
            out["why"] = self.why
        return out


def regime_name(scenario) -> str:
    """The model that answers ``scenario`` (a scalar scenario)."""
    sched = scenario.schedule
    blocks = sched.kind == "async" or (
        bool(scenario.drafter.overlap) and scenario.speculation.policy != "none"
    )
    many = int(np.max(np.asarray(scenario.workload.concurrency))) > 1
    if sched.batching == "continuous" and sched.micro_batches is not None:
        return "micro-batched"
    if many and sched.batching == "continuous":
        return "async+continuous batching" if sched.kind == "async" else "continuous batching"
    parts = []
    if sched.kind == "async":
        parts.append("async")
    if sched.hybrid_confident_fraction is not None:
        parts.append("hybrid")
    if blocks and scenario.drafter.overlap:
        parts.append("overlap")
    if many:
        parts.append("concurrent")
    if scenario.faults.events:
        parts = (parts or ["sync"]) + ["faults"]
    return "+".join(parts) or "sync"


def _links(scenario) -> list:
    net = scenario.network
    if net.hops:
        return list(scenario.resolved_hops())
    return [net]


def outside(scenario) -> str:
    """Why ``scenario`` lies outside its regime's measured domain ('' when inside).

    Besides combinations no grid measured, the corners where the agreement hunt
    (``wansim.studies.agreement_hunt``, docs/approximations.md) found a model beyond its band:
    retransmissions (in-order links hold every message behind a lost one: modelled, but
    rougher than any band) with more than one message in flight, heavy jitter on a loaded
    ring (the same head-of-line blocking), several requests on slow links without batching
    (prefill convoys), and continuous batching whose sequences drift apart where the batch
    would pipeline as groups (:func:`_batching_outside`)."""
    name = regime_name(scenario)
    many = int(np.max(np.asarray(scenario.workload.concurrency))) > 1
    if any(event.link is not None for event in scenario.faults.events):
        return (
            "link failures: an expected value (wansim/analytical/faults.py), checked against"
            " Monte Carlo over DES seeds (tests/physics/test_faults.py: within 2% + 5 standard"
            " errors); the approximation-error grid measured stage failures"
        )
    if scenario.faults.events and uses_blocks(scenario):
        return (
            "faults with the block schedule: a failover costs the restarted chain's first lap"
            " where the interrupted chain gives its laps' residual (wansim/analytical/faults.py),"
            " checked against the DES in tests/physics/test_faults_blocks.py (tokens/s within"
            " 6%), not on the approximation-error grid"
        )
    if scenario.faults.events and many:
        return (
            "faults with several requests in flight: each failure hits them all and their"
            " re-prefills queue at the slowest station (wansim/analytical/faults.py), checked"
            " against the DES in tests/physics/test_faults_loaded.py, not on the"
            " approximation-error grid"
        )
    if scenario.faults.events and scenario.network.transport == "tcp":
        return "faults on a tcp ring: not measured (the grids measured each alone)"
    if scenario.schedule.hybrid_confident_fraction is not None and many:
        return (
            "per-round hybrid with concurrent requests: the two schedules, each loaded by the"
            " N requests, mixed per round (wansim/analytical/hybrid.py): it inherits the loaded"
            " models' errors (-20%..-6% on tokens/s in tests/engines/test_hybrid_rounds.py)"
        )
    if scenario.schedule.async_protocol != "cancel_on_divergence" and (
        many or scenario.drafter.overlap
    ):
        return (
            f"async_protocol {scenario.schedule.async_protocol} beyond one request without an"
            " overlapped drafter: the block schedule's model with its commit rule and bet,"
            " checked against the DES in tests/engines/test_async_protocols.py (within 10%), not"
            " on the approximation-error grid"
        )
    if name == "async+continuous batching":
        return (
            "async with continuous batching: each sequence's bets on a ring whose passes cost"
            " the batch's (wansim/analytical/async_batched.py), checked against the DES"
            " in tests/engines/test_async_batched.py (tokens/s -1% to +13% up to 8 users; on"
            " the reference ring +13% to +52% with 16 users, docs/approximations.md: the batches"
            " do not stay whole); stage utilisation from bulk passes is an upper bound"
        )
    if name not in REGIMES:
        return f"{name}: no measured regime covers this combination"
    tcp_lossy = any(float(np.max(np.asarray(h.loss_rate))) > 0 for h in _links(scenario))
    if scenario.network.transport == "tcp" and name == "sync" and tcp_lossy:
        return (
            "transport tcp with loss: each hop's train and the prefills with their losses spread"
            " evenly, the windows they leave (wansim/analytical/transport.py), checked against"
            " the DES in tests/physics/test_tcp_loaded.py, not on the approximation-error grid"
        )
    if (
        scenario.network.transport == "tcp"
        and name == "micro-batched"
        and walk_misses_windows(scenario)
    ):
        return (
            "transport tcp with several micro-batches or a lossy one: a frame a lap per"
            " micro-batch taken as an evenly spaced train per hop (or one lossy frame a lap,"
            " its losses spread evenly) under the micro-batched model"
            " (wansim/analytical/transport.py), not on the approximation-error grid; the"
            " micro-batches start together and travel as a platoon whose windows restart"
            " every lap where the train keeps them open (2 and 4 micro-batches of 8 requests"
            " on scenarios/tcp-ring-frame-per-lap.yaml: tokens/s +458%, +403% against the DES;"
            " without restart after idle -1%; one lossy micro-batch -45%). The DES lies"
            " between the answers with every window cold and every window open (range)"
        )
    if scenario.network.transport == "tcp" and name == "micro-batched":
        return (
            "transport tcp with one micro-batch: the batch's frame once a lap followed from"
            " the run's start, its settled window the per-message cost of the micro-batched"
            " model and a prompt's bigger frame in TTFT (wansim/analytical/transport.py),"
            " checked against the DES in tests/physics/test_tcp_loaded.py (tokens/s -3.5% to"
            " +2.1%, TTFT -8.7% to -0.8%), not on the approximation-error grid"
        )
    if scenario.network.transport == "tcp" and name != "sync":
        return (
            "transport tcp beyond one request in the sync schedule: the window of an evenly"
            " spaced train per hop (wansim/analytical/transport.py), checked against the DES"
            " in tests/physics/test_tcp_loaded.py, not on the approximation-error grid;"
            " requests that start together can travel as a platoon whose frames come back to"
            " back once a lap, so the window restarts every lap where the train keeps it open"
            " (2 and 4 requests on scenarios/tcp-ring-frame-per-lap.yaml: tokens/s +320%,"
            " +310% against the DES); an async window's blocks leave S0 back to back and a"
            " lost bet empties the window, so they come as a burst once a lap (window 4 on"
            " scenarios/consumer-gpu-ring-40mbps.yaml with tcp: +101%; 8 requests there +30%);"
            " with loss, a prefill on a shrunken window holds the FIFO sender for every frame"
            " behind it (4 requests, 1% loss: +170%). The DES lies between the answers with"
            " every window cold and every window open (range)"
        )
    tcp = scenario.network.tcp
    halving = tcp.restart_after_idle and tcp.idle_restart != "initial_window"
    if scenario.network.transport == "tcp" and halving:
        return (
            f"transport tcp with idle_restart {tcp.idle_restart}: not on the"
            " approximation-error grid (one request's walk runs the DES's own sender: the"
            " laps agree exactly without jitter, tests/physics/test_tcp_linux.py)"
        )
    links = _links(scenario)
    lossy = any(float(np.max(np.asarray(link.loss_rate))) > 0 for link in links)
    jitter_ms = max(float(link.jitter.std_ms) for link in links)
    heavy = any(link.jitter.kind in ("pareto", "empirical") for link in links)
    if scenario.network.transport == "tcp" and (jitter_ms > TCP_JITTER_MS_MEASURED or heavy):
        return (
            f"transport tcp with jitter beyond {TCP_JITTER_MS_MEASURED:g} ms (or heavy-tailed):"
            " the window restarts after idle where a lap's gaps cross the RTO, which jitter"
            " blurs (agreement hunt seed 260, 5 ms: lap -2%, TTFT -1%)"
        )
    if scenario.network.transport == "tcp" and name == "sync" and jitter_ms > 0:
        reason = _restart_on_the_edge(scenario, jitter_ms)
        if reason:
            return reason
    window = scenario.schedule.kind == "async" and scenario.schedule.max_inflight_blocks > 1
    if lossy and (many or window):
        return "loss with several messages in flight (head-of-line blocking, rough model)"
    if (many or window) and (jitter_ms > JITTER_MS_MEASURED or heavy):
        return (
            f"jitter beyond {JITTER_MS_MEASURED:g} ms (or heavy-tailed) on a loaded ring"
            " (several requests, or an async window of blocks: messages held behind late ones)"
        )
    if window:
        share = jitter_share(scenario)
        if share > ASYNC_JITTER_SHARE_MEASURED:
            return (
                f"jitter of {share:.0%} of the lap behind an async window (the grid measured up"
                f" to {ASYNC_JITTER_SHARE_MEASURED:.0%}): blocks held behind late ones more"
                " than the resequencing wait carries (agreement hunt seed 2028: 5 ms hops with"
                " 5 ms of jitter, a window of 4: tokens/s +14%)"
            )
        ratio = block_stream_ratio(scenario)
        if ratio > 1.0:
            return (
                f"an async window whose blocks outrun a station after S0 ({ratio:.2f}x the"
                " interval S0 issues them at): they queue there, which the block recursion"
                " takes as a pure delay (agreement hunt seed 3973: 115 kB blocks on 100"
                " Mbit/s hops, 1.7x: tokens/s +19%)"
            )
    model = scenario.model
    if model.straggler.fraction and model.straggler.episode_ms > 0:
        return (
            "straggler episodes (model.straggler.episode_ms > 0): a stage's consecutive passes"
            " share its state; the analytical engine takes them as independent per pass"
        )
    if (model.noise.kind != "none" or model.straggler.fraction) and name != "sync":
        return (
            "compute noise or stragglers beyond one request in the sync schedule (their means"
            " only; the variability they add to queues and bets is not modelled)"
        )
    unseen = sorted(
        {
            int(b)
            for b in np.ravel(np.asarray(scenario.payload.activation_bits))
            if not quality_for(scenario.drafter.acceptance, int(b)).visible
        }
    )
    if unseen and scenario.speculation.policy != "none":
        return (
            f"{unseen[0]}-bit activations: their acceptance cost is not measured for this"
            " acceptance (drafter.acceptance.activation_quality)"
        )
    if name == "continuous batching":
        return _batching_outside(scenario)
    slowest = min(float(np.min(np.asarray(link.bandwidth_mbps))) for link in links)
    if many and slowest < SLOW_MBPS:
        return (
            f"several requests on links below {SLOW_MBPS:g} Mbit/s (prefill convoys dominate;"
            " 100 Mbit/s, 8 requests: -54%)"
        )
    if many and name != "micro-batched" and name != "continuous batching":
        why = _prefill_crowds(prefill_share(scenario))
        if why:
            return why
    if name == "micro-batched":
        return _outside_micro_batches(scenario)
    return ""


def jitter_share(scenario) -> float:
    """The ring's jitter against its lap: sqrt(sum over hops of the jitter's variance) / the
    sync schedule's mean lap (one request)."""
    from wansim.analytical.sync import sync_metrics

    links = _links(scenario)
    sds = np.asarray([float(np.max(np.asarray(link.jitter.std_ms))) for link in links])
    if len(links) == 1:  # one network for every hop
        sds = np.repeat(sds, int(np.max(np.asarray(scenario.stages))))
    lap = float(np.max(np.asarray(sync_metrics(scenario)["lap_ms_mean"])))
    return float(np.sqrt(np.sum(sds**2))) / max(lap, 1e-300)


def block_stream_ratio(scenario) -> float:
    """How far an async window's blocks outrun the slowest station after S0: its service per
    block (a forward hop's serialisation and per-message cost, a later stage's compute, the
    return hop's) over the interval S0 issues them at, max(S0's drafting and compute, the
    lap / the window) - one request, its own blocks only. Above 1 they queue there."""
    from wansim.analytical.blocks import issue_ms
    from wansim.analytical.path import hop_bytes, hop_service_ms
    from wansim.analytical.sync import forward_sizes, lap_parts, sync_metrics
    from wansim.stages.compute import stage_ms_each

    parts = lap_parts(scenario)
    stages = int(np.max(np.asarray(scenario.stages)))
    compute = [float(np.max(np.asarray(c))) for c in stage_ms_each(scenario, parts["tokens"])]
    draft = float(np.max(np.asarray(parts["bet_draft_ms"])))
    issue = float(issue_ms(draft, compute[0], bool(scenario.drafter.overlap)))
    window = float(np.max(np.asarray(scenario.schedule.max_inflight_blocks)))
    lap = float(np.max(np.asarray(sync_metrics(scenario)["lap_ms_mean"])))
    sizes = forward_sizes(parts)
    after = compute[1:stages] + [
        float(np.max(hop_service_ms(scenario, h, hop_bytes(sizes, h)))) for h in range(stages - 1)
    ]
    after.append(float(np.max(hop_service_ms(scenario, stages - 1, parts["return_bytes"]))))
    return max(after) / max(issue, lap / window, 1e-300)


def finish_together(scenario) -> bool:
    """A batch's sequences of one length finish at the same pass: no speculation, or
    near-certain acceptance."""
    acc = scenario.drafter.acceptance
    return scenario.speculation.policy == "none" or (
        acc.alpha is not None and acc.alpha >= CERTAIN_ALPHA and not acc.dispersion
    )


def refills_in_one_wave(scenario, output_cv: float) -> bool:
    """Continuous batching (no micro-batches) of several requests whose sequences of one
    length finish together (:func:`finish_together`), where the outputs differ
    (``output_cv`` > 0): each node's batch of like requests refills in one wave of prompts,
    the run's do not."""
    return (
        scenario.schedule.batching == "continuous"
        and scenario.schedule.micro_batches is None
        and int(np.max(np.asarray(scenario.workload.concurrency))) > 1
        and finish_together(scenario)
        and output_cv > 0
    )


def locked_phases(scenario) -> bool:
    """Several requests without batching whose passes nothing random moves but the workload's
    lengths: no speculation (a request's passes are its length), no jitter and no loss. Each
    node of like requests is then a deterministic cyclic ring whose requests keep their
    phases (:func:`wansim.analytical.concurrent.arrival_scv` = 0) and never wait below the
    bottleneck's capacity; in the run, requests of unequal lengths end out of step and their
    successors enter at mixed phases."""
    if int(np.max(np.asarray(scenario.workload.concurrency))) <= 1:
        return False
    if scenario.schedule.batching != "none" or scenario.speculation.policy != "none":
        return False
    links = _links(scenario)
    return all(
        link.jitter.kind == "none" and float(np.max(np.asarray(link.loss_rate))) == 0
        for link in links
    )


PREFILL_CROWDS = "several requests whose prefill is"  # (the why's start, below)


def _prefill_crowds(share: float) -> str:
    """Why several requests' prefills lie beyond the measured share ('' when inside)."""
    if share <= PREFILL_SHARE_MEASURED:
        return ""
    return (
        f"{PREFILL_CROWDS} {share:.0%} of a stage's work per request"
        f" (beyond {PREFILL_SHARE_MEASURED:.0%}): the prompts' passes crowd the"
        " others' decode and the queueing model misses it (agreement hunt seed 1590:"
        " 16 requests of 9 tokens behind 512-token prompts, 59%: tokens/s -48%; the"
        " grid measured up to 9%, the hunt's validated points up to 43%)"
    )


def _prefill_work_ms(scenario) -> tuple[np.ndarray, np.ndarray]:
    """(prefill service, E[N] x verify service) of one request, per stage (compute only)."""
    from wansim.analytical.sync import lap_parts
    from wansim.analytical.transport import one_pass
    from wansim.stages.compute import stage_ms_each

    alone = one_pass(scenario)
    parts = lap_parts(alone)
    passes = np.asarray(parts["passes"], dtype=float)
    prompt = np.asarray(scenario.workload.prompt_tokens, dtype=float)
    prefill = np.asarray(stage_ms_each(alone, prompt, sequences=1), dtype=float)
    verify = np.asarray(stage_ms_each(alone, np.asarray(parts["tokens"]), sequences=1), dtype=float)
    return prefill, passes * verify


def prefill_share(scenario) -> float:
    """The largest share of a stage's work per request that its prefill takes: prefill
    service / (prefill service + E[N] x verify service), per stage (compute only)."""
    prefill, decode = _prefill_work_ms(scenario)
    return float(np.max(prefill / np.maximum(prefill + decode, 1e-300)))


def workload_prefill_share(weighted) -> float:
    """:func:`prefill_share` of requests that differ, over their ``(weight, node)`` pairs
    (:func:`wansim.analytical.mixture.nodes`): the prefills' share of the work the workload
    brings a stage, E[prefill] / E[prefill + decode]. Every request's prompt crowds the
    others' decode, not only the long ones', so the share is the workload's, not a node's
    (a node of the longest prompts and shortest outputs would be over half on its own)."""
    prefill = decode = 0.0
    for w, node in weighted:
        p, d = _prefill_work_ms(node)
        prefill, decode = prefill + w * p, decode + w * d
    return float(np.max(prefill / np.maximum(prefill + decode, 1e-300)))


def drift_outside(scenario, request_ms: float) -> str:
    """Why a time-varying link lies outside what the approximation-error grid measured ('' when
    inside): a drift (no trace) of at most 1.3x slower, on the sync schedule's lone request,
    spanning at least ``DRIFT_REQUESTS_MEASURED`` requests of ``request_ms`` (the grid: 1.3x
    over 20 minutes and 2 hours of requests of ~10 s)."""
    net = scenario.network
    if net.trace_file is not None:
        return "a trace file's steps were not measured on the grid (drifts were)"
    d = net.drift
    if (
        regime_name(scenario) != "sync"
        or int(np.max(np.asarray(scenario.workload.concurrency))) > 1
    ):
        return "a drift beyond the sync schedule's lone request was not measured"
    if not (1 / DRIFT_FACTOR_MEASURED <= d.latency_factor <= DRIFT_FACTOR_MEASURED) or not (
        1 / DRIFT_FACTOR_MEASURED <= d.bandwidth_factor <= DRIFT_FACTOR_MEASURED
    ):
        return f"a drift beyond {DRIFT_FACTOR_MEASURED:g}x was not measured"
    if d.over_ms < DRIFT_REQUESTS_MEASURED * request_ms:
        return (
            f"a drift over less than {DRIFT_REQUESTS_MEASURED} requests' time"
            f" ({d.over_ms:g} ms against requests of {request_ms:.0f} ms) was not measured"
        )
    return ""


DRIFT_FACTOR_MEASURED = 1.3
DRIFT_REQUESTS_MEASURED = 100


def _batching_outside(scenario) -> str:
    """Continuous batching leaves the lockstep model where its sequences drift apart (they
    finish at different passes) and the batch would run faster split into groups pipelining
    through the ring (the DES's replacements travel as groups of their own; 16 tree sequences
    of 32 nodes on hunt scenarios 1 and 7 batched: -38% and -29%), or where a replacement's
    prefill outruns the batch and never merges with it (:func:`wansim.analytical.batched.prefill_lead`).
    Sequences that finish together (no speculation, near-certain acceptance) stay one batch,
    however slow the ring."""
    from wansim.analytical.batched import prefill_lead, split_gain
    from wansim.stages.compute import stage_sequence_costs_ms

    if finish_together(scenario):
        return ""
    gain = split_gain(scenario)
    if gain > SPLIT_GAIN:
        return (
            f"continuous batching whose batch would run {100 * gain:.0f}% faster split in two"
            " groups (sequences drift apart and pipeline as groups; the lockstep model does not)"
        )
    if gain < -SLOWER_SPLIT:
        return (
            f"continuous batching whose batch would run {100 * -gain:.0f}% slower split in two"
            " groups: its busiest station's pass (drafting included) outlasts the rest of the"
            " lap, so the groups that the DES's replacements form alternate there and never"
            " merge, where the lockstep model keeps the batch whole (agreement hunt seed 4436,"
            " a 60 ms drafter on S0: tokens/s +52%)"
        )
    lead = prefill_lead(scenario)
    if lead < 1.0:
        return (
            "continuous batching whose replacements' prefills outrun the batch (a prompt's pass"
            f" takes at most {lead:.2f}x the batch's at every station): each replacement travels"
            " as a group of its own and the batch fragments, where the lockstep model keeps it"
            " whole (agreement hunt seeds 1780, 1796: tokens/s -18%; the grid's ring with"
            " 16-token prompts -12%)"
        )
    per_sequence = max(stage_sequence_costs_ms(scenario)) + scenario.drafter.sequence_ms
    if per_sequence > 0:
        return (
            "continuous batching with a cost per sequence (model.sequence_ms,"
            " drafter.sequence_ms), which the grid did not measure: sequences that finish"
            " apart split the DES's batch into groups that pay less of it than the lockstep"
            " batch (agreement hunt seed 2485: tokens/s -12%, +1% without the cost)"
        )
    return ""


def _outside_micro_batches(scenario) -> str:
    """The measured domain of the micro-batched model (docs/approximations.md): chunked
    prefill on the approximation grid's ring, at most one micro-batch per stage, and passes of
    similar size."""
    from wansim.analytical.micro_batched import pass_tokens
    from wansim.analytical.sync import lap_parts

    sched, wl = scenario.schedule, scenario.workload
    if sched.prefill_chunk_tokens is None:
        return (
            "micro-batches with whole prompts (passes behind a prompt queue on FIFO links and"
            " refills bunch: not modelled; measured -20% to +36% on tokens/s)"
        )
    if scenario.speculation.policy != "chain":
        return "micro-batches measured with chains only"
    k = np.asarray(scenario.speculation.k)
    latency = max(float(np.max(np.asarray(link.latency_ms))) for link in _links(scenario))
    beyond = (
        int(np.max(np.asarray(wl.concurrency))) > MICRO_USERS_MEASURED
        or sched.micro_batches > MICRO_BATCHES_MEASURED
        or int(np.max(np.asarray(scenario.stages))) > MICRO_STAGES_MEASURED
        or int(np.max(np.asarray(wl.prompt_tokens))) > MICRO_PROMPT_MEASURED
        or int(np.min(np.asarray(wl.output_tokens))) < MICRO_OUTPUT_MEASURED
        or not MICRO_CHUNK_MEASURED[0] <= sched.prefill_chunk_tokens <= MICRO_CHUNK_MEASURED[1]
        or int(np.min(k)) < MICRO_K_MEASURED[0]
        or int(np.max(k)) > MICRO_K_MEASURED[1]
        or latency > MICRO_LATENCY_MS_MEASURED
    )
    if beyond:
        return (
            f"micro-batches beyond the measured grid (up to {MICRO_USERS_MEASURED} users,"
            f" {MICRO_BATCHES_MEASURED} micro-batches, {MICRO_STAGES_MEASURED} stages,"
            f" {MICRO_LATENCY_MS_MEASURED:g} ms hops, prompts of {MICRO_PROMPT_MEASURED} tokens"
            f" at most in chunks of {MICRO_CHUNK_MEASURED[0]}-{MICRO_CHUNK_MEASURED[1]},"
            f" outputs of {MICRO_OUTPUT_MEASURED} tokens or more, K"
            f" {MICRO_K_MEASURED[0]}-{MICRO_K_MEASURED[1]})"
        )
    if sched.micro_batches > int(np.min(np.asarray(scenario.stages))):
        return (
            "more micro-batches than stages (they queue for the stages; measured up to -23% on"
            " tokens/s and -44% on TTFT)"
        )
    mean = pass_tokens(scenario, lap_parts(scenario))
    ratio = float(np.max(mean["chunk_pass_tokens"] / mean["tokens"]))
    if ratio > CHUNK_PASS_RATIO_MEASURED:
        return (
            f"a pass carrying a prompt chunk is {ratio:.1f}x the mean pass (measured up to"
            f" {CHUNK_PASS_RATIO_MEASURED:g}x: beyond, the variable passes queue; +56% on"
            " tokens/s measured at 5.4x)"
        )
    return ""


MICRO_USERS_MEASURED = 128
MICRO_PROMPT_MEASURED = 512
MICRO_OUTPUT_MEASURED = 128
MICRO_CHUNK_MEASURED = (128, 256)
MICRO_K_MEASURED = (3, 7)
MICRO_LATENCY_MS_MEASURED = 25.0
MICRO_BATCHES_MEASURED = 10
MICRO_STAGES_MEASURED = 10
CHUNK_PASS_RATIO_MEASURED = 2.2
TCP_JITTER_MS_MEASURED = 3.0  # the tcp grid's lognormal jitter
RESTART_MARGIN_SDS = 3.0  # a restart decided within this many gap sds of the RTO: not validated


def _restart_on_the_edge(scenario, jitter_ms: float) -> str | None:
    """One request at a time on a tcp ring with jitter: why it is not validated where the
    request walk decided a window's restart after idle within :data:`RESTART_MARGIN_SDS`
    sds of the RTO (a gap spans about a lap of hops: sd sqrt(stages) x the largest hop's
    jitter sd), else None. The walk follows the mean delays; a ring with a warm and a cold
    state can be sent into either, for many requests, by the jitter there
    (:func:`wansim.analytical.transport.restart_margin_ms`)."""
    from wansim.analytical.transport import restart_margin_ms

    margin = restart_margin_ms(scenario)
    spread = float(np.sqrt(int(scenario.stages))) * jitter_ms
    if margin is None or margin >= RESTART_MARGIN_SDS * spread:
        return None
    return (
        f"transport tcp: a window's restart after idle is decided {margin:.2g} ms from the"
        f" RTO, within {RESTART_MARGIN_SDS:g} sds ({spread:.2g} ms) of the lap's jitter: a"
        " ring can run warm or cold for many requests by which way the jitter tips it (3"
        " stages, 2.45 ms of jitter, 2.4 ms from the RTO: on one DES seed the first 12"
        " requests ran cold, ~520 ms each, mean TTFT 242 ms against ~137 on two others;"
        " tests/physics/test_tcp.py)"
    )


JITTER_MS_MEASURED = 5.0  # concurrency was measured with 3 ms lognormal jitter
PREFILL_SHARE_MEASURED = 0.5  # several requests: the prefill's share of a stage's work checked
# an async window: the async grid's largest jitter against its lap (2 stages, 5 ms hops)
ASYNC_JITTER_SHARE_MEASURED = 0.132  # (0.1313: its 2-stage, 5 ms points)
CERTAIN_ALPHA = 0.99
SLOW_MBPS = 1000.0
SPLIT_GAIN = 0.2  # the hunt's batching points agree below it (docs/approximations.md)
# a split slower by more than this: of the hunts' 12 batching points beyond it whose sequences
# finish apart, 8 were over by +7% to +59% (seeds 75, 3684, 3770, 3875, 4280, 4430, 4436;
# 3543 +10%), about the split's own slowdown; 4 agreed (3340, 3414, 4035, 4101)
SLOWER_SPLIT = 0.1


def approximation(scenario) -> Approximation:
    name = regime_name(scenario)
    why = outside(scenario)
    band = REGIMES[name].error_band if name in REGIMES and not why else UNVALIDATED_BAND
    return Approximation(regime=name, validated=not why, error_band=dict(band), why=why)


# Requests that differ in length (wansim.analytical.mixture): the largest error the
# approximation-error grids measured over their validated points ("varied lengths": 4 and 10
# stages, 1-32 users, 32 of 40 points; "varied-length tails": chains, trees and async,
# micro-batching on and off, 1-64 users, 16 of 26 points), rounded up: tokens/s 16.3%,
# throughput 24.6% (45.2% before the finite run's makespan, wansim.analytical.finite_run: 32
# users without batching, whose last, long requests set the DES's makespan), TTFT 32.0%,
# bubble 0.092 (0.199 before), wasted 0.051 (async, 64 users, once S0's mailbox was
# modelled: 0.048 before), TPOT p99 29.4%; TTFT
# widened to the fast grid's 16 users in one continuous batch of the trace's lengths drawn
# (empirical): +44.4% (the replacements' prefills of differing prompts)
VARIED_LENGTHS_BAND = {
    **_band(0.20, 0.30, 0.45, 0.10, 0.06),
    "tpot_ms_p99": 0.30,
}
VARIED_REGIMES_MEASURED = (
    "sync",
    "concurrent",
    "continuous batching",
    "micro-batched",
    "async",
    "async+concurrent",
)
VARIED_USERS_MEASURED = 64
VARIED_BATCH_USERS_MEASURED = 8  # continuous batching: the varied-length grid's validated batches
LENGTH_CV_MEASURED = 1.0


def length_cvs(workload) -> tuple[float, float]:
    """The coefficients of variation of the prompt and output lengths a workload draws."""
    lengths = workload.lengths
    if lengths.kind == "fixed":
        return 0.0, 0.0
    if lengths.kind == "lognormal":
        return float(lengths.prompt_cv), float(lengths.output_cv)
    from wansim.serving.workload import read_trace

    trace = read_trace(workload.trace)
    rows = slice(0, workload.requests if lengths.kind == "trace" else None)
    out = []
    for x in (trace.prompt_tokens[rows], trace.output_tokens[rows]):
        x = np.asarray(x, dtype=float)
        out.append(float(x.std() / x.mean()))
    return out[0], out[1]


def varied_approximation(scenario, node_approximations: list[dict], weighted) -> Approximation:
    """The approximation of requests that differ (expectations over the ``(weight, node)``
    pairs ``weighted``): the nodes' regime, validated where every node is and the workload
    lies in the measured domain (a regime measured with varied lengths, at most
    ``VARIED_USERS_MEASURED`` users, length CVs up to ``LENGTH_CV_MEASURED``, no acceptance
    mix, the prefills' share of the workload's work, :func:`workload_prefill_share`, not a
    node's), with the wider of the nodes' band and ``VARIED_LENGTHS_BAND`` per metric."""
    first = node_approximations[0]
    queued = [a for a in node_approximations if "KV admission" in a.get("regime", "")]
    name = (queued or [first])[0].get("regime", "")
    base = regime_name(scenario)
    wl = scenario.workload
    unvalidated = [
        a.get("why") or "not validated" for a in node_approximations if not a.get("validated")
    ]
    why = next((w for w in unvalidated if not w.startswith(PREFILL_CROWDS)), "")
    if not why and unvalidated:  # only the prefill's share: the workload's, not a node's
        why = _prefill_crowds(workload_prefill_share(weighted))
    cvs = length_cvs(wl)
    if not why and queued:
        why = (
            "KV admission with requests that differ: each kind of request queued for slots of"
            " its own size, where the DES's requests share one pool (agreement hunt seed 1926:"
            " mean TTFT +45% to +69% on 256 requests; the grid measured the queue with fixed"
            " lengths)"
        )
    elif not why and wl.mix:
        why = "a mix of acceptance rows per request: not measured against the DES"
    elif not why and base not in VARIED_REGIMES_MEASURED:
        why = f"varied lengths with {base}: not measured against the DES"
    elif not why and int(np.max(np.asarray(wl.concurrency))) > VARIED_USERS_MEASURED:
        why = f"varied lengths beyond {VARIED_USERS_MEASURED} users: not measured"
    elif (
        not why
        and base == "continuous batching"
        and int(np.max(np.asarray(wl.concurrency))) > VARIED_BATCH_USERS_MEASURED
    ):
        why = (
            "continuous batching of requests that differ beyond"
            f" {VARIED_BATCH_USERS_MEASURED} users: the grid's validated points stop there (its"
            " 32-user batches split); 32 users of the shipped trace on 4 stages, K = 3:"
            " throughput +38%, mean TTFT +117% (tests/agreement/test_serving_agreement.py)"
        )
    elif not why and refills_in_one_wave(scenario, output_cv=cvs[1]):
        why = (
            "continuous batching of requests that differ in output without speculation: each"
            " node's batch of like requests finishes together and refills in one wave of"
            " prompts, where outputs of unequal lengths end apart and their replacements"
            " prefill in small groups (agreement hunt seed 2095: mean TTFT +70% to +87%)"
        )
    elif not why and locked_phases(scenario):
        why = (
            "requests that differ without speculation on a ring without link randomness: each"
            " node's like requests lock into a rotation that never waits, where the"
            " workload's unequal lengths mix their phases and they queue (agreement hunt seed"
            " 2198: the shipped trace's lengths, 8 users on 10 stages: tokens/s +37%)"
        )
    elif not why and max(cvs) > LENGTH_CV_MEASURED:
        why = (
            f"lengths with a coefficient of variation of {max(cvs):.2f}: measured up to"
            f" {LENGTH_CV_MEASURED:g}"
        )
    if why:
        band = dict(UNVALIDATED_BAND)
    else:
        band = dict(first.get("error_band") or {})
        for k, v in VARIED_LENGTHS_BAND.items():
            band[k] = max(band.get(k, 0.0), v)
    return Approximation(regime=name, validated=not why, error_band=band, why=why)
