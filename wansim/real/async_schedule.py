"""Async in-pipe speculation at stage 0 of the real pipeline (``schedule: async``).

The protocol of ``wansim.sim.async_speculation`` on real models. Stage 0 keeps up to C =
``concurrency`` requests in the pipe (1: one request at a time) and, for each, up to B =
``max_inflight_blocks`` blocks (sent, verdict not yet back): the request's *window*. Each request
has its own committed tokens, drafter stream (``prompt_generators(seed, j)``), drafter cache
(``Drafter.select(j)``) and KV cache at every stage (the frame header's ``request`` field). The
first block of a window is drafted from the committed tokens (root = the last committed token).
A block launched behind another one bets that the earlier block accepts all its K drafts: its
root is the drafter's own guess ``g`` of the token after them (the drafter drafts K + 1 tokens,
``g`` first), at position ``pos + K + 1``. S0 never bets past the request's end (it launches
only while ``new tokens + (K + 1) x blocks in flight < max_new_tokens``), so a request never
finishes with blocks of its own in flight.

Validity, one rule in both places (stage 0 and the last stage), per request: a block is valid
iff its root is the last committed token of its request at its position, ``(pos, root) ==
(len(committed) - 1, committed[-1])`` (the last stage keeps ``expect[request]``). The last stage
verifies every valid block exactly as in the sync schedule (accepted drafts plus the target's
bonus or correction token), so each request's committed tokens are those of plain greedy
decoding (greedy) or distributed as the target's (lossless: each valid block is standard
rejection sampling from its committed context). A bet wins iff the earlier block accepted all K
drafts and its bonus token equals ``g``: greedy, ``g == argmax p`` (the engines' rate
p_{K+1}); lossless, the bonus is *sampled* from p, so a bet wins with probability ``sum_x p(x)
q(x)`` rather than the engines' ``sum_x min(p(x), q(x))`` (lower: the real path does not verify
the guess by rejection sampling; stated, not hidden).

Order. Every stage and link is FIFO, so verdicts come back in the send order of the passes that
stay valid: stage 0 keeps one queue of outstanding passes (pass id, request) in send order and
waits for its head's verdict. After each verdict it refills the windows of the live requests in
admission order; a finished request's slot goes to the next waiting prompt (its prefill), as in
:mod:`wansim.real.concurrent_schedule`.

Cancellation. On a lost bet of request r, stage 0 drops r's blocks behind it from r's window
and from the outstanding queue (no verdict will come for them), records them in
``raw/cancelled.csv`` and, when there are stages between it and the last, sends ``CANCEL``
tagged with r (step = the last valid pass id) down the forward hops; links are FIFO, so it
reaches each stage after the stale blocks and removes r's passes with a later id still waiting
in the stage's mailbox (``ServingStageWorker.next_frame``), never another request's; a stale
block already computed is not undone (r's next valid pass crops r's KV cache to its position).
The last stage drops stale blocks without computing them (the validity rule) and sends no
verdict for them. Waste is counted in stage-tokens: a stale block of n tokens computed by s
stages wastes s x n (``cancelled_stage_tokens`` in the summary).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from wansim.real.concurrent_schedule import Request, commit_prefill, commit_verdict
from wansim.real.frames import Kind, array_frame, with_request
from wansim.real.records import CancelRow
from wansim.real.speculative import prompt_generators


@dataclass
class InFlight:
    """A block in the pipe: pass id, position of its root, root token, drafts, the tokens it was
    drafted from (ending with the root) and stage 0's timings."""

    pass_id: int
    pos: int
    root: int
    drafts: list[int]
    context: list[int]
    t_start: int
    t_draft: int
    sent_ns: int
    s0_ms: float


@dataclass
class AsyncRequest(Request):
    """A request in the pipe and its window of blocks in flight (oldest first)."""

    window: deque = field(default_factory=deque)


def generate_async(worker, job: dict) -> dict:
    """Stage 0's decode loop for an async job (``worker``: the ``FirstStageWorker``)."""
    import numpy as np

    from wansim.real.worker import StageFailure

    worker.start_job(job)
    k = int(job["k"])
    window_max = int(job["max_inflight_blocks"])
    limit = int(job.get("concurrency", 1))
    temp = float(job["temperature"])
    max_new = int(job["max_new_tokens"])
    lossless = job["verifier"] == "lossless"
    if worker.drafter is None or k < 1:
        raise StageFailure("stage 0: async speculation needs the draft model and k >= 1")
    waiting = deque(enumerate(job["prompts"]))
    live: dict[int, AsyncRequest] = {}  # the requests in the pipe, in admission order
    outstanding: deque = deque()  # (pass id, request, block or None: prefill) in send order
    outputs = {}

    def start_next() -> None:
        j, prompt = waiting.popleft()
        tokens = [int(t) for t in prompt["tokens"]]
        req = AsyncRequest(j, prompt, tokens, prompt_generators(int(job["seed"]), j)[0])
        worker.drafter.select(j)
        worker.drafter.reset()
        pid, _, _ = worker.send_pass(tokens, 0, [], None, request=j)
        live[j] = req
        outstanding.append((pid, req, None))

    def refill(req: AsyncRequest) -> None:
        window = req.window
        while len(window) < window_max and req.n_new + (k + 1) * len(window) < max_new:
            t_start = time.monotonic_ns()
            worker.drafter.select(req.index)
            if window:  # bet: the block before accepts all K; guess the token after them
                last = window[-1]
                ctx = last.context + last.drafts
                guess, q = worker.drafter.draft(ctx, k + 1, temp, req.dgen)
                root, drafts, pos = guess[0], guess[1:], last.pos + k + 1
                q = q[1:] if q is not None else None
                context = [*ctx, root]
            else:
                drafts, q = worker.drafter.draft(req.committed, k, temp, req.dgen)
                root, pos, context = req.committed[-1], len(req.committed) - 1, list(req.committed)
            t_draft = time.monotonic_ns()
            ids = [root, *drafts]
            pid, s0_ms, sent = worker.send_pass(
                ids,
                pos,
                ids,
                q if lossless else None,
                (t_draft - t_start) / 1e6,
                request=req.index,
            )
            block = InFlight(pid, pos, root, drafts, context, t_start, t_draft, sent, s0_ms)
            window.append(block)
            outstanding.append((pid, req, block))

    def cancel(req: AsyncRequest, after: int) -> None:
        """A lost bet of ``req`` (``after``: its last valid pass): drop the blocks behind it."""
        nonlocal outstanding
        now = time.monotonic_ns()
        stale = set()
        for b in req.window:
            worker.cancelled.write(CancelRow(job["job"], req.index, b.pass_id, k + 1, after, now))
            stale.add(b.pass_id)
        req.window.clear()
        outstanding = deque(o for o in outstanding if o[0] not in stale)
        if worker.cfg.stages > 2:  # stages between S0 and the last drop what waits
            frame = array_frame(Kind.CANCEL, np.zeros(0, np.uint8), step=after)
            worker.send(with_request(frame, req.index))

    while waiting and len(live) < limit:
        start_next()
    while outstanding:
        pid, req, block = outstanding.popleft()
        acc, nxt, t_verdict, v_send = worker.wait_verdict(pid)
        if block is None:
            commit_prefill(req, nxt)
        else:
            if req.window.popleft() is not block:
                raise StageFailure(f"stage 0: verdict of pass {pid} out of its request's order")
            times = (block.t_start, block.t_draft, block.sent_ns, block.s0_ms, t_verdict, v_send)
            commit_verdict(worker, job, req, pid, k, acc, nxt, block.drafts, block.pos, times)
            head = req.window[0] if req.window else None
            if head is not None and (head.pos, head.root) != (
                len(req.committed) - 1,
                req.committed[-1],
            ):
                cancel(req, pid)
        if req.n_new >= max_new:
            outputs[str(req.prompt["prompt_id"])] = req.committed[len(req.tokens) :][:max_new]
            del live[req.index]
            if waiting:
                start_next()
        for r in list(live.values()):
            if r.committed:  # its prefill's verdict is in
                refill(r)
    return outputs
