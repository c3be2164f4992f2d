"""Stage worker processes: one OS process per pipeline stage, one thread of torch each.

Stage i receives frames from hop i-1 (stage 0: from the return hop) and sends to hop i. A verify
pass travels as ``DRAFT_IDS [, DRAFT_PROBS], HIDDEN``: the small frames are forwarded as they
arrive, ``HIDDEN`` is decoded, run through the stage's layers (after cropping the KV cache to the
pass's position: the rollback) and re-encoded at ``activation_bits``. The last stage verifies
and sends ``VERDICT [accepted, next_token]`` back to stage 0 over the return hop.

With ``drafter_kind == "mtp"`` the last stage holds an MTP head (``wansim.real.mtp``) instead:
right after verifying a pass (or the prefill) it drafts K tokens from the final-norm hidden
state of the last accepted position and the bonus/corrected token, and sends ``DRAFT_IDS [,
DRAFT_PROBS]`` (tagged with the verified pass) just before the ``VERDICT`` on the return hop;
stage 0 forwards them in the next pass and drafts nothing. The last stage's row in
``stage{P-1}.csv`` has its ``draft_ms``; ``steps.csv`` says which stage drafted (``draft_stage``).

Stage 0 also holds the drafter (``draft_model``) and runs the decode loop when the runner asks (control messages
are JSON bytes on a ``multiprocessing`` pipe, never pickled objects). Each stage appends one row
per pass to ``raw/stage{i}.csv`` (flushed), stage 0 one row per verify step to
``raw/steps.csv``, so a failed run keeps what it recorded.

Errors: a malformed or truncated frame, a peer that closed, or an exception ends the stage with
a message naming the stage and hop, sent to the runner and (best effort) down the pipeline as an
``ERROR`` frame; stage 0 gives up on a verdict after ``stall_timeout_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from wansim.real import codec
from wansim.real.frames import (
    ConnectionClosed,
    Frame,
    FrameError,
    Kind,
    array_frame,
    frame_text,
    message_frame,
    read_tree,
    recv_frame,
    send_frame,
    tree_frame,
    with_request,
)
from wansim.real.model import StageShard, load_lm
from wansim.real.records import CancelRow, RecordLog, StageRow, StepRow, step_row
from wansim.real.speculative import (
    Drafter,
    prompt_generators,
    sample_first,
    verify,
)


@dataclass(frozen=True)
class StageConfig:
    """What one stage process needs (sent as JSON)."""

    index: int
    stages: int
    target_dir: str
    layer_lo: int
    layer_hi: int
    drafter_dir: str | None
    drafter_noise: float
    noise_seed: int
    activation_bits: int
    group_size: int
    host: str
    raw_dir: str
    stall_timeout_s: float
    threads: int
    fail_after_passes: int | None = None
    drafter_kind: str = "draft_model"
    mtp_dir: str | None = None
    device: str = "cpu"

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _tree_spec(d: dict | None):
    """The job's TreeSpec (sent as a dict), or None for chains."""
    if not d:
        return None
    from wansim.real.config import TreeSpec

    return TreeSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


class StageFailure(Exception):
    """A failure already phrased with the stage and hop (becomes a PipelineError)."""


class _Ctrl:
    def __init__(self, conn):
        self.conn = conn

    def send(self, **msg) -> None:
        with contextlib.suppress(OSError, ValueError, BrokenPipeError):
            self.conn.send_bytes(json.dumps(msg).encode())

    def recv(self) -> dict:
        return json.loads(self.conn.recv_bytes())


class StageWorker:
    def __init__(self, cfg: StageConfig, conn):
        self.cfg = cfg
        self.ctrl = _Ctrl(conn)
        self.i = cfg.index
        self.last = cfg.index == cfg.stages - 1
        torch.set_num_threads(cfg.threads)
        model = load_lm(cfg.target_dir, device=cfg.device)
        self.shard = StageShard(model, cfg.layer_lo, cfg.layer_hi)
        self.drafter = None
        self.mtp = None  # the MTP head (drafter_kind 'mtp', last stage only)
        self.mtp_mode = cfg.drafter_kind == "mtp"
        if self.last and self.mtp_mode:
            from wansim.real.mtp import load_mtp

            self.mtp = load_mtp(cfg.mtp_dir, model)
            self.mtp.head.to(cfg.device)
        if self.i == 0 and cfg.drafter_dir:
            self.drafter = Drafter(
                load_lm(
                    cfg.drafter_dir,
                    field="drafter_dir",
                    noise=cfg.drafter_noise,
                    noise_seed=cfg.noise_seed,
                    device=cfg.device,
                )
            )
        self._warm_up()
        raw = Path(cfg.raw_dir)
        raw.mkdir(parents=True, exist_ok=True)
        self.log = RecordLog(raw / f"stage{self.i}.csv", StageRow)
        self.steps = RecordLog(raw / "steps.csv", StepRow) if self.i == 0 else None
        self.cancelled = RecordLog(raw / "cancelled.csv", CancelRow) if self.i == 0 else None
        self.listener = socket.create_server((cfg.host, 0))
        self.in_sock: socket.socket | None = None
        self.out_sock: socket.socket | None = None
        self.passes = 0
        self.job: dict = {}
        self.prefills = 0
        self.vgen = None
        self.dgen = None
        self.gens: dict[int, tuple] = {}  # last stage: request -> (dgen, vgen)
        self.pending: dict[int, dict] = {}
        self.returned: dict = {}
        self.trees: dict[int, tuple[list[int], list[int]]] = {}  # pass -> (parents, keep)
        self.tree_pos: int | None = None  # position of the last tree pass (for its keep list)
        self.path: list[int] = []  # stage 0: accepted tree nodes of the last verdict
        self.inbox: deque = deque()  # frames read but not yet served (async mailbox)
        self.dropped = 0  # stale passes dropped from the mailbox before computing them
        self.expect: tuple[int, int] | None = None  # last stage, async: (pos, root) of a valid pass

    @torch.no_grad()
    def _warm_up(self) -> None:
        """A few throw-away passes so first-call allocations do not land in the measurements."""
        for n in (8, 1, 4, 2):
            if self.shard.first:
                x = torch.zeros(n, dtype=torch.long)
            else:
                x = torch.zeros(n, self.shard.hidden_size)
            self.shard.forward(x, 0 if n == 8 else 8)
        self.shard.reset()
        if self.drafter is not None:
            gen = torch.Generator().manual_seed(0)
            self.drafter.draft([0] * 8, 4, 1.0, gen)
            self.drafter.draft([0] * 10, 4, 0.0, gen)
            self.drafter.reset()
        if self.mtp is not None:
            gen = torch.Generator().manual_seed(0)
            h0 = torch.zeros(self.shard.hidden_size, device=self.shard.device)
            self.mtp.draft(h0, 0, 4, 1.0, gen)
            self.mtp.draft(h0, 0, 4, 0.0, gen)

    # ------------------------------------------------------------------ naming
    def hop_in(self) -> str:
        p = self.cfg.stages
        src = (self.i - 1) % p
        return f"hop {src} (stage {src} -> stage {self.i})"

    def hop_out(self) -> str:
        dst = (self.i + 1) % self.cfg.stages
        return f"hop {self.i} (stage {self.i} -> stage {dst})"

    # ------------------------------------------------------------------ setup
    def connect(self) -> None:
        self.ctrl.send(event="listening", stage=self.i, port=self.listener.getsockname()[1])
        msg = self.ctrl.recv()
        if msg.get("cmd") != "connect":
            raise StageFailure(f"stage {self.i}: expected a connect command, got {msg}")
        self.out_sock = socket.create_connection((self.cfg.host, int(msg["port"])), timeout=30)
        self.out_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.out_sock.settimeout(None)
        self.listener.settimeout(60)
        try:
            self.in_sock, _ = self.listener.accept()
        except TimeoutError:
            raise StageFailure(f"stage {self.i}: nothing connected on {self.hop_in()}") from None
        self.listener.close()
        self.in_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.in_sock.settimeout(None)
        self.ctrl.send(event="ready", stage=self.i, pid=os.getpid())

    # ------------------------------------------------------------------ wire helpers
    def recv(self, timeout: float | None = None) -> Frame:
        self.in_sock.settimeout(timeout)
        try:
            return recv_frame(self.in_sock)
        except ConnectionClosed:
            raise StageFailure(f"stage {self.i}: {self.hop_in()} closed unexpectedly") from None
        except TimeoutError:
            raise
        except FrameError as e:
            raise StageFailure(f"stage {self.i}: malformed frame on {self.hop_in()}: {e}") from None
        except OSError as e:
            raise StageFailure(f"stage {self.i}: {self.hop_in()} failed: {e}") from None

    def send(self, frame: Frame) -> int:
        try:
            return send_frame(self.out_sock, frame)
        except OSError as e:
            raise StageFailure(f"stage {self.i}: sending on {self.hop_out()} failed: {e}") from None

    def _tick_fault(self) -> None:
        self.passes += 1
        n = self.cfg.fail_after_passes
        if n is not None and self.passes > n:
            os._exit(3)  # fault injection: die like a crashed machine (no report)

    # ------------------------------------------------------------------ one pass through this stage
    def run_pass(self, hidden_frame: Frame, x: torch.Tensor | None, recv_ns: int) -> None:
        """Stages >= 1: decode, compute, encode, send (or verify, on the last stage)."""
        h = hidden_frame.header
        self._tick_fault()
        self.shard.select(h.request)
        if h.request in self.gens:
            self.dgen, self.vgen = self.gens[h.request]
        t_codec0 = time.perf_counter_ns()
        if x is None:
            x = torch.from_numpy(codec.decode(hidden_frame).copy())
        if x.ndim != 2 or x.shape[1] != self.shard.hidden_size:
            raise StageFailure(
                f"stage {self.i}: activation shape {list(x.shape)} on {self.hop_in()}, "
                f"expected [n, {self.shard.hidden_size}]"
            )
        codec_ns = time.perf_counter_ns() - t_codec0
        if self.last and self.job.get("schedule") == "async" and h.pos > 0:
            pend = self.pending.get(h.step)
            if pend is not None and self.expect != (h.pos, pend["root"]):
                del self.pending[h.step]  # a stale block (a lost bet): dropped, not computed
                self.dropped += 1
                return
        start = time.monotonic_ns()
        out = self._forward(x, h.pos, h.step, self.trees.pop(h.step, None))
        end = time.monotonic_ns()
        verify_ms = draft_ms = 0.0
        draft_frames: list[Frame] = []
        if self.last:
            t0 = time.perf_counter_ns()
            acc, nxt, hrow, path = self._verdict(h.step, h.pos, out)
            self.expect = (h.pos + x.shape[0] if h.pos == 0 else h.pos + acc + 1, nxt)
            verdict = np.array([acc, nxt, *path], dtype=np.int32)
            out_frame = array_frame(Kind.VERDICT, verdict, step=h.step)
            t1 = time.perf_counter_ns()
            verify_ms = (t1 - t0) / 1e6
            if self.mtp is not None and int(self.job.get("k", 0)) > 0:
                draft_frames = self._mtp_draft(h.step, hrow, nxt)
                draft_ms = (time.perf_counter_ns() - t1) / 1e6
        else:
            t0 = time.perf_counter_ns()
            out_frame = codec.encode(
                Kind.HIDDEN,
                out.cpu().numpy(),
                self.cfg.activation_bits,
                self.cfg.group_size,
                step=h.step,
                pos=h.pos,
            )
            codec_ns += time.perf_counter_ns() - t0
        nbytes = 0
        for f in draft_frames:  # MTP drafts ride the verdict: ids (+ q), then the verdict
            nbytes += self.send(with_request(f, h.request))
        nbytes += self.send(with_request(out_frame, h.request))
        sent = time.monotonic_ns()
        self.log.write(
            StageRow(
                self.job.get("job", -1),
                h.step,
                x.shape[0],
                h.pos,
                recv_ns,
                h.send_ns,
                start,
                end,
                sent,
                f"{(end - start) / 1e6:.4f}",
                f"{codec_ns / 1e6:.4f}",
                f"{verify_ms:.4f}",
                nbytes,
                f"{draft_ms:.4f}",
            )
        )

    def _forward(self, x: torch.Tensor, pos: int, step: int, tree) -> torch.Tensor:
        """The stage's layers on one pass: a chain (crop the cache to ``pos``) or a tree (keep
        the previous tree's accepted path first, then a tree-masked pass)."""
        try:
            if tree is None:
                return self.shard.forward(x, pos)
            parents, keep = tree
            if keep:
                if self.tree_pos is None:
                    raise ValueError("a keep list without a previous tree pass")
                self.shard.keep_path(self.tree_pos, keep)
            self.tree_pos = pos
            if x.shape[0] != len(parents):
                raise ValueError(f"{x.shape[0]} rows for a tree of {len(parents)} nodes")
            return self.shard.forward_tree(x, pos, parents)
        except ValueError as e:
            raise StageFailure(f"stage {self.i}: pass {step}: {e}") from None

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

    # ------------------------------------------------------------------ stages >= 1
    # ------------------------------------------------------------------ the mailbox (async)
    def next_frame(self) -> tuple[Frame, int]:
        """The next frame in arrival order and when it was read. In async jobs everything the
        hop has delivered is read into a mailbox first, so that a ``CANCEL`` drops the stale
        passes still waiting in it (those ahead of it in FIFO order) before they are computed;
        passes already computed are not undone (their KV is cropped by the next valid pass)."""
        if not self.inbox:
            self.inbox.append((self.recv(), time.monotonic_ns()))
        if self.job.get("schedule") == "async":
            while (
                self.inbox[-1][0].kind not in (Kind.SHUTDOWN, Kind.ERROR)
                and select.select([self.in_sock], [], [], 0)[0]
            ):
                f = self.recv()
                if f.kind == Kind.CANCEL:
                    self._drop_stale(int(f.header.step))
                self.inbox.append((f, time.monotonic_ns()))
        return self.inbox.popleft()

    def _drop_stale(self, last_valid: int) -> None:
        kinds = (Kind.DRAFT_IDS, Kind.DRAFT_PROBS, Kind.HIDDEN, Kind.TREE)
        keep = deque()
        for f, t in self.inbox:
            if f.kind in kinds and f.header.step > last_valid:
                self.dropped += f.kind == Kind.HIDDEN
                continue
            keep.append((f, t))
        self.inbox = keep

    def serve(self) -> None:
        while True:
            f, recv_ns = self.next_frame()
            kind = f.kind
            if kind == Kind.JOB:
                self.job = json.loads(frame_text(f))
                self.prefills = 0
                self.expect = None
                self.pending.clear()
                self.gens.clear()
                self.trees.clear()
                self.tree_pos = None
                self.shard.reset_all()
                if not self.last:
                    self.send(f)
            elif kind == Kind.DRAFT_IDS:
                if self.last:
                    ids = f.array().astype(int).tolist()
                    if self.job.get("schedule") == "async" and ids:  # [root, drafts...]
                        self.pending[f.header.step] = {"root": ids[0], "ids": ids[1:]}
                    else:
                        self.pending[f.header.step] = {"ids": ids}
                else:
                    self.send(f)
            elif kind == Kind.CANCEL:
                if self.last:  # stale passes whose activations never came (dropped upstream)
                    for step in [s for s in self.pending if s > f.header.step]:
                        del self.pending[step]
                else:
                    self.send(f)
            elif kind == Kind.DRAFT_PROBS:
                if self.last:
                    if f.header.step not in self.pending:
                        raise StageFailure(
                            f"stage {self.i}: draft probabilities for unknown pass {f.header.step}"
                        )
                    self.pending[f.header.step]["q"] = torch.from_numpy(f.array().copy())
                else:
                    self.send(f)
            elif kind == Kind.TREE:
                try:
                    parents, keep = read_tree(f)
                except FrameError as e:
                    raise StageFailure(f"stage {self.i}: {e} on {self.hop_in()}") from None
                self.trees[f.header.step] = (parents, keep)
                if self.last:
                    if f.header.step not in self.pending:
                        raise StageFailure(
                            f"stage {self.i}: tree shape for unknown pass {f.header.step}"
                        )
                    self.pending[f.header.step]["parents"] = parents
                else:
                    self.send(f)
            elif kind == Kind.HIDDEN:
                self.run_pass(f, None, recv_ns)
            elif kind == Kind.SHUTDOWN:
                self.send(f)
                return
            elif kind == Kind.ERROR:
                self.send(f)  # pass it on towards stage 0
            else:
                raise StageFailure(
                    f"stage {self.i}: unexpected {kind.name} frame on {self.hop_in()}"
                )

    # ------------------------------------------------------------------ stage 0
    def wait_verdict(self, step: int) -> tuple[int, int, int, int]:
        """(accepted, next_token, received_ns, sender's send_ns) for pass ``step``; drafts that
        rode the verdict (MTP head at the last stage) land in ``self.returned``, a tree pass's
        accepted nodes in ``self.path``."""
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
        arr = f.array()
        if arr.ndim != 1 or arr.shape[0] < 2 or arr.shape[0] not in (2, 2 + int(arr[0])):
            raise StageFailure(f"stage 0: verdict of shape {list(arr.shape)} on {self.hop_in()}")
        self.path = [int(x) for x in arr[2:]]
        return int(arr[0]), int(arr[1]), now, f.header.send_ns

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
        start = time.monotonic_ns()
        out = self._forward(torch.tensor(ids), pos, step, tree)
        end = time.monotonic_ns()
        t0 = time.perf_counter_ns()
        hidden = codec.encode(
            Kind.HIDDEN,
            out.cpu().numpy(),
            self.cfg.activation_bits,
            self.cfg.group_size,
            step=step,
            pos=pos,
        )
        codec_ns = time.perf_counter_ns() - t0
        frames = [array_frame(Kind.DRAFT_IDS, np.array(drafts, dtype=np.int32), step=step)]
        if q is not None:
            frames.append(array_frame(Kind.DRAFT_PROBS, q.float().numpy(), step=step))
        if tree is not None:
            frames.append(tree_frame(tree[0], tree[1], step=step, pos=pos))
        frames.append(hidden)
        nbytes = sum(self.send(with_request(f, request)) for f in frames)
        sent = time.monotonic_ns()
        self.log.write(
            StageRow(
                self.job.get("job", -1),
                step,
                len(ids),
                pos,
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
            )
        )
        return step, (end - start) / 1e6, sent

    def start_job(self, job: dict) -> None:
        self.job = job
        self.prefills = 0
        self.tree_pos = None
        self.shard.reset_all()
        if self.drafter is not None:
            self.drafter.select(0)
        self.send(message_frame(Kind.JOB, json.dumps(job)))

    def generate(self, job: dict) -> dict:
        if int(job.get("concurrency", 1)) > 1:
            from wansim.real.concurrent_schedule import generate_concurrent

            return generate_concurrent(self, job)
        if job.get("schedule") == "async":
            from wansim.real.async_schedule import generate_async

            return generate_async(self, job)
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
            committed = [*tokens, first]
            n_new = 1
            step = 0
            keep: list[int] = []  # the previous tree pass's root and accepted path
            while n_new < max_new:
                t_start = time.monotonic_ns()
                tree = None
                if tree_spec is not None:
                    from wansim.real.tree_speculative import draft_tree

                    tree = draft_tree(self.drafter, committed, tree_spec, fixed, temp, dgen)
                    drafts, q = list(tree.tokens[1:]), tree.q
                elif self.mtp_mode:  # drafted by the last stage, came back with the verdict
                    drafts, q = ret
                else:
                    drafts, q = self.drafter.draft(committed, k, temp, dgen) if k else ([], None)
                t_draft = time.monotonic_ns()
                pos = len(committed) - 1
                if tree is None:
                    ids, shape = [committed[-1], *drafts], None
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
                ranks = children = ""
                if tree is None:
                    if not 0 <= acc <= k or self.path:
                        raise StageFailure(f"stage 0: verdict says {acc} accepted of {k} drafts")
                    committed.extend(drafts[:acc])
                    nodes = len(drafts)
                else:
                    from wansim.real.tree_speculative import walk_record

                    path = tuple(self.path)
                    if any(not 1 <= n <= tree.nodes for n in path):
                        raise StageFailure(f"stage 0: verdict path {list(path)} outside the tree")
                    rec = walk_record(tree.shape, path)
                    committed.extend(tree.tokens[n] for n in path)
                    keep = [0, *path]
                    nodes = tree.nodes
                    ranks = ";".join(map(str, rec.ranks))
                    children = ";".join(map(str, rec.children))
                committed.append(nxt)
                n_new += acc + 1
                self.steps.write(
                    step_row(
                        job=job["job"],
                        workload=prompt["workload"],
                        prompt_id=prompt["prompt_id"],
                        prompt_index=j,
                        step=step,
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
                step += 1
            outputs[str(prompt["prompt_id"])] = committed[len(tokens) :][:max_new]
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


def stage_main(cfg_json: str, conn) -> None:
    """Process entry for one stage (see module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    cfg = StageConfig(**json.loads(cfg_json))
    ctrl = _Ctrl(conn)
    worker = None
    try:
        worker = StageWorker(cfg, conn)
        worker.connect()
        if cfg.index == 0:
            worker.control_loop()
        else:
            worker.serve()
            ctrl.send(event="closed", stage=cfg.index)
    except StageFailure as e:
        _fail(ctrl, worker, cfg, str(e))
    except Exception as e:
        tb = traceback.format_exc(limit=4)
        _fail(ctrl, worker, cfg, f"stage {cfg.index}: {type(e).__name__}: {e}", tb)


def _fail(ctrl: _Ctrl, worker, cfg: StageConfig, message: str, tb: str = "") -> None:
    ctrl.send(event="error", stage=cfg.index, message=message, traceback=tb)
    if worker is not None and worker.out_sock is not None and cfg.index != 0:
        with contextlib.suppress(Exception):
            send_frame(worker.out_sock, message_frame(Kind.ERROR, message))
    sys.stderr.flush()
    os._exit(1)
