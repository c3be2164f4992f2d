"""Continuous batching with micro-batches through the real pipeline (``batching: continuous``).

The requests in flight (``concurrency``, at most ``micro_batches x max_batch_size``) are split
into ``micro_batches`` micro-batches that circulate the ring at once, as pipeline-parallel
serving engines keep one batch per stage busy. A micro-batch is one pass: stage 0 drafts a
block for each member, packs the blocks (ragged: a member's K + 1 verify tokens, a new member's
whole prompt; the drafter drafts every member's block in one forward per draft position,
``Drafter.draft_batch``) into one activation message with a ``BATCH`` frame that says whose rows are whose
(request, position, tokens, drafts), and every stage runs ONE forward over them
(``StageShard.forward_batch``: each block on its own request's KV cache, a block-diagonal
mask). The last stage verifies each block with its request's own streams and returns one
verdict record per block. Stages serve micro-batches FIFO, one at a time.

The rules are the engines' (``wansim.serving.micro_batching``): an admitted request joins the
micro-batch with the fewest members (ties: the one whose request just finished, then the lowest
index); its prompt rides in that micro-batch's next pass beside the members' verify blocks
(prefill shares the passes, whole prompts); a member that has its tokens leaves at its verdict.
A request's drafter, verifier and random streams are its own, so its tokens equal those of
decoding it alone (greedy: plain greedy decoding; lossless: the in-process reference).

One ``steps.csv`` row per verified block, every block of a pass with that pass's id and times
(its drafting time is the pass's: stage 0 drafts every member before the pass leaves).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from wansim.real.concurrent_schedule import Request, commit_prefill, commit_verdict
from wansim.real.speculative import prompt_generators


@dataclass
class MicroBatch:
    index: int
    members: list[Request] = field(default_factory=list)
    joiners: list[Request] = field(default_factory=list)  # prompts riding the next pass
    in_flight: bool = False

    @property
    def size(self) -> int:
        return len(self.members) + len(self.joiners)


def batch_slots(concurrency: int, micro_batches: int, max_batch_size: int | None) -> int:
    """Requests in flight at once (``wansim.serving.micro_batching.serving_slots``'s rule)."""
    return (
        concurrency if max_batch_size is None else min(concurrency, micro_batches * max_batch_size)
    )


def per_batch_cap(slots: int, max_batch_size: int | None) -> int:
    """Members of one micro-batch at most (no cap: every request in flight)."""
    return max_batch_size if max_batch_size is not None else slots


def generate_batched(worker, job: dict) -> dict:
    """Stage 0's loop for a continuously batched job (module docstring)."""
    from wansim.real.worker import StageFailure

    worker.start_job(job)
    k = int(job["k"])
    temp = float(job["temperature"])
    lossless = job["verifier"] == "lossless"
    max_new = int(job["max_new_tokens"])
    n_mb = int(job.get("micro_batches") or 1)
    cap_b = job.get("max_batch_size")
    slots = batch_slots(int(job["concurrency"]), n_mb, cap_b)
    cap = per_batch_cap(slots, cap_b)
    if k > 0 and worker.drafter is None:
        raise StageFailure("stage 0: k > 0 needs a drafter (drafter_dir)")
    waiting = deque(enumerate(job["prompts"]))
    batches = [MicroBatch(i) for i in range(n_mb)]
    outstanding: deque = deque()  # (pass id, micro-batch, entries, times) in send order
    outputs: dict = {}
    active = 0

    def admit(just_finished: int | None) -> None:
        nonlocal active
        while waiting and active < slots:
            open_ = [b for b in batches if b.size < cap]
            if not open_:
                return
            mb = min(open_, key=lambda b: (b.size, b.index != just_finished, b.index))
            j, prompt = waiting.popleft()
            tokens = [int(t) for t in prompt["tokens"]]
            mb.joiners.append(Request(j, prompt, tokens, prompt_generators(int(job["seed"]), j)[0]))
            active += 1

    def send(mb: MicroBatch) -> None:
        t_start = time.monotonic_ns()
        blocks, ids, drafts_all, qs, entries = [], [], [], [], []
        items = [(req.index, req.committed, req.dgen) for req in mb.members]
        drafted = worker.drafter.draft_batch(items, k, temp) if k else [([], None)] * len(items)
        for req, (drafts, q) in zip(mb.members, drafted, strict=True):
            pos = len(req.committed) - 1
            blocks.append((req.index, pos, k + 1, k))
            ids += [req.committed[-1], *drafts]
            drafts_all += drafts
            if q is not None:
                qs.append(q)
            entries.append((req, "verify", drafts, pos))
        for req in mb.joiners:
            if worker.drafter is not None:
                worker.drafter.select(req.index)
                worker.drafter.reset()
            blocks.append((req.index, 0, len(req.tokens), 0))
            ids += req.tokens
            entries.append((req, "prefill", [], 0))
        mb.members, mb.joiners = [], []
        t_draft = time.monotonic_ns()
        q_all = None
        if lossless and qs:
            import torch

            q_all = torch.cat(qs)
        pid, s0_ms, sent = worker.send_batch(
            blocks, ids, drafts_all, q_all, (t_draft - t_start) / 1e6
        )
        mb.in_flight = True
        outstanding.append((pid, mb, entries, (t_start, t_draft, sent, s0_ms)))

    admit(None)
    for mb in batches:
        if mb.size:
            send(mb)
    while outstanding:
        pid, mb, entries, (t_start, t_draft, sent, s0_ms) = outstanding.popleft()
        verdicts, t_verdict, v_send = worker.wait_batch_verdict(pid)
        mb.in_flight = False
        if sorted(verdicts) != sorted(req.index for req, *_ in entries):
            raise StageFailure(
                f"stage 0: batched verdict of pass {pid} names requests {sorted(verdicts)}, "
                f"the pass carried {sorted(req.index for req, *_ in entries)}"
            )
        finished = False
        for req, kind, drafts, pos in entries:
            acc, nxt = verdicts[req.index]
            if kind == "prefill":
                commit_prefill(req, nxt)
            else:
                times = (t_start, t_draft, sent, s0_ms, t_verdict, v_send)
                commit_verdict(worker, job, req, pid, k, acc, nxt, drafts, pos, times)
            if req.n_new < max_new:
                mb.members.append(req)
            else:
                outputs[str(req.prompt["prompt_id"])] = req.committed[len(req.tokens) :][:max_new]
                active -= 1
                finished = True
        admit(mb.index if finished else None)
        for other in batches:
            if not other.in_flight and other.size:
                send(other)
    return outputs
