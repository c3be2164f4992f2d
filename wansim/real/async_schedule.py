"""Async in-pipe speculation at stage 0 of the real pipeline (``schedule: async``).

The protocol of ``wansim.sim.schedule`` on real models, one request at a time. Stage 0 keeps up
to B = ``max_inflight_blocks`` blocks of the request in the pipe (sent, verdict not yet back).
The first block of a window is drafted from the committed tokens (root = the last committed
token). A block launched behind another one bets that the earlier block accepts all its K
drafts: its root is the drafter's own guess ``g`` of the token after them (the drafter drafts
K + 1 tokens, ``g`` first), at position ``pos + K + 1``. S0 never bets past the request's end
(it launches only while ``new tokens + (K + 1) x blocks in flight < max_new_tokens``).

Validity, one rule in both places (stage 0 and the last stage): a block is valid iff its root is
the last committed token at its position, ``(pos, root) == (len(committed) - 1,
committed[-1])``. The last stage verifies every valid block exactly as in the sync schedule
(accepted drafts plus the target's bonus or correction token), so the committed tokens are those
of plain greedy decoding (greedy) or distributed as the target's (lossless: each valid block is
standard rejection sampling from its committed context). A bet wins iff the earlier block
accepted all K drafts and its bonus token equals ``g``: greedy, ``g == argmax p`` (the engines'
rate p_{K+1}); lossless, the bonus is *sampled* from p, so a bet wins with probability
``sum_x p(x) q(x)`` rather than the engines' ``sum_x min(p(x), q(x))`` (lower: the real path
does not verify the guess by rejection sampling; stated, not hidden).

Cancellation. On a lost bet, stage 0 drops the blocks behind it from its window, records them in
``raw/cancelled.csv`` and, when there are stages between it and the last, sends ``CANCEL`` (the
last valid pass id) down the forward hops; links are FIFO, so it reaches each stage after the
stale blocks and removes those still waiting in the stage's mailbox
(``ServingStageWorker.next_frame``); a stale block already computed is not undone (the next
valid pass crops the KV cache to its position). The last stage drops stale blocks without computing them
(the validity rule) and sends no verdict for them. Waste is counted in stage-tokens: a stale
block of n tokens computed by s stages wastes s x n (``cancelled_stage_tokens`` in the summary).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from wansim.real.frames import Kind, array_frame
from wansim.real.records import CancelRow, step_row
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


def generate_async(worker, job: dict) -> dict:
    """Stage 0's decode loop for an async job (``worker``: the ``FirstStageWorker``)."""
    import numpy as np

    worker.start_job(job)
    k = int(job["k"])
    window_max = int(job["max_inflight_blocks"])
    verifier = job["verifier"]
    temp = float(job["temperature"])
    max_new = int(job["max_new_tokens"])
    lossless = verifier == "lossless"
    if worker.drafter is None or k < 1:
        from wansim.real.worker import StageFailure

        raise StageFailure("stage 0: async speculation needs the draft model and k >= 1")
    outputs = {}
    for j, prompt in enumerate(job["prompts"]):
        tokens = [int(t) for t in prompt["tokens"]]
        dgen, _ = prompt_generators(int(job["seed"]), j)
        worker.drafter.reset()
        pid, _, _ = worker.send_pass(tokens, 0, [], None)
        _, first, _, _ = worker.wait_verdict(pid)
        committed = [*tokens, first]
        n_new, step = 1, 0
        window: deque[InFlight] = deque()
        while n_new < max_new:
            while len(window) < window_max and n_new + (k + 1) * len(window) < max_new:
                t_start = time.monotonic_ns()
                if window:  # bet: the block before accepts all K; guess the token after them
                    last = window[-1]
                    ctx = last.context + last.drafts
                    guess, q = worker.drafter.draft(ctx, k + 1, temp, dgen)
                    root, drafts, pos = guess[0], guess[1:], last.pos + k + 1
                    q = q[1:] if q is not None else None
                    context = [*ctx, root]
                else:
                    drafts, q = worker.drafter.draft(committed, k, temp, dgen)
                    root, pos, context = committed[-1], len(committed) - 1, list(committed)
                t_draft = time.monotonic_ns()
                ids = [root, *drafts]
                pid, s0_ms, sent = worker.send_pass(
                    ids, pos, ids, q if lossless else None, (t_draft - t_start) / 1e6
                )
                window.append(
                    InFlight(pid, pos, root, drafts, context, t_start, t_draft, sent, s0_ms)
                )
            front = window.popleft()
            acc, nxt, t_verdict, v_send = worker.wait_verdict(front.pass_id)
            if not 0 <= acc <= k:
                from wansim.real.worker import StageFailure

                raise StageFailure(f"stage 0: verdict says {acc} accepted of {k} drafts")
            committed.extend(front.drafts[:acc])
            committed.append(nxt)
            n_new += acc + 1
            worker.steps.write(
                step_row(
                    job=job["job"],
                    workload=prompt["workload"],
                    prompt_id=prompt["prompt_id"],
                    prompt_index=j,
                    step=step,
                    pass_=front.pass_id,
                    k=k,
                    accepted=acc,
                    pos=front.pos,
                    start_ns=front.t_start,
                    draft_end_ns=front.t_draft,
                    sent_ns=front.sent_ns,
                    verdict_ns=t_verdict,
                    stage0_ms=front.s0_ms,
                    send_ns_verdict=v_send,
                )
            )
            step += 1
            if window and (window[0].pos, window[0].root) != (len(committed) - 1, committed[-1]):
                now = time.monotonic_ns()
                for b in window:
                    worker.cancelled.write(
                        CancelRow(job["job"], j, b.pass_id, k + 1, front.pass_id, now)
                    )
                window.clear()
                if worker.cfg.stages > 2:  # stages between S0 and the last drop what waits
                    frame = array_frame(Kind.CANCEL, np.zeros(0, np.uint8), step=front.pass_id)
                    worker.send(frame)
        outputs[str(prompt["prompt_id"])] = committed[len(tokens) :][:max_new]
    return outputs
