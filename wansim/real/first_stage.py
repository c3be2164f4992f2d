"""Stage 0's worker: the drafter (``draft_model``) and the decode loop.

Stage 0 runs what the runner asks over the control pipe (generate a job, profile, shut down):
for each prompt the prefill, then verify passes: draft K tokens (or take the drafts the last
stage's MTP head sent back with the verdict), compute stage 0's layers, send ``DRAFT_IDS [,
DRAFT_PROBS] [, TREE], HIDDEN`` on hop 0 and wait for the ``VERDICT`` on the return hop (giving
up after ``stall_timeout_s``). One row per verify step goes to ``raw/steps.csv``. Concurrent
requests and async in-pipe speculation have their own loops
(:mod:`wansim.real.concurrent_schedule`, :mod:`wansim.real.async_schedule`) over this worker.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import numpy as np
import torch

from wansim.real import codec
from wansim.real.concurrent_schedule import Request, commit_prefill, commit_verdict
from wansim.real.frames import (
    BATCHED_POS,
    Kind,
    array_frame,
    batch_frame,
    frame_text,
    message_frame,
    tree_frame,
    with_request,
)
from wansim.real.model import load_lm
from wansim.real.records import CancelRow, RecordLog, StageRow, StepRow
from wansim.real.speculative import Drafter, prompt_generators
from wansim.real.worker import StageConfig, StageFailure, StageWorker, _tree_spec


class FirstStageWorker(StageWorker):
    """Stage 0: the drafter and the decode loop (module docstring)."""

    def __init__(self, cfg: StageConfig, conn):
        super().__init__(cfg, conn)
        self.prefills = 0
        self.returned: dict = {}  # drafts that came back with a verdict (MTP head)
        self.path: list[int] = []  # accepted tree nodes of the last verdict

    def _load_role(self, model) -> None:
        cfg = self.cfg
        self.mtp_mode = cfg.drafter_kind == "mtp"  # the drafts come from the last stage
        self.drafter = None
        if cfg.drafter_dir:
            self.drafter = Drafter(
                load_lm(
                    cfg.drafter_dir,
                    field="drafter_dir",
                    noise=cfg.drafter_noise,
                    noise_seed=cfg.noise_seed,
                    device=cfg.device,
                )
            )

    def _open_role_records(self, raw: Path) -> None:
        self.steps = RecordLog(raw / "steps.csv", StepRow)
        self.cancelled = RecordLog(raw / "cancelled.csv", CancelRow)

    @torch.no_grad()
    def _warm_up(self) -> None:
        super()._warm_up()
        if self.drafter is not None:
            gen = torch.Generator().manual_seed(0)
            self.drafter.draft([0] * 8, 4, 1.0, gen)
            self.drafter.draft([0] * 10, 4, 0.0, gen)
            self.drafter.reset()

    def run(self) -> None:
        self.control_loop()

    def _verdict_frame(self, step: int):
        """The ``VERDICT`` frame of pass ``step`` and when it arrived (module docstring)."""
        timeout = self.cfg.stall_timeout_s
        self.returned = {}
        while True:
            try:
                f = self.recv(timeout)
            except TimeoutError:
                raise StageFailure(
                    f"stage 0: no verdict for pass {step} within {timeout:g} s "
                    "(stalled link or stage)"
                ) from None
            if f.kind == Kind.DRAFT_IDS and f.header.step == step and self.mtp_mode:
                self.returned["ids"] = f.array().astype(int).tolist()
            elif f.kind == Kind.DRAFT_PROBS and f.header.step == step and self.mtp_mode:
                self.returned["q"] = torch.from_numpy(f.array().copy())
            else:
                break
        now = time.monotonic_ns()
        if f.kind == Kind.ERROR:
            raise StageFailure(frame_text(f))
        if f.kind != Kind.VERDICT or f.header.step != step:
            raise StageFailure(
                f"stage 0: expected the verdict of pass {step} on {self.hop_in()}, "
                f"got {f.kind.name} for pass {f.header.step}"
            )
        return f, now

    def wait_verdict(self, step: int) -> tuple[int, int, int, int]:
        """(accepted, next_token, received_ns, sender's send_ns) for pass ``step``; drafts that
        rode the verdict (MTP head at the last stage) land in ``self.returned``, a tree pass's
        accepted nodes in ``self.path``."""
        f, now = self._verdict_frame(step)
        arr = f.array()
        if arr.ndim != 1 or arr.shape[0] < 2 or arr.shape[0] not in (2, 2 + int(arr[0])):
            raise StageFailure(f"stage 0: verdict of shape {list(arr.shape)} on {self.hop_in()}")
        self.path = [int(x) for x in arr[2:]]
        return int(arr[0]), int(arr[1]), now, f.header.send_ns

    def wait_batch_verdict(self, step: int) -> tuple[dict[int, tuple[int, int]], int, int]:
        """A batched pass's verdict: {request: (accepted, next token)}, received_ns, send_ns."""
        f, now = self._verdict_frame(step)
        arr = f.array()
        if arr.ndim != 2 or arr.shape[1] != 3:
            raise StageFailure(
                f"stage 0: batched verdict of shape {list(arr.shape)} on {self.hop_in()}"
            )
        return {int(r): (int(a), int(t)) for r, a, t in arr}, now, f.header.send_ns

    def send_batch(self, blocks: list, ids: list[int], drafts: list[int], q, draft_ms: float):
        """Stage 0's share of a batched pass (``blocks``: (request, pos, n, drafts) in row
        order, ``ids`` the packed input tokens); returns (pass id, compute ms, sent_ns)."""
        step = self.passes
        self._tick_fault()
        out, start, end, cpu = self._timed_forward(torch.tensor(ids), 0, step, None, blocks)
        extra = [batch_frame(blocks, step)]
        return self._ship(
            out, step, BATCHED_POS, -1, len(ids), start, end, cpu, drafts, q, extra, draft_ms
        )

    def returned_drafts(self, step: int, k: int, lossless: bool) -> tuple[list[int], object]:
        """The K drafts (and q) that came back with the verdict of pass ``step``."""
        if k == 0:
            return [], None
        ids, q = self.returned.get("ids"), self.returned.get("q")
        if ids is None or len(ids) != k or (lossless and (q is None or q.shape[0] != k)):
            raise StageFailure(
                f"stage 0: the verdict of pass {step} on {self.hop_in()} came without its "
                f"{k} drafts{' and their probabilities' if lossless else ''}"
            )
        return ids, (q if lossless else None)

    def send_pass(
        self,
        ids: list[int],
        pos: int,
        drafts: list[int],
        q,
        draft_ms: float = 0.0,
        tree=None,
        request: int = 0,
    ) -> tuple:
        """Stage 0's share of a pass; returns (pass id, compute ms, sent_ns). ``tree``:
        (parents, keep) of a tree pass (``ids`` are then the tree's node tokens); ``request``:
        which request in flight it belongs to (its KV cache at every stage)."""
        step = self.passes
        self._tick_fault()
        self.shard.select(request)
        out, start, end, cpu = self._timed_forward(torch.tensor(ids), pos, step, tree)
        extra = [] if tree is None else [tree_frame(tree[0], tree[1], step=step, pos=pos)]
        return self._ship(
            out, step, pos, pos, len(ids), start, end, cpu, drafts, q, extra, draft_ms, request
        )

    def _ship(
        self,
        out,
        step: int,
        header_pos: int,
        log_pos: int,
        n_tokens: int,
        start: int,
        end: int,
        cpu_ns: int,
        drafts: list[int],
        q,
        extra: list,
        draft_ms: float,
        request: int | None = None,
    ) -> tuple:
        """Send stage 0's share of pass ``step``: the drafts (and their probabilities ``q``),
        the ``extra`` frames (tree or batch layout), then the encoded hidden state, each tagged
        with ``request`` when given; log the stage row (``cpu_ns``: the thread's CPU time over
        the compute). Returns (pass id, compute ms, sent_ns)."""
        cpu_end = time.thread_time_ns()  # stage 0's pass: its compute, then encode and send
        t0 = time.perf_counter_ns()
        hidden = codec.encode(
            Kind.HIDDEN,
            out.cpu().numpy(),
            self.cfg.activation_bits,
            self.cfg.group_size,
            step=step,
            pos=header_pos,
        )
        codec_ns = time.perf_counter_ns() - t0
        frames = [array_frame(Kind.DRAFT_IDS, np.array(drafts, dtype=np.int32), step=step)]
        if q is not None:
            frames.append(array_frame(Kind.DRAFT_PROBS, q.float().numpy(), step=step))
        frames += [*extra, hidden]
        if request is not None:
            frames = [with_request(f, request) for f in frames]
        nbytes = sum(self.send(f) for f in frames)
        pass_cpu = cpu_ns + time.thread_time_ns() - cpu_end
        sent = time.monotonic_ns()
        self.log.write(
            StageRow(
                self.job.get("job", -1),
                step,
                n_tokens,
                log_pos,
                start,
                0,
                start,
                end,
                sent,
                f"{(end - start) / 1e6:.4f}",
                f"{codec_ns / 1e6:.4f}",
                "0",
                nbytes,
                f"{draft_ms:.4f}",
                f"{cpu_ns / 1e6:.4f}",
                f"{pass_cpu / 1e6:.4f}",
            )
        )
        return step, (end - start) / 1e6, sent

    def start_job(self, job: dict) -> None:
        self.job = job
        self.prefills = 0
        self.tree_pos = {}
        self.shard.reset_all()
        if self.drafter is not None:
            self.drafter.select(0)
        self.send(message_frame(Kind.JOB, json.dumps(job)))

    def generate(self, job: dict) -> dict:
        if job.get("batching", "none") == "continuous":
            from wansim.real.batched_schedule import generate_batched

            return generate_batched(self, job)
        if job.get("schedule") == "async":  # one request or several in flight
            from wansim.real.async_schedule import generate_async

            return generate_async(self, job)
        if int(job.get("concurrency", 1)) > 1:
            from wansim.real.concurrent_schedule import generate_concurrent

            return generate_concurrent(self, job)
        self.start_job(job)
        k = int(job["k"])
        verifier = job["verifier"]
        temp = float(job["temperature"])
        max_new = int(job["max_new_tokens"])
        tree_spec = _tree_spec(job.get("tree"))
        if (k > 0 or tree_spec) and self.drafter is None and not self.mtp_mode:
            raise StageFailure("stage 0: k > 0 needs a drafter (drafter_dir)")
        if tree_spec is not None and self.mtp_mode:
            raise StageFailure("stage 0: draft trees need the draft model at stage 0")
        fixed = tree_spec.shape() if tree_spec is not None else None
        fixed = fixed.canonical() if fixed is not None else None
        lossless = verifier == "lossless"
        draft_stage = self.cfg.stages - 1 if self.mtp_mode else 0
        outputs = {}
        for j, prompt in enumerate(job["prompts"]):
            tokens = [int(t) for t in prompt["tokens"]]
            dgen, _ = prompt_generators(int(job["seed"]), j)
            if self.drafter is not None:
                self.drafter.reset()
            step_id, _, _ = self.send_pass(tokens, 0, [], None)
            _, first, _, _ = self.wait_verdict(step_id)
            if self.mtp_mode:
                ret = self.returned_drafts(step_id, k, lossless)
            req = Request(j, prompt, tokens, dgen)
            commit_prefill(req, first)
            keep: list[int] = []  # the previous tree pass's root and accepted path
            while req.n_new < max_new:
                t_start = time.monotonic_ns()
                tree = None
                if tree_spec is not None:
                    from wansim.real.tree_speculative import draft_tree

                    tree = draft_tree(self.drafter, req.committed, tree_spec, fixed, temp, dgen)
                    drafts, q = list(tree.tokens[1:]), tree.q
                elif self.mtp_mode:  # drafted by the last stage, came back with the verdict
                    drafts, q = ret
                else:
                    drafts, q = (
                        self.drafter.draft(req.committed, k, temp, dgen) if k else ([], None)
                    )
                t_draft = time.monotonic_ns()
                pos = len(req.committed) - 1
                if tree is None:
                    ids, shape = [req.committed[-1], *drafts], None
                else:
                    ids, shape = list(tree.tokens), (list(tree.shape.parent), keep)
                pid, s0_ms, sent = self.send_pass(
                    ids,
                    pos,
                    drafts,
                    q if lossless else None,
                    (t_draft - t_start) / 1e6 if not self.mtp_mode else 0.0,
                    tree=shape,
                )
                acc, nxt, t_verdict, v_send = self.wait_verdict(pid)
                if self.mtp_mode:
                    ret = self.returned_drafts(pid, k, lossless)
                times = (t_start, t_draft, sent, s0_ms, t_verdict, v_send)
                path = tuple(self.path)
                commit_verdict(
                    self,
                    job,
                    req,
                    pid,
                    k,
                    acc,
                    nxt,
                    drafts,
                    pos,
                    times,
                    path=path,
                    tree=tree,
                    draft_stage=draft_stage,
                )
                if tree is not None:
                    keep = [0, *path]
            outputs[str(prompt["prompt_id"])] = req.committed[len(tokens) :][:max_new]
        return outputs

    def profile(self, job: dict) -> None:
        """Compute-table passes: n tokens at ``context`` cached positions, ``repeats`` each."""
        self.start_job(job)
        gen = torch.Generator().manual_seed(int(job["seed"]))
        vocab = self.shard.vocab_size
        ctx = [
            int(t) for t in torch.randint(0, vocab, (int(job["context_tokens"]),), generator=gen)
        ]
        pid, _, _ = self.send_pass(ctx, 0, [], None)
        self.wait_verdict(pid)
        for _ in range(int(job["repeats"])):  # round-robin, so load drifts hit every n alike
            for n in job["n_values"]:
                ids = [int(t) for t in torch.randint(0, vocab, (int(n),), generator=gen)]
                pid, _, _ = self.send_pass(ids, len(ctx), ids[1:], None)
                self.wait_verdict(pid)

    def control_loop(self) -> None:
        while True:
            msg = self.ctrl.recv()
            cmd = msg.get("cmd")
            if cmd == "generate":
                outputs = self.generate(msg["job"])
                self.ctrl.send(event="done", job=msg["job"]["job"], outputs=outputs)
            elif cmd == "profile":
                self.profile(msg["job"])
                self.ctrl.send(event="done", job=msg["job"]["job"], outputs={})
            elif cmd == "shutdown":
                self.send(array_frame(Kind.SHUTDOWN, np.zeros(0, np.uint8)))
                with contextlib.suppress(TimeoutError, StageFailure):
                    self.recv(10)
                self.ctrl.send(event="closed", stage=0)
                return
            else:
                raise StageFailure(f"stage 0: unknown command {cmd!r}")
