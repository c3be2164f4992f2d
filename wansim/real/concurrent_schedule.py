"""Several requests in flight at once through the real pipeline (``concurrency > 1``).

Stage 0 keeps up to C = ``concurrency`` requests in the pipe, each with one pass in flight (the
sync schedule per request: a request's next block is drafted from its last verdict). Every
stage serves passes in arrival order (FIFO: one TCP stream per hop) and keeps one KV cache per
request (``StageShard.select``; the frame header's ``request`` field says whose pass it is), so
while one request's pass travels a hop the stages compute the others'. Verdicts come back in the
order passes were sent (every stage and link is FIFO), so stage 0 serves them in that order: it
commits the request's tokens and sends its next pass, or - the request done - the prefill of the
next waiting request. A request's drafter, verifier and random streams are its own (the same
derivation as one at a time), so its tokens equal those of the sync run: plain greedy output
(greedy) or the in-process reference's draws (lossless).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from wansim.real.records import step_row
from wansim.real.speculative import prompt_generators


@dataclass
class Request:
    index: int
    prompt: dict
    tokens: list[int]
    dgen: object
    committed: list[int] = field(default_factory=list)
    n_new: int = 0
    step: int = 0
    keep: list[int] = field(default_factory=list)  # tree passes: the last one's root + path


def commit_prefill(req: Request, nxt: int) -> None:
    """The prefill's verdict: the prompt plus the first token."""
    req.committed = [*req.tokens, nxt]
    req.n_new = 1


def commit_verdict(
    worker,
    job: dict,
    req: Request,
    pid: int,
    k: int,
    acc: int,
    nxt: int,
    drafts: list[int],
    pos: int,
    times: tuple,
    *,
    path: tuple[int, ...] = (),
    tree=None,
    draft_stage: int = 0,
) -> None:
    """One verify pass's verdict for ``req``: commit its ``acc`` accepted drafts (of a chain) or
    the accepted ``path`` of node indices (of a ``tree`` pass) and the next token, and write the
    step's record. ``times``: (start, draft end, sent ns; stage-0 ms; verdict ns, verdict send
    ns). A verdict that names drafts the pass did not carry is a ``StageFailure``."""
    from wansim.real.worker import StageFailure

    ranks = children = ""
    if tree is None:
        if not 0 <= acc <= k or path:
            raise StageFailure(f"stage 0: verdict says {acc} accepted of {k} drafts")
        req.committed.extend(drafts[:acc])
        nodes = len(drafts)
    else:
        from wansim.real.tree_speculative import walk_record

        if any(not 1 <= n <= tree.nodes for n in path):
            raise StageFailure(f"stage 0: verdict path {list(path)} outside the tree")
        rec = walk_record(tree.shape, path)
        req.committed.extend(tree.tokens[n] for n in path)
        nodes = tree.nodes
        ranks = ";".join(map(str, rec.ranks))
        children = ";".join(map(str, rec.children))
    t_start, t_draft, sent, s0_ms, t_verdict, v_send = times
    req.committed.append(nxt)
    req.n_new += acc + 1
    worker.steps.write(
        step_row(
            job=job["job"],
            workload=req.prompt["workload"],
            prompt_id=req.prompt["prompt_id"],
            prompt_index=req.index,
            step=req.step,
            pass_=pid,
            k=k,
            accepted=acc,
            pos=pos,
            start_ns=t_start,
            draft_end_ns=t_draft,
            sent_ns=sent,
            verdict_ns=t_verdict,
            stage0_ms=s0_ms,
            send_ns_verdict=v_send,
            draft_stage=draft_stage,
            nodes=nodes,
            accepted_ranks=ranks,
            walk_children=children,
        )
    )
    req.step += 1


def generate_concurrent(worker, job: dict) -> dict:
    """Stage 0's loop for a job with ``concurrency`` requests in flight (chains, or a draft
    tree per pass with ``job["tree"]``: each request keeps its own previous tree's accepted
    path, which every stage keeps in that request's KV cache)."""
    from wansim.real.worker import StageFailure, _tree_spec

    worker.start_job(job)
    k = int(job["k"])
    temp = float(job["temperature"])
    lossless = job["verifier"] == "lossless"
    max_new = int(job["max_new_tokens"])
    limit = int(job["concurrency"])
    tree_spec = _tree_spec(job.get("tree"))
    if (k > 0 or tree_spec is not None) and worker.drafter is None:
        raise StageFailure("stage 0: k > 0 needs a drafter (drafter_dir)")
    fixed = tree_spec.shape() if tree_spec is not None else None
    fixed = fixed.canonical() if fixed is not None else None
    waiting = deque(enumerate(job["prompts"]))
    outstanding: deque = deque()  # (pass id, request, kind, block) in send order
    outputs = {}

    def start_next() -> None:
        j, prompt = waiting.popleft()
        tokens = [int(t) for t in prompt["tokens"]]
        req = Request(j, prompt, tokens, prompt_generators(int(job["seed"]), j)[0])
        if worker.drafter is not None:
            worker.drafter.select(j)
            worker.drafter.reset()
        pid, _, _ = worker.send_pass(tokens, 0, [], None, request=j)
        outstanding.append((pid, req, "prefill", None))

    def send_block(req: Request) -> None:
        t_start = time.monotonic_ns()
        drafts, q, tree, shape = [], None, None, None
        if tree_spec is not None:
            from wansim.real.tree_speculative import draft_tree

            worker.drafter.select(req.index)
            tree = draft_tree(worker.drafter, req.committed, tree_spec, fixed, temp, req.dgen)
            drafts, q = list(tree.tokens[1:]), tree.q
            ids, shape = list(tree.tokens), (list(tree.shape.parent), req.keep)
        else:
            if k:
                worker.drafter.select(req.index)
                drafts, q = worker.drafter.draft(req.committed, k, temp, req.dgen)
            ids = [req.committed[-1], *drafts]
        t_draft = time.monotonic_ns()
        pos = len(req.committed) - 1
        pid, s0_ms, sent = worker.send_pass(
            ids,
            pos,
            drafts,
            q if lossless else None,
            (t_draft - t_start) / 1e6,
            tree=shape,
            request=req.index,
        )
        block = (drafts, pos, t_start, t_draft, sent, s0_ms, tree)
        outstanding.append((pid, req, "verify", block))

    while waiting and len(outstanding) < limit:
        start_next()
    while outstanding:
        pid, req, kind, block = outstanding.popleft()
        acc, nxt, t_verdict, v_send = worker.wait_verdict(pid)
        if kind == "prefill":
            commit_prefill(req, nxt)
        else:
            drafts, pos, t_start, t_draft, sent, s0_ms, tree = block
            times = (t_start, t_draft, sent, s0_ms, t_verdict, v_send)
            path = tuple(worker.path)
            commit_verdict(
                worker, job, req, pid, k, acc, nxt, drafts, pos, times, path=path, tree=tree
            )
            if tree is not None:
                req.keep = [0, *path]
        if req.n_new < max_new:
            send_block(req)
        else:
            outputs[str(req.prompt["prompt_id"])] = req.committed[len(req.tokens) :][:max_new]
            if waiting:
                start_next()
    return outputs
