"""A lone request in the sync ring, computed lap by lap in vectorised blocks instead of events.

Where nothing can contend -- the sync schedule with one request in flight (``workload.concurrency:
1``, closed arrivals) -- every pass goes round the ring alone: each stage and each hop is idle
when the pass reaches it (the pass before it has finished the whole ring), so the FIFO max(.)s
of the event engine never bind and the run is one chain of additions, pass after pass:

    S_i (i < P-1):  end = T_i + service_i                   draft + compute of the pass
    hop i:          d_i = ((end + busy_i) + propagation_i) + G_i rto_i
    event:          T_(i+1) = T_i + (d_i - T_i)             SimPy schedules now + delay
    last stage:     V = T_(P-1) + service                   the verdict
                    W = V + drafting after the verdict; the return hop as above, into S0
    a finished request: the next one is admitted into S0 at V.

Over a block of passes the chain is one ``np.add.accumulate`` (a sequential sum: the same
roundings as the events' one-at-a-time additions). The event step T + (d - T) equals d exactly
when d <= 2T (Sterbenz) or T = 0 -- every hop but a few at the very start of a run; it is
checked for every event and, where it does not hold, the chain is corrected there and summed
again from that point. Jitter, losses and acceptance come from the same streams, in the same
blocks and order, as in the event engine; stage busy times and wire bytes are summed in the
same order. The record is the event engine's to the bit (``tests/sim/test_lone_ring.py``)
with no event scheduled. Anything else (concurrency, batching of several requests, the block
schedule, a kept timeline) runs event by event.
"""

from __future__ import annotations

import numpy as np

from wansim.sim.messages import PREFILL, VERIFY, Pass
from wansim.sim.record import RunRecord
from wansim.sim.request import Request

ROWS_PER_BLOCK = 16_384  # passes summed per accumulate (bounds memory on long runs)
MAX_FIXES = 64  # corrections of the event step per block before giving the run to the events
# columns of a pass: per forward hop (service, busy, propagation, wait); then the last stage's
# service, then (drafting after the verdict, busy, propagation, wait) of the return hop
HOP_COLUMNS = 4


def applies(pipe) -> bool:
    """Whether the built pipeline (``wansim.sim.engine.build``) is a lone-request sync ring."""
    wl = pipe.scenario.workload
    return (
        pipe.scheduler is None
        and pipe.timeline is None
        and wl.concurrency == 1
        and wl.arrival == "closed"
    )


def run(pipe) -> RunRecord | None:
    """The record of the run, or None if the event step needed more than ``MAX_FIXES``
    corrections in a block (the caller then runs the events)."""
    sc = pipe.scenario
    stages, links, verifier = pipe.stages, pipe.links, pipe.verifier
    wl = sc.workload
    requests = []
    for rid in range(wl.requests):
        req = Request(rid, 0.0, wl.prompt_tokens, wl.output_tokens - 1)
        verifier.prepare(req)  # admission order: the same acceptance draws as the events
        requests.append(req)
    n_verify = verifier.tokens_per_pass(requests[0])
    for req in requests:
        verifier.verify_all(req, n_verify)
    ring = _Ring(stages, links, requests[0], wl.prompt_tokens, n_verify)
    chain = _Chain()
    out = _Columns()
    start = 0
    while start < len(requests):
        stop, rows = start, 0
        while stop < len(requests) and (rows == 0 or rows < ROWS_PER_BLOCK):
            rows += 1 + requests[stop].passes
            stop += 1
        if not ring.block(requests[start:stop], chain, out):
            return None
        start = stop
    for req, admitted, first, finish in zip(
        requests, out.cat("admitted"), out.cat("first"), out.cat("finish"), strict=True
    ):
        req.arrival_ms = req.admitted_ms = float(admitted)
        req.first_token_ms = float(first)
        req.finish_ms = float(finish)
    return RunRecord(
        concurrency=1,
        arrival_ms=out.cat("admitted"),
        admitted_ms=out.cat("admitted"),
        first_token_ms=out.cat("first"),
        finish_ms=out.cat("finish"),
        decode_tokens=np.array([r.decode_tokens for r in requests], dtype=np.int64),
        committed=np.array([r.committed for r in requests], dtype=np.int64),
        passes=np.array([r.passes for r in requests], dtype=np.int64),
        laps_ms=out.cat("laps"),
        lap_request=np.repeat(np.arange(len(requests)), [r.passes for r in requests]),
        stage_busy_ms=np.array(chain.stage_busy_ms),
        link_messages=np.array(chain.link_messages, dtype=np.int64),
        link_bytes=np.array(chain.link_bytes),
        link_bytes_decode=np.array(chain.link_bytes_decode),
        verify_passes=verifier.passes,
        tokens_verified=verifier.tokens_verified,
        tokens_committed=verifier.tokens_committed,
        target_exact=verifier.target_exact,
        events=0,
    )


class _Chain:
    """What carries from one block of passes to the next: the clock and the running sums."""

    def __init__(self):
        self.now_ms = 0.0
        self.last_verdict_ms = 0.0
        self.stage_busy_ms: list[float] = []
        self.link_messages: list[int] = []
        self.link_bytes: list[float] = []
        self.link_bytes_decode: list[float] = []


class _Columns:
    """Per-request and per-lap arrays, block by block."""

    def __init__(self):
        self.parts: dict[str, list[np.ndarray]] = {}

    def add(self, name: str, values: np.ndarray) -> None:
        self.parts.setdefault(name, []).append(values)

    def cat(self, name: str) -> np.ndarray:
        return np.concatenate(self.parts[name])


def _service(stage, batch: list[Pass]) -> float:
    draft, compute = stage._service_ms(batch, batch[0].n)
    return draft + compute  # as the stage adds them


def _running(total: float, values: np.ndarray) -> float:
    """``total`` plus each value in turn (the order the event engine adds them in)."""
    if len(values) == 0:
        return total
    return float(np.add.accumulate(np.concatenate([[total], values]))[-1])


class _Ring:
    """The per-pass terms of the ring: each stage's service and each hop's message, per kind."""

    def __init__(self, stages, links, any_request: Request, prompt_tokens: int, n_verify: int):
        self.stages, self.links = stages, links
        self.p = len(stages)
        prefill = [Pass(any_request, PREFILL, 0, prompt_tokens)]
        verify = [Pass(any_request, VERIFY, 1, n_verify)]
        # (prefill, verify) per stage: draft + compute, as the stage adds them
        self.service_ms = [tuple(_service(s, b) for b in (prefill, verify)) for s in stages]
        # (bytes, decode share) of the forward message, (prefill, verify), per forward hop
        self.forward = [
            tuple(s.message_bytes(b, b[0].n) for b in (prefill, verify)) for s in stages[:-1]
        ]
        last = stages[-1]
        self.draft_after_ms = last.draft_after(1)
        self.return_bytes = last.return_bytes * 1
        self.columns = HOP_COLUMNS * (self.p - 1) + 1 + HOP_COLUMNS

    def block(self, requests: list[Request], chain: _Chain, out: _Columns) -> bool:
        """Run the passes of ``requests`` (whole requests, in admission order)."""
        p, cols = self.p, self.columns
        first_block = not chain.stage_busy_ms
        passes = np.array([r.passes for r in requests], dtype=np.int64)
        rows = int(len(requests) + passes.sum())
        prefill_row = np.concatenate([[0], np.cumsum(1 + passes)[:-1]])
        final_row = prefill_row + passes
        verify = np.ones(rows, dtype=bool)
        verify[prefill_row] = False
        going_on = np.ones(rows, dtype=bool)  # a return message follows the verdict
        going_on[final_row] = False
        inc = np.zeros((rows, cols))
        busy_sums, link_sums = [], []
        for i in range(p - 1):
            c = HOP_COLUMNS * i
            service = np.where(verify, self.service_ms[i][1], self.service_ms[i][0])
            (pre_bytes, pre_share), (ver_bytes, ver_share) = self.forward[i]
            n_bytes = np.where(verify, ver_bytes, pre_bytes)
            share = np.where(verify, ver_share, pre_share)
            prop, losses = self.links[i].draw(rows)
            busy, wait = self.links[i].ring_terms(n_bytes, losses)
            inc[:, c], inc[:, c + 1], inc[:, c + 2], inc[:, c + 3] = service, busy, prop, wait
            busy_sums.append(service)
            wire = n_bytes * (1 + losses)
            link_sums.append((rows, wire, wire * share))
        c = HOP_COLUMNS * (p - 1)
        last_service = np.where(verify, self.service_ms[-1][1], self.service_ms[-1][0])
        inc[:, c] = last_service
        returns = int(going_on.sum())
        prop, losses = self.links[-1].draw(returns)
        n_bytes = np.full(returns, self.return_bytes)
        busy, wait = self.links[-1].ring_terms(n_bytes, losses)
        inc[going_on, c + 1] = self.draft_after_ms
        inc[going_on, c + 2] = busy
        inc[going_on, c + 3] = prop
        inc[going_on, c + 4] = wait
        busy_sums.append(inc[:, c : c + 2].ravel())  # service, then drafting, pass by pass
        wire = n_bytes * (1 + losses)
        link_sums.append((returns, wire, wire * 1.0))

        times = self._chain(inc.ravel(), chain.now_ms, verify, going_on)
        if times is None:
            return False
        t = times[1:].reshape(rows, cols)
        verdict = t[:, c]
        out.add("admitted", times[prefill_row * cols])
        out.add("first", verdict[prefill_row])
        out.add("finish", verdict[final_row])
        previous = np.concatenate([[chain.last_verdict_ms], verdict[:-1]])
        out.add("laps", (verdict - previous)[verify])
        chain.now_ms = float(times[-1])
        chain.last_verdict_ms = float(verdict[-1])
        if first_block:
            chain.stage_busy_ms = [0.0] * p
            chain.link_messages = [0] * p
            chain.link_bytes = [0.0] * p
            chain.link_bytes_decode = [0.0] * p
        for i, values in enumerate(busy_sums):
            chain.stage_busy_ms[i] = _running(chain.stage_busy_ms[i], values)
        for i, (count, wire, decode) in enumerate(link_sums):
            chain.link_messages[i] += count
            chain.link_bytes[i] = _running(chain.link_bytes[i], wire)
            chain.link_bytes_decode[i] = _running(chain.link_bytes_decode[i], decode)
        return True

    def _chain(self, flat: np.ndarray, now_ms: float, verify, going_on) -> np.ndarray | None:
        """[now, then the clock after each increment], with every event step T + (d - T)
        applied as SimPy applies it (module docstring)."""
        times = np.add.accumulate(np.concatenate([[now_ms], flat]))
        before, after = self._event_positions(len(verify), going_on)
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
        """Indices into the clock of (T, d) for every hop delivery (T: when the sending stage
        received the pass, or drafting ended on the return hop; d: the computed delivery)."""
        cols = self.columns
        row0 = np.arange(rows) * cols  # the clock before the row's first increment
        before, after = [], []
        for i in range(self.p - 1):
            c = HOP_COLUMNS * i
            before.append(row0 + c)
            after.append(row0 + c + HOP_COLUMNS)
        c = HOP_COLUMNS * (self.p - 1)
        before.append((row0 + c + 2)[going_on])
        after.append((row0 + c + 5)[going_on])
        return np.concatenate(before), np.concatenate(after)
