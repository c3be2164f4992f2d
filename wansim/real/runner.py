"""Orchestrates a real run: stage processes, link relays, jobs, failures, recording.

Topology for P stages: stage i (its own process, layers [lo_i, hi_i)) sends to the relay of hop
i, which delivers to stage (i + 1) mod P; hop P-1 is the return hop carrying verdicts back to
stage 0. Everything binds to ``spec.host`` (127.0.0.1 unless told otherwise).

Processes come from a ``forkserver`` that has imported torch and transformers once
(``wansim.real.worker``), so starting a stage costs a fork and a checkpoint load, not a 6 s
import. Control messages are JSON bytes over ``multiprocessing`` pipes; data is frames on TCP.

    with Pipeline(PipelineSpec(target_dir="models/tiny-target", drafter_dir="models/tiny-drafter",
                               stages=2, links=(LinkSpec(latency_ms=10),))) as pipe:
        result = pipe.generate(prompts, DecodeSpec(k=4))
    result.summary["tokens_per_s"], result.trace, result.compute_table, result.links

A dead stage, an error frame, a malformed frame or a stalled link raises :class:`PipelineError`
naming the stage and hop; the job's files are written first with whatever was recorded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import multiprocessing.connection as mpc
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from wansim.real.config import DecodeSpec, PipelineSpec, Prompt, split_layers
from wansim.real.errors import PipelineError, RealConfigError
from wansim.real.recording import RunResult, locate_stall, write_job
from wansim.real.relay import process_priority, start_relay

_CTX = None


def _context():
    """The forkserver context, preloading torch/transformers once per parent process."""
    global _CTX
    if _CTX is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(
            [
                "wansim.real.worker",
                "wansim.real.first_stage",
                "wansim.real.relay_stage",
                "wansim.real.last_stage",
                "wansim.real.link",
                "wansim.real.relay",
                "wansim.real.runner",
            ]
        )
        _CTX = ctx
    return _CTX


def _model_layers(path: str) -> int:
    cfg = json.loads((Path(path) / "config.json").read_text())
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if key in cfg:
            return int(cfg[key])
    raise RealConfigError("target_dir", "config.json has no num_hidden_layers", path)


class Pipeline:
    """A running staged pipeline; reusable for several jobs until :meth:`close`."""

    def __init__(self, spec: PipelineSpec, run_dir: str | Path | None = None):
        self.spec = spec
        if run_dir is None:
            run_dir = tempfile.mkdtemp(prefix="wansim-real-")
        self.run_dir = Path(run_dir)
        self.raw_dir = self.run_dir / "raw"
        n_layers = _model_layers(spec.target_dir)
        splits = spec.layer_splits or tuple(split_layers(n_layers, spec.stages))
        if splits[-1][1] != n_layers:
            raise RealConfigError(
                "layer_splits",
                f"must end at the target's {n_layers} layers",
                [list(s) for s in splits],
            )
        self.splits = splits
        self.links = spec.hop_links()
        self.stage_procs: list = []
        self.stage_conns: list = []
        self.relay_procs: list = []
        self.relay_conns: list = []
        self.pids: dict[str, int] = {}
        self._job_ids = itertools.count()
        self._started = False
        self._broken: str | None = None
        self._errors: list[tuple[float, str, int, str]] = []  # (time, who, index, message)

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> Pipeline:
        if self._started:
            return self
        from wansim.real.model import check_device  # torch is imported here, not at load
        from wansim.real.worker import StageConfig

        check_device(self.spec.device)  # a missing GPU ends here, before any process starts

        self.raw_dir.mkdir(parents=True, exist_ok=True)
        for f in self.raw_dir.glob("*.csv"):
            f.unlink()
        ctx = _context()
        spec = self.spec
        try:
            for i, (lo, hi) in enumerate(self.splits):
                cfg = StageConfig(
                    index=i,
                    stages=spec.stages,
                    target_dir=str(spec.target_dir),
                    layer_lo=lo,
                    layer_hi=hi,
                    drafter_dir=spec.drafter_dir,
                    drafter_noise=spec.drafter_noise,
                    noise_seed=spec.noise_seed,
                    activation_bits=spec.activation_bits,
                    group_size=spec.group_size,
                    host=spec.host,
                    raw_dir=str(self.raw_dir),
                    stall_timeout_s=spec.stall_timeout_s,
                    threads=spec.threads_per_stage,
                    drafter_kind=spec.drafter_kind,
                    mtp_dir=str(spec.mtp_dir) if spec.mtp_dir else None,
                    device=spec.device,
                    fail_after_passes=(
                        spec.fail_stage_after_passes[1]
                        if spec.fail_stage_after_passes and spec.fail_stage_after_passes[0] == i
                        else None
                    ),
                )
                parent, child = ctx.Pipe(duplex=True)
                from wansim.real.worker import stage_main

                proc = ctx.Process(
                    target=stage_main,
                    args=(cfg.to_json(), child),
                    name=f"wansim-stage-{i}",
                    daemon=True,
                )
                proc.start()
                child.close()
                self.stage_procs.append(proc)
                self.stage_conns.append(parent)
            ports = [self._expect(i, "listening")["port"] for i in range(spec.stages)]
            for h in range(spec.stages):
                dst = (h + 1) % spec.stages
                proc, conn, port = start_relay(
                    ctx, self.links[h], h, spec.host, ports[dst], str(self.raw_dir / f"link{h}.csv")
                )
                self.relay_procs.append(proc)
                self.relay_conns.append(conn)
                self.pids[f"link{h}"] = proc.pid
                self.stage_conns[h].send_bytes(
                    json.dumps({"cmd": "connect", "port": port}).encode()
                )
            for i in range(spec.stages):
                msg = self._expect(i, "ready")
                self.pids[f"stage{i}"] = int(msg["pid"])
        except BaseException:
            self.close()
            raise
        self._started = True
        return self

    def _expect(self, i: int, event: str) -> dict:
        conn, proc = self.stage_conns[i], self.stage_procs[i]
        deadline = time.monotonic() + self.spec.start_timeout_s
        while time.monotonic() < deadline:
            ready = mpc.wait([conn, proc.sentinel], timeout=1.0)
            if conn in ready:
                msg = json.loads(conn.recv_bytes())
                if msg.get("event") == "error":
                    raise PipelineError(msg["message"], stage=i, run_dir=str(self.run_dir))
                if msg.get("event") == event:
                    return msg
            elif proc.sentinel in ready:
                raise PipelineError(
                    f"stage {i} exited during start-up (exit code {proc.exitcode})", stage=i
                )
        raise PipelineError(f"stage {i} did not report {event!r} in time", stage=i)

    def close(self) -> None:
        """Shut the pipeline down (politely, then by force)."""
        if self.stage_conns and self._started and self._broken is None:
            with contextlib.suppress(Exception):
                self.stage_conns[0].send_bytes(json.dumps({"cmd": "shutdown"}).encode())
                if self.stage_conns[0].poll(15):
                    self.stage_conns[0].recv_bytes()
        for proc in self.stage_procs + self.relay_procs:
            proc.join(timeout=5 if self._broken is None else 0.2)
        for proc in self.stage_procs + self.relay_procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self.stage_conns + self.relay_conns:
            with contextlib.suppress(Exception):
                conn.close()
        self.stage_procs, self.relay_procs, self.stage_conns, self.relay_conns = [], [], [], []
        self._started = False

    def abort(self, why: str = "aborted") -> None:
        """Stop at once (Ctrl-C): kill the processes without waiting for the job to end."""
        self._broken = why
        for proc in self.stage_procs + self.relay_procs:
            with contextlib.suppress(Exception):
                proc.kill()
        self.close()

    def relay_priorities(self) -> list[str]:
        """Each hop's relay scheduling as it runs (``wansim.real.relay.process_priority``)."""
        return [process_priority(self.pids[f"link{h}"]) for h in range(self.spec.stages)]

    @property
    def stage_pids(self) -> list[int]:
        return [self.pids[f"stage{i}"] for i in range(self.spec.stages)]

    # ------------------------------------------------------------------ jobs
    def generate(
        self, prompts: Sequence[Prompt], decode: DecodeSpec, name: str | None = None
    ) -> RunResult:
        """Decode every prompt (one at a time, sync schedule) and record the job."""
        self.check_job(prompts, decode)
        job = next(self._job_ids)
        name = name or f"job{job}"
        payload = {
            "job": job,
            "k": decode.k,
            "verifier": decode.verifier,
            "temperature": decode.temperature,
            "max_new_tokens": decode.max_new_tokens,
            "seed": decode.seed,
            "tree": decode.tree.as_dict() if decode.tree is not None else None,
            "schedule": decode.schedule,
            "max_inflight_blocks": decode.max_inflight_blocks,
            "concurrency": decode.concurrency,
            "batching": decode.batching,
            "micro_batches": decode.micro_batches,
            "max_batch_size": decode.max_batch_size,
            "prompts": [
                {"workload": p.workload, "prompt_id": p.prompt_id, "tokens": list(p.tokens)}
                for p in prompts
            ],
        }
        meta = self._meta(name, decode)
        return self._run_job("generate", payload, name, meta)

    def check_job(self, prompts: Sequence[Prompt], decode: DecodeSpec) -> None:
        """Everything about a job that can be checked before any process starts."""
        if not prompts:
            raise RealConfigError("prompts", "must be non-empty", [])
        if decode.schedule == "async" and self.spec.drafter_dir is None:
            raise RealConfigError(
                "schedule", "async needs the draft model at stage 0 (drafter_dir)", "async"
            )
        if decode.k > 0 and not self.spec.can_draft:
            raise RealConfigError("drafter_dir", "is needed when k > 0", None)
        if decode.batching == "continuous" and self.spec.drafter_kind == "mtp":
            raise RealConfigError(
                "batching", "continuous needs the draft model at stage 0 (not an MTP head)", "mtp"
            )
        if decode.concurrency > 1 and self.spec.drafter_kind == "mtp":
            raise RealConfigError(
                "concurrency",
                "> 1 needs the draft model at stage 0 (not an MTP head)",
                decode.concurrency,
            )
        if len(prompts) > 0xFFFF:
            raise RealConfigError("prompts", "at most 65535 per job", len(prompts))
        tree = decode.tree
        if tree is not None and self.spec.drafter_dir is None:
            raise RealConfigError("tree", "needs a draft model at stage 0 (drafter_dir)", tree.kind)
        longest = max(len(p.tokens) for p in prompts)
        check_kv_capacity(self.spec, decode, longest, len(prompts))
        # a pass may run up to k (tree: depth) positions past the last committed token
        need = longest + decode.max_new_tokens + decode.k + 1
        for field_name, path in (
            ("target_dir", self.spec.target_dir),
            ("drafter_dir", self.spec.drafter_dir),
        ):
            if path is None:
                continue
            cfg = json.loads((Path(path) / "config.json").read_text())
            limit = int(cfg.get("max_position_embeddings", need))
            if need > limit:
                what = "tree.depth" if tree and need - decode.k <= limit else "max_new_tokens"
                raise RealConfigError(
                    what,
                    f"prompt ({longest}) + max_new_tokens ({decode.max_new_tokens}) + drafts per "
                    f"pass ({decode.k}) + 1 = {need} positions exceed {field_name}'s "
                    f"max_position_embeddings {limit}",
                    decode.k if what == "tree.depth" else decode.max_new_tokens,
                )
            vocab = int(cfg.get("vocab_size", 0))
            if tree is not None and vocab and tree.max_children > vocab:
                raise RealConfigError(
                    "tree",
                    f"asks for {tree.max_children} distinct candidates per node; {field_name} "
                    f"has {vocab} tokens",
                    tree.max_children,
                )

    def profile_compute(
        self,
        n_values: Sequence[int] = (1, 2, 4, 8, 16),
        context_tokens: int = 128,
        repeats: int = 10,
        name: str = "compute_profile",
        seed: int = 0,
    ) -> RunResult:
        """Measure each stage's compute for passes of n tokens at ``context_tokens`` cached."""
        if not n_values or any(int(n) < 1 for n in n_values):
            raise RealConfigError("n_values", "must be non-empty integers >= 1", list(n_values))
        job = next(self._job_ids)
        payload = {
            "job": job,
            "k": 0,
            "verifier": "greedy",
            "temperature": 0.0,
            "seed": seed,
            "n_values": [int(n) for n in n_values],
            "context_tokens": int(context_tokens),
            "repeats": int(repeats),
        }
        meta = self._meta(name, DecodeSpec(k=0))
        meta["kind"] = "compute_profile"
        return self._run_job("profile", payload, name, meta)

    def _meta(self, name: str, decode: DecodeSpec) -> dict:
        spec = self.spec
        return {
            "source": "wansim.real",
            "run": str(self.run_dir / name),
            "target": Path(spec.target_dir).name,
            "drafter": (
                Path(spec.mtp_dir).name
                if spec.drafter_kind == "mtp"
                else Path(spec.drafter_dir).name
                if spec.drafter_dir
                else "none"
            ),
            "drafter_kind": spec.drafter_kind,
            "drafter_placement": spec.draft_placement,
            "drafter_noise": spec.drafter_noise,
            "device": spec.device,
            "stages": spec.stages,
            "layer_splits": json.dumps([list(s) for s in self.splits]),
            "activation_bits": spec.activation_bits,
            "k": decode.k,
            "verifier": decode.verifier,
            "temperature": decode.temperature,
            "max_new_tokens": decode.max_new_tokens,
            "seed": decode.seed,
            "tree": json.dumps(decode.tree.as_dict()) if decode.tree is not None else "none",
            "schedule": decode.schedule,
            "max_inflight_blocks": decode.max_inflight_blocks,
            "concurrency": decode.concurrency,
            "batching": decode.batching,
            "micro_batches": decode.micro_batches,
            "max_batch_size": decode.max_batch_size if decode.max_batch_size else "none",
            "links": json.dumps([asdict(link) for link in self.links]),
        }

    def _run_job(self, cmd: str, payload: dict, name: str, meta: dict) -> RunResult:
        if self._broken:
            raise PipelineError(f"pipeline is broken: {self._broken}", run_dir=str(self.run_dir))
        if not self._started:
            self.start()
        self.stage_conns[0].send_bytes(json.dumps({"cmd": cmd, "job": payload}).encode())
        outputs: dict = {}
        try:
            outputs = self._wait_done(payload["job"])
        except PipelineError as err:
            self._broken = str(err)
            with contextlib.suppress(Exception):
                write_job(
                    self.run_dir / name,
                    name,
                    payload["job"],
                    self.raw_dir,
                    self.spec.stages,
                    meta,
                    {},
                    [asdict(x) for x in self.links],
                )
            self.close()
            raise
        return write_job(
            self.run_dir / name,
            name,
            payload["job"],
            self.raw_dir,
            self.spec.stages,
            meta,
            outputs,
            [asdict(x) for x in self.links],
        )

    def _wait_done(self, job: int) -> dict:
        """Wait for stage 0's result; turn deaths and error reports into a PipelineError."""
        conns = {c: ("stage", i) for i, c in enumerate(self.stage_conns)}
        conns.update({c: ("link", h) for h, c in enumerate(self.relay_conns)})
        sentinels = {p.sentinel: ("stage", i) for i, p in enumerate(self.stage_procs)}
        sentinels.update({p.sentinel: ("link", h) for h, p in enumerate(self.relay_procs)})
        dead: dict[tuple, int] = {}
        while True:
            ready = mpc.wait(list(conns) + list(sentinels), timeout=1.0)
            for obj in ready:
                if obj in conns:
                    try:
                        msg = json.loads(obj.recv_bytes())
                    except (EOFError, OSError):
                        conns.pop(obj)
                        continue
                    who, idx = conns[obj]
                    if msg.get("event") == "done" and who == "stage" and idx == 0:
                        if msg.get("job") == job:
                            return msg["outputs"]
                    elif msg.get("event") == "error":
                        self._errors.append((time.monotonic(), who, idx, msg["message"]))
                else:
                    who, idx = sentinels.pop(obj)
                    procs = self.stage_procs if who == "stage" else self.relay_procs
                    dead[(who, idx)] = procs[idx].exitcode
            if dead or self._errors:
                time.sleep(0.3)  # let the other processes report what they saw
                for who, idx in sentinels.values():
                    procs = self.stage_procs if who == "stage" else self.relay_procs
                    if procs[idx].exitcode is not None:
                        dead[(who, idx)] = procs[idx].exitcode
                for c in list(conns):
                    while c.poll():
                        try:
                            msg = json.loads(c.recv_bytes())
                        except (EOFError, OSError):
                            break
                        if msg.get("event") == "error":
                            who, idx = conns[c]
                            self._errors.append((time.monotonic(), who, idx, msg["message"]))
                raise self._diagnose(dead)

    SECONDARY = ("closed unexpectedly", "connection failed", "failed: [Errno", "Broken pipe")

    def _diagnose(self, dead: dict) -> PipelineError:
        """The root cause among what the processes reported (the rest are its consequences)."""
        p = self.spec.stages
        run_dir = str(self.run_dir)
        # 1. a process that died without a word (its neighbours only saw EOF)
        for (who, idx), code in sorted(dead.items()):
            reported = any(w == who and i == idx for _, w, i, _ in self._errors)
            if not reported and code not in (0, 1):
                if who == "stage":
                    return PipelineError(
                        f"stage {idx} died (exit code {code}); hop {(idx - 1) % p} "
                        f"(stage {(idx - 1) % p} -> stage {idx}) and hop {idx} "
                        f"(stage {idx} -> stage {(idx + 1) % p}) lost their peer",
                        stage=idx,
                        run_dir=run_dir,
                    )
                return PipelineError(
                    f"link relay of hop {idx} (stage {idx} -> stage {(idx + 1) % p}) died "
                    f"(exit code {code})",
                    hop=idx,
                    run_dir=run_dir,
                )
        # 2. the earliest report that is not just a lost connection
        reports = sorted(self._errors)
        primary = [r for r in reports if not any(s in r[3] for s in self.SECONDARY)]
        for _, who, idx, msg in primary or reports:
            if who == "link":
                return PipelineError(
                    f"hop {idx} (stage {idx} -> stage {(idx + 1) % p}): {msg}",
                    hop=idx,
                    run_dir=run_dir,
                )
            if idx == 0 and "no verdict for pass" in msg:
                pass_id = int(msg.split("pass ")[1].split()[0])
                stage, hop, words = locate_stall(self.raw_dir, p, pass_id)
                return PipelineError(f"{msg}: {words}", stage=stage, hop=hop, run_dir=run_dir)
            stage, hop = idx, (idx - 1) % p if "hop" in msg else None
            if msg.startswith("stage ") and msg[6:7].isdigit():  # forwarded ERROR text
                stage = int(msg[6 : msg.index(":")]) if ":" in msg else idx
                hop = (stage - 1) % p if "hop" in msg else None
            return PipelineError(msg, stage=stage, hop=hop, run_dir=run_dir)
        return PipelineError("pipeline failed for an unknown reason", run_dir=run_dir)


def check_kv_capacity(spec: PipelineSpec, decode: DecodeSpec, longest: int, prompts: int) -> None:
    """The requests in flight must fit ``spec.kv_capacity_tokens`` at every stage: each holds
    up to prompt + ``max_new_tokens`` + the pass's drafted tokens (a tree: all its nodes, kept
    until the verdict prunes them) + 1 positions. The field named is what to lower: the tree's
    budget when one request does not fit only because of it, else the requests in flight
    (``concurrency``) when one request fits, else ``max_new_tokens``."""
    cap = spec.kv_capacity_tokens
    drafted = decode.tree.budget if decode.tree is not None else decode.k
    base = longest + decode.max_new_tokens + 1
    per_request = base + drafted
    in_flight = min(decode.concurrency, prompts)
    if decode.batching == "continuous" and decode.max_batch_size is not None:
        in_flight = min(in_flight, decode.micro_batches * decode.max_batch_size)
    need = in_flight * per_request
    if need <= cap:
        return
    words = (
        f"{in_flight} request(s) in flight x (prompt {longest} + max_new_tokens "
        f"{decode.max_new_tokens} + {drafted} drafted + 1) = {need} KV positions exceed "
        f"kv_capacity_tokens {cap}"
    )
    if per_request > cap and decode.tree is not None and base + decode.k <= cap:
        raise RealConfigError("tree.budget", words, decode.tree.budget)
    if per_request <= cap:
        raise RealConfigError(
            "concurrency", f"{words}; at most {cap // per_request} fit", decode.concurrency
        )
    raise RealConfigError("max_new_tokens", words, decode.max_new_tokens)


def run_real(
    spec: PipelineSpec,
    prompts: Sequence[Prompt],
    decode: DecodeSpec,
    run_dir: str | Path | None = None,
    name: str = "run",
) -> RunResult:
    """Start a pipeline, run one job, shut it down."""
    pipe = Pipeline(spec, run_dir)
    pipe.check_job(prompts, decode)  # bad input ends here, before any process starts
    with pipe:
        return pipe.generate(prompts, decode, name=name)
