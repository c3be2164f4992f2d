"""A lone request in the sync ring, computed lap by lap in vectorised blocks instead of events.

Where nothing can contend -- the sync schedule with one request in flight (``workload.concurrency:
1``, closed arrivals) -- every pass goes round the ring alone: each stage and each hop is idle
when the pass reaches it (the pass before it has finished the whole ring), so the FIFO max(.)s
of the event engine (stage free, hop sender free, no overtaking) never bind and the run is one
chain of additions, pass after pass:

    S_i (i < P-1):  end = T_i + service_i                   draft + compute of the pass
    hop i:          d_i = ((end + busy_i) + propagation_i) + G_i rto_i
    event:          T_(i+1) = B + (d_i - B)                 SimPy schedules now + delay
    last stage:     V = T_(P-1) + service                   the verdict
                    W = V + drafting after the verdict; the return hop as above, into S0
    a finished request: the next one is admitted into S0 at V.

``busy`` and the wire bytes are :mod:`wansim.links.delivery`'s own functions applied to arrays
(the same operations in the same order as :class:`~wansim.links.delivery.HopSender` per
message). B is the instant the delivery's timeout was scheduled: T_i at a closed-form stage,
``end`` at a stage process (continuous batching), W on the return hop. Over a block of passes
the chain is one ``np.add.accumulate`` (a sequential sum: the same roundings as the events'
one-at-a-time additions). The event step B + (d - B) equals d except for a few hops at the very
start of a run (it does when d <= 2B, Sterbenz); it is checked for every event and, where it
differs, the chain takes SimPy's value and is summed again from there. Jitter, losses and
acceptance come from the same streams, in the same blocks and order, as in the event engine;
stage busy times and wire bytes are summed in the same order. The record is the event engine's
to the bit (``tests/engines/test_lone_ring.py``) with no event scheduled. A kept timeline is
that clock too: each block's is kept and the slices are read from it
(:mod:`wansim.sim.columnar_timeline`), the same tuples as the events append.

Eligibility is a whitelist (:func:`applies`): every scenario field must be one this module
knows, with a value it handles (:data:`KNOWN_FIELDS`), and every component of the built
pipeline of the class it reproduces. A field or mechanism added later is not in the list, so
such a scenario runs event by event until someone adds it here and to the equality test.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from wansim.links.delivery import HopSender, busy_ms, software_ms
from wansim.links.draws import LinkDraws
from wansim.sim.columnar_timeline import DRAFT, ColumnarTimeline
from wansim.sim.link import Link
from wansim.sim.messages import PREFILL, VERIFY, Pass
from wansim.sim.record import RunRecord
from wansim.sim.request import Request, RequestSource
from wansim.sim.stage import LastStage, RelayStage
from wansim.sim.verifier import Verifier

ROWS_PER_BLOCK = 16_384  # passes summed per accumulate (bounds memory on long runs)
MAX_FIXES = 64  # corrections of the event step per block before giving the run to the events
# columns of a pass: per forward hop (service, busy, propagation, wait); then the last stage's
# service, then (drafting after the verdict, busy, propagation, wait) of the return hop
HOP_COLUMNS = 4

ANY = None  # any value the scenario's validation accepts
_COMPUTE_FIELDS = {  # the compute models stage_pass_ms evaluates (deterministic per pass size)
    "linear": ("base_ms", "per_token_ms"),
    "roofline": (
        "params_b",
        "bytes_per_param",
        "kv_bytes_per_token",
        "context_tokens",
        "mem_bandwidth_gbs",
        "peak_tflops",
        "overhead_ms",
    ),
    "moe": (
        "dense_params_b",
        "experts",
        "experts_per_token",
        "expert_params_b",
        "bytes_per_param",
        "expert_bytes_per_param",
        "kv_bytes_per_token",
        "context_tokens",
        "mem_bandwidth_gbs",
        "peak_tflops",
        "overhead_ms",
    ),
    "table": ("points",),
}
_JITTER = {
    "kind": ("none", "normal", "lognormal", "pareto", "empirical"),
    "std_ms": ANY,
    "mean_ms": ANY,
    "shape": ANY,
    "samples_ms": ANY,
    "samples_file": ANY,
}
_HOP = (
    "latency_ms",
    "bandwidth_mbps",
    "loss_rate",
    "per_message_ms",
    "codec_ms_per_mb",
    "jitter",  # None: the network's
)
# scenario field path ("[]": every entry of a tuple) -> the values the lone ring reproduces
KNOWN_FIELDS: dict[str, tuple | None] = {
    "name": ANY,
    "seed": ANY,
    "stages": ANY,
    "model.hidden_size": ANY,
    "model.overhead_ms": ANY,
    "model.stage_overhead_ms": ANY,
    "model.sequence_ms": ANY,  # one request: never a batch of two sequences
    "model.stage_sequence_ms": ANY,
    "model.host_cpu_factor": ANY,
    "model.host_cores": ANY,  # one request in flight never overlaps: no shared host is built
    "model.noise.kind": ("none",),  # compute noise and stragglers: off
    "model.noise.cv": ANY,
    "model.noise.stages": ANY,
    "model.straggler.fraction": (0.0,),
    "model.straggler.factor": ANY,
    "model.straggler.episode_ms": ANY,
    "model.straggler.stages": ANY,
    "model.idle_cost.points": ((),),  # a pass after an idle costs more: event by event
    "model.stage_idle_cost": ((),),
    "model.idle_follows": ANY,  # (no idle cost: nothing follows an idle)
    "network.idle_cost.points": ((),),
    **{
        f"{where}.{name}": ANY
        for where in ("model.compute", "model.stage_compute[]")
        for names in _COMPUTE_FIELDS.values()
        for name in names
    },
    "model.compute.kind": tuple(_COMPUTE_FIELDS),
    "model.stage_compute[].kind": tuple(_COMPUTE_FIELDS),
    "model.stage_compute": ANY,  # () when every stage uses model.compute
    "network.latency_ms": ANY,
    "network.bandwidth_mbps": ANY,
    **{f"network.jitter.{name}": values for name, values in _JITTER.items()},
    "network.loss_rate": ANY,
    "network.retransmit_ms": ANY,
    "network.per_message_ms": ANY,
    "network.codec_ms_per_mb": ANY,
    "network.transport": ("ideal",),
    **{  # read only by transport: tcp
        f"network.tcp.{name}": ANY
        for name in ("mss_bytes", "initial_window_segments", "max_window_bytes", "idle_restart")
    },
    "network.tcp.restart_after_idle": ANY,
    "network.drift.latency_factor": (1.0,),
    "network.drift.bandwidth_factor": (1.0,),
    "network.drift.over_ms": ANY,
    "network.trace_file": (None,),
    "network.hops": ANY,  # () when every hop is the network's
    **{f"network.hops[].{name}": ANY for name in _HOP},
    **{f"network.hops[].jitter.{name}": values for name, values in _JITTER.items()},
    **{
        f"payload.{name}": ANY
        for name in (
            "activation_bits",
            "header_bytes",
            "return_bytes",
            "cancel_bytes",
            "quant_group_size",
            "return_token_bytes",  # in each stage's message sizes (RelayStage.message_bytes)
            "extra_tensors",
        )
    },
    **{
        f"payload.extra_tensors[].{name}": ANY
        for name in ("stage", "values_per_token", "bits", "to_stage")
    },
    "drafter.kind": ("mtp", "dspark", "dflash", "eagle", "draft_model", "ngram"),
    "drafter.placement": ("first_stage", "last_stage"),
    "drafter.parallel": ANY,
    "drafter.draft_ms": ANY,
    "drafter.width_ms": ANY,
    "drafter.sequence_ms": ANY,
    "drafter.preset": ANY,
    "drafter.overlap": (False,),
    **{
        f"drafter.acceptance.{name}": ANY
        for name in (
            "profile",
            "workload",
            "alpha",
            "per_position",
            "domain_shift",
            "dispersion",
            "extrapolate",
            "sibling_logit_offsets",
            "activation_quality",  # read through speculation.policy, as the events are
        )
    },
    "speculation.policy": ("none", "chain", "tree"),
    "speculation.k": ANY,
    "speculation.verifier": ("lossless", "greedy", "typical"),
    "speculation.tree.kind": ("static", "sequoia", "dynamic"),
    "speculation.tree.budget_nodes": ANY,
    "speculation.tree.branching": ANY,
    "speculation.tree.max_depth": ANY,
    "schedule.kind": ("sync",),
    "schedule.max_inflight_blocks": (1,),
    "schedule.hedge_branches": ANY,
    "schedule.batching": ("none", "continuous"),  # one request: never a batch of two
    "schedule.async_protocol": ("cancel_on_divergence",),
    # micro-batches (wansim.sim.micro_batches) run event by event
    "schedule.micro_batches": (None,),
    "schedule.max_batch_size": (None,),
    "schedule.prefill_chunk_tokens": (None,),
    "schedule.hybrid_confident_fraction": (None,),  # the hybrid is async: never here
    "workload.requests": ANY,
    "workload.concurrency": (1,),
    "workload.prompt_tokens": ANY,
    "workload.output_tokens": ANY,
    "workload.arrival": ("closed",),
    "workload.rate_per_s": ANY,  # read only by poisson arrivals
    "workload.arrival_cv": ANY,  # read only by gamma arrivals
    "workload.on_ms": ANY,  # read only by onoff arrivals
    "workload.off_ms": ANY,
    "workload.lengths.kind": ("fixed",),
    "workload.lengths.prompt_cv": ANY,  # read only by lognormal lengths
    "workload.lengths.output_cv": ANY,
    "workload.lengths.max_prompt_tokens": ANY,
    "workload.lengths.max_output_tokens": ANY,
    "workload.trace": (None,),
    "workload.kv_capacity_tokens": (None,),
    "workload.mix": ((),),
    "workload.slo.ttft_ms": ANY,  # read only by the metrics
    "workload.slo.tpot_ms": ANY,
    "faults.events": ((),),  # failures run event by event (wansim.sim.faults)
    "faults.recovery": ANY,  # read only with events
    "faults.detection_s": ANY,
}


def scenario_fields(value, path: str = ""):
    """(path, value) of every leaf field of a scenario (dataclasses walked, tuples of
    dataclasses as ``path[]``; None and plain values are leaves)."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from scenario_fields(
                getattr(value, f.name), f"{path}.{f.name}" if path else f.name
            )
    elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
        for item in value:
            yield from scenario_fields(item, f"{path}[]")
    else:
        yield path, value


def unknown_fields(scenario, known: dict | None = None) -> list[str]:
    """Fields of ``scenario`` outside ``known`` (default :data:`KNOWN_FIELDS`) or with a value
    it does not list."""
    known = KNOWN_FIELDS if known is None else known
    out = []
    for path, value in scenario_fields(scenario):
        if path not in known:
            out.append(path)
            continue
        allowed = known[path]
        if allowed is not ANY and not any(_same(value, a) for a in allowed):
            out.append(f"{path}={value!r}")
    return out


def _same(value, allowed) -> bool:
    return type(value) is type(allowed) and value == allowed  # True is not 1, 1 is not 1.0


def applies(pipe) -> bool:
    """Whether the built pipeline (``wansim.sim.engine.build``) is a lone request in the sync
    ring with nothing this module does not reproduce (a whitelist: module docstring)."""
    if pipe.scheduler is not None:
        return False
    if unknown_fields(pipe.scenario):
        return False
    if type(pipe.verifier) is not Verifier:
        return False
    log = pipe.verifier.log  # only the kept timeline's (written here as columns)
    if log is not None and (pipe.timeline is None or log is not pipe.timeline.verify_log):
        return False
    if type(pipe.source) is not RequestSource:
        return False
    for stage in pipe.stages:
        if type(stage) not in (RelayStage, LastStage) or stage.hooks is not None:
            return False
    return plain_links(pipe.links)


def plain_links(links) -> bool:
    """Every hop the DES's own link and sender, with the ideal transport's delivery rule: no
    tcp window, drift or idle cost (what the event-free paths reproduce)."""
    for link in links:
        if type(link) is not Link or type(link.draws) is not LinkDraws:
            return False
        sender = link.sender
        if type(sender) is not HopSender or sender.tcp is not None or sender.drift is not None:
            return False
        if sender.idle_extra is not None:
            return False
    return True


def run(pipe) -> RunRecord | None:
    """The record of the run, or None if the event step needed more than ``MAX_FIXES``
    corrections in a block (the caller then runs the events on a fresh pipeline)."""
    sc = pipe.scenario
    stages, links, verifier = pipe.stages, pipe.links, pipe.verifier
    for stage in stages:
        stage.closed_form = stage.serves_in_closed_form()
    wl = sc.workload
    requests, lap_tokens, drawn = [], [], []
    for rid in range(wl.requests):
        req = Request(rid, 0.0, wl.prompt_tokens, wl.output_tokens - 1)
        verifier.prepare(req)  # admission order: the same acceptance draws as the events
        requests.append(req)
    n_verify = verifier.tokens_per_pass(requests[0])
    for req in requests:
        committed, accepted = verifier.verify_all(req, n_verify)
        lap_tokens.append(committed)
        drawn.append(accepted)
    ring = _Ring(stages, links, requests[0], wl.prompt_tokens, n_verify)
    chain = _Chain(len(stages))
    out = _Columns()
    kept: list | None = [] if pipe.timeline is not None else None  # each block's clock
    start, first_row = 0, 0
    while start < len(requests):
        stop, rows = start, 0
        while stop < len(requests) and (rows == 0 or rows < ROWS_PER_BLOCK):
            rows += 1 + requests[stop].passes
            stop += 1
        if not ring.block(requests[start:stop], chain, out, kept, first_row):
            return None
        start, first_row = stop, first_row + rows
    timeline = None
    if kept is not None:
        tl = pipe.timeline
        columns = functools.partial(
            _timeline_columns, ring, kept, requests, lap_tokens, drawn, n_verify, wl
        )
        timeline = ColumnarTimeline(tl.stage_names, tl.link_names, requests, columns)
    admitted, first, finish = out.cat("admitted"), out.cat("first"), out.cat("finish")
    passes = np.array([r.passes for r in requests], dtype=np.int64)
    return RunRecord(
        concurrency=1,
        arrival_ms=admitted,
        admitted_ms=admitted.copy(),
        first_token_ms=first,
        finish_ms=finish,
        decode_tokens=np.array([r.decode_tokens for r in requests], dtype=np.int64),
        committed=np.array([r.committed for r in requests], dtype=np.int64),
        passes=passes,
        laps_ms=out.cat("laps"),
        lap_request=np.repeat(np.arange(len(requests)), passes),
        stage_busy_ms=np.array(chain.stage_busy_ms),
        link_messages=np.array(chain.link_messages, dtype=np.int64),
        link_bytes=np.array(chain.link_bytes),
        link_bytes_decode=np.array(chain.link_bytes_decode),
        verify_passes=verifier.passes,
        tokens_verified=verifier.tokens_verified,
        tokens_committed=verifier.tokens_committed,
        target_exact=verifier.target_exact,
        events=0,
        timeline=timeline,
        lap_tokens=np.concatenate(lap_tokens),
        failed=np.zeros(len(requests), dtype=bool),
    )


def _timeline_columns(
    ring: _Ring, blocks: list, requests, lap_tokens, drawn, n_verify, wl
) -> dict[str, np.ndarray]:
    """The run's timeline as columns (:mod:`wansim.sim.columnar_timeline`), from each block's
    clock (:meth:`_Ring.keep`) and each request's passes and verdicts; computed when the
    timeline is first read."""
    kept = _Columns()
    for block in blocks:
        ring.keep(kept, *block)
    passes = np.array([r.passes for r in requests], dtype=np.int64)
    rid = np.repeat(np.arange(len(requests)), 1 + passes)
    first = np.concatenate([[0], np.cumsum(1 + passes)[:-1]])
    step = np.arange(len(rid)) - first[rid]
    verify = step > 0
    committed = np.concatenate(lap_tokens)
    done_before = np.concatenate(  # tokens each request had committed before each pass
        [np.cumsum(c) - c for c in lap_tokens]
    )
    columns = {
        "pass_rid": rid,
        "pass_step": step,
        "pass_n": np.where(verify, n_verify, wl.prompt_tokens),
        **{name: kept.cat(name) for name in kept.parts if name != "verdict_ms"},
        "verify_rid": rid[verify],
        "verify_step": step[verify],
        "verify_time_ms": kept.cat("verdict_ms")[verify],
        "verify_n": np.full(int(verify.sum()), n_verify),
        "verify_accepted": np.concatenate(drawn),
        "verify_remaining": np.repeat(wl.output_tokens - 1, len(committed)) - done_before,
        "verify_committed": committed,
    }
    return columns


class _Chain:
    """What carries from one block of passes to the next: the clock and the running sums."""

    def __init__(self, p: int):
        self.now_ms = 0.0
        self.last_verdict_ms = 0.0
        self.stage_busy_ms = [0.0] * p
        self.link_messages = [0] * p
        self.link_bytes = [0.0] * p
        self.link_bytes_decode = [0.0] * p


class _Columns:
    """Per-request and per-lap arrays, block by block."""

    def __init__(self):
        self.parts: dict[str, list[np.ndarray]] = {}

    def add(self, name: str, values: np.ndarray) -> None:
        self.parts.setdefault(name, []).append(values)

    def cat(self, name: str) -> np.ndarray:
        return np.concatenate(self.parts[name])


def _running(total: float, values: np.ndarray) -> float:
    """``total`` plus each value in turn (the order the event engine adds them in)."""
    if len(values) == 0:
        return total
    return float(np.add.accumulate(np.concatenate([[total], values]))[-1])


def _hop_terms(link: Link, n_bytes: np.ndarray, count: int):
    """(busy, propagation, wait, wire bytes, losses) of ``count`` messages on an idle hop,
    with the hop's next draws: what :meth:`HopSender.send` computes per message (module
    docstring)."""
    sender = link.sender
    losses = link.draws.losses_block(count)
    prop = link.draws.propagation_block(count)
    busy = busy_ms(
        n_bytes, sender.bandwidth_mbps, sender.per_message_ms, sender.codec_ms_per_mb, losses
    )
    wire = sender.wire_bytes(n_bytes, losses)
    return busy, prop, losses * sender.retransmit_ms, wire, losses


class _Ring:
    """The per-pass terms of the ring: each stage's service and each hop's message, per kind."""

    def __init__(self, stages, links, any_request: Request, prompt_tokens: int, n_verify: int):
        self.stages, self.links = stages, links
        self.p = len(stages)
        prefill = [Pass(any_request, PREFILL, 0, prompt_tokens)]
        verify = [Pass(any_request, VERIFY, 1, n_verify)]
        # (prefill, verify) per stage: draft + compute, as the stage adds them; the drafting
        # before compute alone (a kept timeline's draft slices)
        parts = [[s._service_ms(b, b[0].n) for b in (prefill, verify)] for s in stages]
        self.service_ms = [tuple(d + c for d, c in per_kind) for per_kind in parts]
        self.draft_ms = [tuple(d for d, _ in per_kind) for per_kind in parts]
        # (bytes, decode share) of the forward message, (prefill, verify), per forward hop
        self.forward = [
            tuple(s.message_bytes(b, b[0].n) for b in (prefill, verify)) for s in stages[:-1]
        ]
        last = stages[-1]
        self.draft_after_ms = last.draft_after(1)
        self.drafts_after = bool(last.draft_after_ms or last.draft_after_per_sequence_ms)
        self.return_bytes = last.return_bytes * 1
        self.columns = HOP_COLUMNS * (self.p - 1) + 1 + HOP_COLUMNS
        # where each delivery's timeout is scheduled from: T_i (closed form) or the pass's end
        self.scheduled_at = [0 if s.closed_form else 1 for s in stages[:-1]]

    def block(
        self,
        requests: list[Request],
        chain: _Chain,
        out: _Columns,
        kept: list | None = None,
        first_row: int = 0,
    ) -> bool:
        """Run the passes of ``requests`` (whole requests, in admission order); with ``kept``,
        keep the block's clock there for the timeline (``first_row``: the run's row of the
        block's first pass; :meth:`keep` reads it)."""
        p, cols = self.p, self.columns
        passes = np.array([r.passes for r in requests], dtype=np.int64)
        rows = int(len(requests) + passes.sum())
        prefill_row = np.concatenate([[0], np.cumsum(1 + passes)[:-1]])
        final_row = prefill_row + passes
        verify = np.ones(rows, dtype=bool)
        verify[prefill_row] = False
        going_on = np.ones(rows, dtype=bool)  # a return message follows the verdict
        going_on[final_row] = False
        inc = np.zeros((rows, cols))
        busy_sums, link_sums, sent = [], [], []
        for i in range(p - 1):
            c = HOP_COLUMNS * i
            service = np.where(verify, self.service_ms[i][1], self.service_ms[i][0])
            (pre_bytes, pre_share), (ver_bytes, ver_share) = self.forward[i]
            n_bytes = np.where(verify, ver_bytes, pre_bytes)
            share = np.where(verify, ver_share, pre_share)
            busy, prop, wait, wire, losses = _hop_terms(self.links[i], n_bytes, rows)
            inc[:, c], inc[:, c + 1], inc[:, c + 2], inc[:, c + 3] = service, busy, prop, wait
            busy_sums.append(service)
            link_sums.append((rows, wire, wire * share))
            sent.append((n_bytes, losses))
        c = HOP_COLUMNS * (p - 1)
        inc[:, c] = np.where(verify, self.service_ms[-1][1], self.service_ms[-1][0])
        returns = int(going_on.sum())
        n_bytes = np.full(returns, self.return_bytes)
        busy, prop, wait, wire, losses = _hop_terms(self.links[-1], n_bytes, returns)
        sent.append((n_bytes, losses))
        inc[going_on, c + 1] = self.draft_after_ms
        inc[going_on, c + 2] = busy
        inc[going_on, c + 3] = prop
        inc[going_on, c + 4] = wait
        busy_sums.append(inc[:, c : c + 2].ravel())  # service, then drafting, pass by pass
        link_sums.append((returns, wire, wire * 1.0))

        times = self._chain(inc.ravel(), chain.now_ms, going_on)
        if times is None:
            return False
        t = times[1:].reshape(rows, cols)
        verdict = t[:, c]
        out.add("admitted", times[prefill_row * cols])
        out.add("first", verdict[prefill_row])
        out.add("finish", verdict[final_row])
        previous = np.concatenate([[chain.last_verdict_ms], verdict[:-1]])
        out.add("laps", (verdict - previous)[verify])
        if kept is not None:
            kept.append((times, inc.ravel(), verify, going_on, sent, first_row))
        chain.now_ms = float(times[-1])
        chain.last_verdict_ms = float(verdict[-1])
        for i, values in enumerate(busy_sums):
            chain.stage_busy_ms[i] = _running(chain.stage_busy_ms[i], values)
        for i, (count, wire, decode) in enumerate(link_sums):
            chain.link_messages[i] += count
            chain.link_bytes[i] = _running(chain.link_bytes[i], wire)
            chain.link_bytes_decode[i] = _running(chain.link_bytes_decode[i], decode)
        return True

    def keep(self, kept: _Columns, times, flat, verify, going_on, sent, first_row: int) -> None:
        """The block's timeline as columns, in the order the events append it: per pass, each
        stage's drafting (when it drafts) then its compute, the last stage's drafting after the
        verdict; each hop's message, then its software cost (module
        :mod:`wansim.sim.columnar_timeline`). A stage's clock before increment j of row r is
        ``times[r * columns + j]``; a delivery is the sum before its event step."""
        p, cols = self.p, self.columns
        rows = len(verify)
        row0 = np.arange(rows) * cols
        row = first_row + np.arange(rows)
        # stage slots per row: (draft, compute) per stage, then the drafting after the verdict
        stage = np.empty((rows, 2 * p + 1), dtype=np.int64)
        start = np.empty((rows, 2 * p + 1))
        end = np.empty((rows, 2 * p + 1))
        what = np.empty((rows, 2 * p + 1), dtype=np.int64)
        which = np.empty((rows, 2 * p + 1), dtype=np.int64)
        valid = np.empty((rows, 2 * p + 1), dtype=bool)
        for i in range(p):
            c = HOP_COLUMNS * i
            begin, done = times[row0 + c], times[row0 + c + 1]
            draft = np.where(verify, self.draft_ms[i][1], self.draft_ms[i][0])
            drafted = begin + draft
            stage[:, 2 * i : 2 * i + 2] = i
            start[:, 2 * i], end[:, 2 * i] = begin, drafted
            start[:, 2 * i + 1], end[:, 2 * i + 1] = drafted, done
            what[:, 2 * i], what[:, 2 * i + 1] = DRAFT, verify
            which[:, 2 * i : 2 * i + 2] = row[:, None]
            valid[:, 2 * i], valid[:, 2 * i + 1] = draft != 0, True
        c = HOP_COLUMNS * (p - 1)
        stage[:, -1], what[:, -1], which[:, -1] = p - 1, DRAFT, row + 1
        start[:, -1], end[:, -1] = times[row0 + c + 1], times[row0 + c + 2]
        valid[:, -1] = going_on & self.drafts_after
        for name, values in (
            ("slice_stage", stage),
            ("slice_start_ms", start),
            ("slice_end_ms", end),
            ("slice_what", what),
            ("slice_pass", which),
        ):
            kept.add(name, values[valid])
        # hop slots per row: each forward hop, then the return hop (when a pass follows)
        cells = {name: np.empty((rows, p)) for name in ("offer", "free", "delivery", "bytes")}
        losses = np.zeros((rows, p), dtype=np.int64)
        which = np.empty((rows, p), dtype=np.int64)
        on = np.ones((rows, p), dtype=bool)
        for i in range(p):
            c = HOP_COLUMNS * i + (1 if i == p - 1 else 0)  # the return hop: after the drafting
            at = row0 + c + 1  # the clock after the stage's service (or drafting): the offer
            mask = going_on if i == p - 1 else slice(None)
            cells["offer"][:, i] = times[at]
            cells["free"][:, i] = times[at + 1]
            cells["delivery"][:, i] = times[at + 2] + flat[at + 2]  # before the event step
            cells["bytes"][mask, i], losses[mask, i] = sent[i]
            which[:, i] = row + (1 if i == p - 1 else 0)
        on[:, -1] = going_on
        hop = np.broadcast_to(np.arange(p), (rows, p))
        offer = cells["offer"][on]
        n_bytes = cells["bytes"][on]
        kept.add("transfer_hop", hop[on])
        kept.add("transfer_offer_ms", offer)
        kept.add("transfer_start_ms", offer)  # an idle hop starts the message when offered
        kept.add("transfer_free_ms", cells["free"][on])
        kept.add("transfer_delivery_ms", cells["delivery"][on])
        kept.add("transfer_bytes", n_bytes)
        kept.add("transfer_losses", losses[on])
        kept.add("transfer_pass", which[on])
        senders = [link.sender for link in self.links]
        per_message = np.broadcast_to([s.per_message_ms for s in senders], (rows, p))[on]
        codec = np.broadcast_to([s.codec_ms_per_mb for s in senders], (rows, p))[on]
        software = software_ms(n_bytes, per_message, codec)
        paid = software > 0
        kept.add("software_hop", hop[on][paid])
        kept.add("software_start_ms", offer[paid])
        kept.add("software_end_ms", (offer + software)[paid])
        kept.add("verdict_ms", times[row0 + HOP_COLUMNS * (p - 1) + 1])

    def _chain(self, flat: np.ndarray, now_ms: float, going_on) -> np.ndarray | None:
        """[now, then the clock after each increment], with every event step B + (d - B)
        applied as SimPy applies it (module docstring)."""
        times = np.add.accumulate(np.concatenate([[now_ms], flat]))
        before, after = self._event_positions(len(going_on), going_on)
        fixed_to = -1  # events up to this clock index are already stepped as SimPy does
        for _ in range(MAX_FIXES + 1):
            t, d = times[before], times[after]
            stepped = t + (d - t)
            bad = np.flatnonzero((stepped != d) & (after > fixed_to))
            if len(bad) == 0:
                return times
            k = bad[np.argmin(after[bad])]
            fixed_to = at = after[k]
            times[at:] = np.add.accumulate(np.concatenate([[stepped[k]], flat[at:]]))
        return None

    def _event_positions(self, rows: int, going_on: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Indices into the clock of (B, d) for every hop delivery (B: where its timeout was
        scheduled from; d: the computed delivery)."""
        cols = self.columns
        row0 = np.arange(rows) * cols  # the clock before the row's first increment
        before, after = [], []
        for i in range(self.p - 1):
            c = HOP_COLUMNS * i
            before.append(row0 + c + self.scheduled_at[i])
            after.append(row0 + c + HOP_COLUMNS)
        c = HOP_COLUMNS * (self.p - 1)
        before.append((row0 + c + 2)[going_on])
        after.append((row0 + c + 5)[going_on])
        return np.concatenate(before), np.concatenate(after)
