"""The last stage's worker: verify each pass and send the verdict back to stage 0.

Draft ids, probabilities and tree shapes are kept per pass until its activations arrive; the
verdict ``VERDICT [accepted, next_token, path...]`` goes back on the return hop. With
``drafter_kind == "mtp"`` this stage holds the MTP head and, right after verifying a pass (or the
prefill), drafts K tokens that ride the verdict (``DRAFT_IDS [, DRAFT_PROBS]`` first). In async
jobs a block whose position or root no longer follows the last verdict of its request (a lost
bet) is dropped without computing it (:class:`~wansim.real.worker.ServingStageWorker` runs the
frame loop).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from wansim.real.frames import Frame, Kind, array_frame
from wansim.real.speculative import prompt_generators, sample_first, verify
from wansim.real.worker import ServingStageWorker, StageConfig, StageFailure


class LastStageWorker(ServingStageWorker):
    """Stage P-1: the verifier (and the MTP head, when it drafts here)."""

    def __init__(self, cfg: StageConfig, conn):
        super().__init__(cfg, conn)
        self.prefills = 0
        self.vgen = None
        self.dgen = None
        self.gens: dict[int, tuple] = {}  # request -> (dgen, vgen)
        self.pending: dict[int, dict] = {}  # pass -> its drafts (ids, q, parents, root, request)
        self.expect: dict[int, tuple[int, int]] = {}  # async: request -> its valid (pos, root)

    def _load_role(self, model) -> None:
        self.mtp = None
        if self.cfg.drafter_kind == "mtp":
            from wansim.real.mtp import load_mtp

            self.mtp = load_mtp(self.cfg.mtp_dir, model)
            self.mtp.head.to(self.cfg.device)

    @torch.no_grad()
    def _warm_up(self) -> None:
        super()._warm_up()
        if self.mtp is not None:
            gen = torch.Generator().manual_seed(0)
            h0 = torch.zeros(self.shard.hidden_size, device=self.shard.device)
            self.mtp.draft(h0, 0, 4, 1.0, gen)
            self.mtp.draft(h0, 0, 4, 0.0, gen)

    # ------------------------------------------------------------------ the frames of a pass
    def _new_job(self) -> None:
        self.prefills = 0
        self.expect.clear()
        self.pending.clear()
        self.gens.clear()

    def _pass_on(self, f: Frame) -> None:
        """The ``JOB`` frame ends here."""

    def _draft_ids(self, f: Frame) -> None:
        ids = f.array().astype(int).tolist()
        if self.job.get("schedule") == "async" and ids:  # [root, drafts...]
            self.pending[f.header.step] = {
                "root": ids[0],
                "ids": ids[1:],
                "request": f.header.request,
            }
        else:
            self.pending[f.header.step] = {"ids": ids}

    def _cancel(self, f: Frame) -> None:
        # the request's stale passes whose activations never came (dropped upstream)
        h = f.header
        for step, pend in list(self.pending.items()):
            if step > h.step and pend.get("request") == h.request:
                del self.pending[step]

    def _draft_probs(self, f: Frame) -> None:
        if f.header.step not in self.pending:
            raise StageFailure(
                f"stage {self.i}: draft probabilities for unknown pass {f.header.step}"
            )
        self.pending[f.header.step]["q"] = torch.from_numpy(f.array().copy())

    def _tree(self, f: Frame, parents: list[int]) -> None:
        if f.header.step not in self.pending:
            raise StageFailure(f"stage {self.i}: tree shape for unknown pass {f.header.step}")
        self.pending[f.header.step]["parents"] = parents

    def _batch(self, f: Frame, blocks: list) -> None:
        if f.header.step not in self.pending:
            raise StageFailure(f"stage {self.i}: batch blocks for unknown pass {f.header.step}")
        self.pending[f.header.step]["batch"] = blocks

    # ------------------------------------------------------------------ the verdict
    def _select_request(self, request: int) -> None:
        if request in self.gens:
            self.dgen, self.vgen = self.gens[request]

    def _stale(self, h) -> bool:
        if self.job.get("schedule") == "async" and h.pos > 0:
            pend = self.pending.get(h.step)
            if pend is not None and self.expect.get(h.request) != (h.pos, pend["root"]):
                del self.pending[h.step]  # a stale block (a lost bet): dropped, not computed
                self.dropped += 1
                return True
        return False

    def _outputs(self, h, x: torch.Tensor, out: torch.Tensor):
        if "batch" in self.pending.get(h.step, {}):
            t0 = time.perf_counter_ns()
            verdict = self._batch_verdict(h.step, out)
            frame = array_frame(Kind.VERDICT, verdict, step=h.step)
            return [frame], 0, (time.perf_counter_ns() - t0) / 1e6, 0.0
        draft_ms = 0.0
        draft_frames: list[Frame] = []
        t0 = time.perf_counter_ns()
        acc, nxt, hrow, path = self._verdict(h.step, h.pos, out)
        self.expect[h.request] = (h.pos + x.shape[0] if h.pos == 0 else h.pos + acc + 1, nxt)
        verdict = np.array([acc, nxt, *path], dtype=np.int32)
        out_frame = array_frame(Kind.VERDICT, verdict, step=h.step)
        t1 = time.perf_counter_ns()
        verify_ms = (t1 - t0) / 1e6
        if self.mtp is not None and int(self.job.get("k", 0)) > 0:
            draft_frames = self._mtp_draft(h.step, hrow, nxt)
            draft_ms = (time.perf_counter_ns() - t1) / 1e6
        return [*draft_frames, out_frame], 0, verify_ms, draft_ms

    def _mtp_draft(self, step: int, hidden: torch.Tensor, token: int) -> list[Frame]:
        """The head's K drafts after ``token`` (+ their q for lossless), tagged with ``step``."""
        k = int(self.job["k"])
        lossless = self.job.get("verifier") == "lossless"
        temp = float(self.job.get("temperature", 0.0)) if lossless else 0.0
        drafts, q = self.mtp.draft(hidden, token, k, temp, self.dgen)
        frames = [array_frame(Kind.DRAFT_IDS, np.array(drafts, dtype=np.int32), step=step)]
        if lossless:
            frames.append(array_frame(Kind.DRAFT_PROBS, q.float().numpy(), step=step))
        return frames

    def _batch_verdict(self, step: int, logits: torch.Tensor) -> np.ndarray:
        """Verify every block of a batched pass with its request's own streams: ``[m, 3]`` rows
        (request, accepted, next token). A block at position 0 is its request's prefill."""
        pend = self.pending.pop(step)
        verifier = self.job.get("verifier", "greedy")
        temp = float(self.job.get("temperature", 0.0))
        rows, row, dpos = [], 0, 0
        q_all = pend.get("q")
        for request, pos, n, kd in pend["batch"]:
            block = logits[row : row + n]
            drafts = pend["ids"][dpos : dpos + kd]
            if len(drafts) != kd:
                raise StageFailure(f"stage {self.i}: batched pass {step} lacks its draft ids")
            if pos == 0:
                self.gens[request] = prompt_generators(int(self.job.get("seed", 0)), request)
                _, vgen = self.gens[request]
                rows.append((request, 0, sample_first(block[-1], verifier, temp, vgen)))
            else:
                if request not in self.gens:
                    raise StageFailure(f"stage {self.i}: request {request} verified before prefill")
                q = q_all[dpos : dpos + kd] if q_all is not None else None
                v = verify(block[-(kd + 1) :], drafts, q, verifier, temp, self.gens[request][1])
                rows.append((request, v.accepted, v.next_token))
            row += n
            dpos += kd
        return np.array(rows, dtype=np.int32).reshape(len(rows), 3)

    def _verdict(self, step: int, pos: int, logits: torch.Tensor) -> tuple:
        """Verify pass ``step``; a pass at position 0 is a prefill (samples the first token).

        Returns (accepted, next token, final-norm hidden state of the last accepted position,
        accepted tree nodes: empty for a chain)."""
        pend = self.pending.pop(step, None)
        if pend is None:
            raise StageFailure(f"stage {self.i}: pass {step} arrived without its draft ids")
        drafts = pend["ids"]
        k = len(drafts)
        verifier = self.job.get("verifier", "greedy")
        temp = float(self.job.get("temperature", 0.0))
        if "parents" in pend:  # a tree pass: one logits row per node
            from wansim.real.tree_speculative import DraftTree, shape_from_parents, verify_tree

            shape = shape_from_parents(pend["parents"])
            if k != shape.nodes or logits.shape[0] != k + 1:
                raise StageFailure(
                    f"stage {self.i}: tree pass {step} has {k} drafts, {logits.shape[0]} rows "
                    f"and {shape.nodes} nodes"
                )
            tree = DraftTree(shape, (-1, *drafts), pend.get("q"))
            v = verify_tree(logits, tree, verifier, temp, self.vgen)
            return v.accepted, v.next_token, None, list(v.path)
        rows = logits[-(k + 1) :]
        if pos == 0:
            self.dgen, self.vgen = prompt_generators(int(self.job.get("seed", 0)), self.prefills)
            self.gens[self.shard.request] = (self.dgen, self.vgen)
            self.prefills += 1
            v_acc, v_next = 0, sample_first(rows[-1], verifier, temp, self.vgen)
            hrow = self.shard.hidden[-1]
        else:
            q = pend.get("q")
            v = verify(rows, drafts, q, verifier, temp, self.vgen)
            v_acc, v_next = v.accepted, v.next_token
            hrow = self.shard.hidden[-(k + 1) :][v_acc]
        return v_acc, v_next, hrow, []
