"""Stage worker processes: one OS process per pipeline stage, one thread of torch each.

Roles (one class each, over the shared :class:`StageWorker`): stage 0 is
:class:`~wansim.real.first_stage.FirstStageWorker` (the drafter and the decode loop), stages
1..P-2 are :class:`~wansim.real.relay_stage.RelayStageWorker` (compute and forward), stage P-1
is :class:`~wansim.real.last_stage.LastStageWorker` (verify, and with the MTP head draft); the
stages after the first share the frame loop of :class:`ServingStageWorker`.

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

import torch

from wansim.real import codec
from wansim.real.frames import (
    ConnectionClosed,
    Frame,
    FrameError,
    Kind,
    frame_text,
    message_frame,
    read_batch,
    read_tree,
    recv_frame,
    send_frame,
    with_request,
)
from wansim.real.model import StageShard, load_lm
from wansim.real.records import RecordLog, StageRow
from wansim.support.hold import checkpoint


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
    """What every role shares: the stage's layers (``StageShard``), its record log, its two
    sockets (in from hop i-1, out on hop i), fault injection and the forward pass itself.
    A role loads its extras in :meth:`_load_role` (before the warm-up) and runs :meth:`run`."""

    def __init__(self, cfg: StageConfig, conn):
        self.cfg = cfg
        self.ctrl = _Ctrl(conn)
        self.i = cfg.index
        torch.set_num_threads(cfg.threads)
        model = load_lm(cfg.target_dir, device=cfg.device)
        self.shard = StageShard(model, cfg.layer_lo, cfg.layer_hi)
        self._load_role(model)
        self._warm_up()
        raw = Path(cfg.raw_dir)
        raw.mkdir(parents=True, exist_ok=True)
        self.log = RecordLog(raw / f"stage{self.i}.csv", StageRow)
        self._open_role_records(raw)
        self.listener = socket.create_server((cfg.host, 0))
        self.in_sock: socket.socket | None = None
        self.out_sock: socket.socket | None = None
        self.passes = 0
        self.job: dict = {}
        # per request: the position of its last tree pass (for the next pass's keep list)
        self.tree_pos: dict[int, int] = {}

    def _load_role(self, model) -> None:
        """Load what this role needs beside its layers (a drafter, an MTP head)."""

    def _open_role_records(self, raw: Path) -> None:
        """Open this role's record files beside ``stage{i}.csv``."""

    def run(self) -> None:
        raise NotImplementedError

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
        checkpoint(f"stage{self.i}-pass", self.passes)  # tests: hold here (wansim.support.hold)
        n = self.cfg.fail_after_passes
        if n is not None and self.passes > n:
            os._exit(3)  # fault injection: die like a crashed machine (no report)

    def _timed_forward(
        self, x: torch.Tensor, pos: int, step: int, tree, batch=None
    ) -> tuple[torch.Tensor, int, int, int]:
        """:meth:`_forward` timed: (output, start_ns, end_ns, cpu_ns), the wall-clock window
        (``time.monotonic_ns``) around the stage thread's CPU window (``time.thread_time_ns``),
        so the CPU time is at most the wall time; their difference is waiting for a core."""
        start, cpu0 = time.monotonic_ns(), time.thread_time_ns()
        out = self._forward(x, pos, step, tree, batch)
        cpu = time.thread_time_ns() - cpu0
        return out, start, time.monotonic_ns(), cpu

    def _forward(self, x: torch.Tensor, pos: int, step: int, tree, batch=None) -> torch.Tensor:
        """The stage's layers on one pass: a chain (crop the cache to ``pos``), a tree (keep
        the previous tree's accepted path first, then a tree-masked pass) or a batched pass
        (``batch``: the blocks of several requests in one forward, each on its own cache)."""
        try:
            if batch is not None:
                return self.shard.forward_batch(x, [(r, p, n) for r, p, n, _ in batch])
            if tree is None:
                return self.shard.forward(x, pos)
            parents, keep = tree
            request = self.shard.request
            if keep:
                if request not in self.tree_pos:
                    raise ValueError("a keep list without a previous tree pass")
                self.shard.keep_path(self.tree_pos[request], keep)
            self.tree_pos[request] = pos
            if x.shape[0] != len(parents):
                raise ValueError(f"{x.shape[0]} rows for a tree of {len(parents)} nodes")
            return self.shard.forward_tree(x, pos, parents)
        except ValueError as e:
            raise StageFailure(f"stage {self.i}: pass {step}: {e}") from None


class ServingStageWorker(StageWorker):
    """Stages after the first: read frames from hop i-1 and serve them until ``SHUTDOWN``.

    A ``JOB`` frame resets the stage for a new job, ``HIDDEN`` runs a pass (:meth:`run_pass`),
    ``ERROR`` and ``SHUTDOWN`` travel on towards stage 0; the frames that describe a pass
    (draft ids and probabilities, tree shapes, cancels) go to the role's handlers: a relay
    stage passes them on, the last stage keeps them for the verdict."""

    def __init__(self, cfg: StageConfig, conn):
        super().__init__(cfg, conn)
        self.trees: dict[int, tuple[list[int], list[int]]] = {}  # pass -> (parents, keep)
        self.batches: dict[int, list] = {}  # pass -> its blocks (batched passes)
        self.inbox: deque = deque()  # frames read but not yet served (async mailbox)
        self.dropped = 0  # stale passes dropped from the mailbox before computing them

    def run(self) -> None:
        self.serve()
        self.ctrl.send(event="closed", stage=self.i)

    # ------------------------------------------------------------------ the mailbox (async)
    def next_frame(self) -> tuple[Frame, int]:
        """The next frame in arrival order and when it was read. In async jobs everything the
        hop has delivered is read into a mailbox first, so that a ``CANCEL`` drops the stale
        passes of its request still waiting in it (those ahead of it in FIFO order) before they
        are computed; passes already computed are not undone (the request's KV is cropped by
        its next valid pass)."""
        if not self.inbox:
            self.inbox.append((self.recv(), time.monotonic_ns()))
        if self.job.get("schedule") == "async":
            while (
                self.inbox[-1][0].kind not in (Kind.SHUTDOWN, Kind.ERROR)
                and select.select([self.in_sock], [], [], 0)[0]
            ):
                f = self.recv()
                if f.kind == Kind.CANCEL:
                    self._drop_stale(int(f.header.step), f.header.request)
                self.inbox.append((f, time.monotonic_ns()))
        return self.inbox.popleft()

    def _drop_stale(self, last_valid: int, request: int) -> None:
        """A ``CANCEL`` of ``request``: drop its passes after ``last_valid`` from the mailbox
        (the other requests' passes stay, whatever their ids)."""
        kinds = (Kind.DRAFT_IDS, Kind.DRAFT_PROBS, Kind.HIDDEN, Kind.TREE)
        keep = deque()
        for f, t in self.inbox:
            h = f.header
            if f.kind in kinds and h.request == request and h.step > last_valid:
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
                self.trees.clear()
                self.batches.clear()
                self.tree_pos = {}
                self._new_job()
                self.shard.reset_all()
                self._pass_on(f)
            elif kind == Kind.DRAFT_IDS:
                self._draft_ids(f)
            elif kind == Kind.CANCEL:
                self._cancel(f)
            elif kind == Kind.DRAFT_PROBS:
                self._draft_probs(f)
            elif kind == Kind.TREE:
                try:
                    parents, keep = read_tree(f)
                except FrameError as e:
                    raise StageFailure(f"stage {self.i}: {e} on {self.hop_in()}") from None
                self.trees[f.header.step] = (parents, keep)
                self._tree(f, parents)
            elif kind == Kind.BATCH:
                try:
                    blocks = read_batch(f)
                except FrameError as e:
                    raise StageFailure(f"stage {self.i}: {e} on {self.hop_in()}") from None
                self.batches[f.header.step] = blocks
                self._batch(f, blocks)
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

    # the role's handlers (module docstring)
    def _new_job(self) -> None:
        """Reset the role's per-job state (a ``JOB`` frame arrived)."""

    def _pass_on(self, f: Frame) -> None:
        raise NotImplementedError

    def _draft_ids(self, f: Frame) -> None:
        raise NotImplementedError

    def _draft_probs(self, f: Frame) -> None:
        raise NotImplementedError

    def _cancel(self, f: Frame) -> None:
        raise NotImplementedError

    def _tree(self, f: Frame, parents: list[int]) -> None:
        raise NotImplementedError

    def _batch(self, f: Frame, blocks: list) -> None:
        raise NotImplementedError

    def _select_request(self, request: int) -> None:
        """The pass belongs to ``request`` (its KV cache is selected already)."""

    def _stale(self, h) -> bool:
        """Whether the pass is a stale block to drop without computing it."""
        return False

    def _outputs(
        self, h, x: torch.Tensor, out: torch.Tensor
    ) -> tuple[list[Frame], int, float, float]:
        """(frames to send, codec ns, verify ms, draft ms) for a computed pass."""
        raise NotImplementedError

    # ------------------------------------------------------------------ one pass through this stage
    def run_pass(self, hidden_frame: Frame, x: torch.Tensor | None, recv_ns: int) -> None:
        """Decode, compute, then the role's outputs (activations onward, or the verdict)."""
        h = hidden_frame.header
        pass_cpu0 = time.thread_time_ns()
        self._tick_fault()
        batch = self.batches.pop(h.step, None)
        if batch is None:
            self.shard.select(h.request)
            self._select_request(h.request)
        t_codec0 = time.perf_counter_ns()
        if x is None:
            x = torch.from_numpy(codec.decode(hidden_frame).copy())
        if x.ndim != 2 or x.shape[1] != self.shard.hidden_size:
            raise StageFailure(
                f"stage {self.i}: activation shape {list(x.shape)} on {self.hop_in()}, "
                f"expected [n, {self.shard.hidden_size}]"
            )
        codec_ns = time.perf_counter_ns() - t_codec0
        if self._stale(h):
            return
        out, start, end, cpu_ns = self._timed_forward(
            x, h.pos, h.step, self.trees.pop(h.step, None), batch
        )
        frames, encode_ns, verify_ms, draft_ms = self._outputs(h, x, out)
        codec_ns += encode_ns
        nbytes = 0
        for f in frames:  # MTP drafts ride the verdict: ids (+ q), then the verdict
            nbytes += self.send(with_request(f, h.request))
        pass_cpu_ns = time.thread_time_ns() - pass_cpu0
        sent = time.monotonic_ns()
        self.log.write(
            StageRow(
                self.job.get("job", -1),
                h.step,
                x.shape[0],
                -1 if batch is not None else h.pos,
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
                f"{cpu_ns / 1e6:.4f}",
                f"{pass_cpu_ns / 1e6:.4f}",
            )
        )


def stage_main(cfg_json: str, conn) -> None:
    """Process entry for one stage: the role's worker for its index (module docstring)."""
    from wansim.real.first_stage import FirstStageWorker
    from wansim.real.last_stage import LastStageWorker
    from wansim.real.relay_stage import RelayStageWorker

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    cfg = StageConfig(**json.loads(cfg_json))
    ctrl = _Ctrl(conn)
    worker = None
    if cfg.index == 0:
        role = FirstStageWorker
    elif cfg.index == cfg.stages - 1:
        role = LastStageWorker
    else:
        role = RelayStageWorker
    try:
        worker = role(cfg, conn)
        worker.connect()
        worker.run()
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
