"""Run generated cases (:mod:`fuzz_cases`) and classify what happened.

In process (``run_in_process``): load and validate, then the analytical engine and the DES.
Outcomes:

- ``ok``: loaded, and each engine returned finite metrics or refused the scenario with a
  one-line input error;
- ``rejected``: ``load_scenario`` raised a one-line :class:`WansimInputError`;
- ``bad_error``: an input error that is not one line naming a field (empty path, a newline,
  longer than :data:`MAX_ERROR_CHARS`);
- ``crash``: any other exception (named by its type and the innermost wansim frame);
- ``nonfinite``: a metric (or a value inside a list metric) that is NaN or infinite;
- ``memory``: MemoryError under the worker's address-space limit;
- ``hang``: past the per-case time limit (the worker is killed and replaced).

The DES runs only where its work is small (``DES_MAX_TOKEN_STAGES`` request-tokens x stages):
the fuzz looks for crashes, not for long legitimate runs; the engine's own size limits are
tested separately.

Cases run in a pool of worker processes (``run_pool``): each worker caps its address space
(``resource.setrlimit(RLIMIT_AS)``) and a SIGALRM soft deadline; the parent kills a worker that
misses the hard deadline. Through the CLI (``run_cli``): ``python -m wansim validate|run`` in a
subprocess with the same limits and a timeout.

Reproduce one case: ``python tests/fuzz/fuzz_harness.py SEED INDEX [--cli]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_cases import Case, make_case

MEMORY_LIMIT_BYTES = 3 << 30  # per worker: ~1.2 GiB is mapped after importing numpy/scipy/simpy
SOFT_TIMEOUT_S = 120  # SIGALRM inside the worker (a traceback shows where it was)
HARD_TIMEOUT_S = 150  # the parent kills the worker
CLI_TIMEOUT_S = 180
DES_MAX_TOKEN_STAGES = 200_000
MAX_ERROR_CHARS = 400
THREADS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclasses.dataclass
class Outcome:
    index: int
    family: str
    label: str
    kind: str  # ok | rejected | bad_error | crash | nonfinite | memory | hang
    detail: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.kind not in ("ok", "rejected")


class _SoftTimeout(BaseException):
    """Raised by SIGALRM: a BaseException so that no ``except Exception`` in the code swallows
    it."""


# ----------------------------------------------------------------------------- files
def write_case(case: Case, workdir: Path) -> Path:
    """Write the case's files (and its mapping as ``scenario.yaml`` when it has no file)."""
    import yaml

    for name, content in case.files.items():
        (workdir / name).write_bytes(content)
    path = workdir / "scenario.yaml"
    if not case.has_file:
        path.write_text(yaml.safe_dump(case.data, allow_unicode=True))
    return path


def error_problem(text: str) -> str:
    """'' when ``text`` is a proper one-line error naming a field, else what is wrong."""
    if not text.strip():
        return "empty error"
    if "\n" in text.rstrip("\n") or "\r" in text:
        return "error spans several lines"
    if len(text) > MAX_ERROR_CHARS:
        return f"error of {len(text)} characters"
    if "Traceback" in text:
        return "traceback"
    return ""


def _error_outcome(err: Exception) -> tuple[str, str]:
    text = str(err)
    path = getattr(err, "path", "")
    problem = error_problem(text) or ("" if path else "error names no field")
    return ("bad_error", f"{problem}: {text[:200]!r}") if problem else ("rejected", text)


def _crash_detail(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "wansim" in f.filename and "tests" not in f.filename]
    where = ours[-1] if ours else (frames[-1] if frames else None)
    loc = f"{Path(where.filename).name}:{where.lineno}" if where else "?"
    return f"{type(exc).__name__} at {loc}: {str(exc)[:160]}"


def nonfinite_metrics(metrics: dict) -> list[str]:
    bad = []
    for key, value in metrics.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
                bad.append(f"{key}={v}")
    return bad


# ----------------------------------------------------------------------------- in process
def run_in_process(case: Case, workdir: Path) -> Outcome:
    from wansim.analytical import analyze
    from wansim.config.scenario import load_scenario
    from wansim.errors import WansimInputError
    from wansim.sim import simulate

    start = time.perf_counter()

    def done(kind: str, detail: str = "") -> Outcome:
        return Outcome(
            case.index, case.family, case.label, kind, detail, time.perf_counter() - start
        )

    try:
        for name, content in case.files.items():
            (workdir / name).write_bytes(content)
        try:
            if case.has_file:
                sc = load_scenario(workdir / "scenario.yaml", case.overrides)
            else:
                sc = load_scenario(data=case.data, overrides=case.overrides, base_dir=workdir)
        except WansimInputError as err:
            return done(*_error_outcome(err))
        wl = sc.workload
        engines = [("analytical", analyze)]
        if wl.requests * wl.output_tokens * sc.stages <= DES_MAX_TOKEN_STAGES:
            engines.append(("des", simulate))
        for name, run in engines:
            try:
                result = run(sc)
            except WansimInputError as err:
                kind, detail = _error_outcome(err)
                if kind != "rejected":
                    return done(kind, f"{name}: {detail}")
                continue
            bad = nonfinite_metrics(result.metrics)
            if bad:
                return done("nonfinite", f"{name}: {', '.join(bad[:4])}")
            json.dumps(result.metrics, allow_nan=False, default=str)
        return done("ok")
    except MemoryError as exc:
        return done("memory", _crash_detail(exc))
    except _SoftTimeout as exc:
        return done("hang", _crash_detail(exc))
    except RecursionError as exc:
        return done("crash", _crash_detail(exc))
    except Exception as exc:
        return done("crash", _crash_detail(exc))


def _limit_worker() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))

    def on_alarm(signum, frame):
        raise _SoftTimeout(f"past {SOFT_TIMEOUT_S} s")

    signal.signal(signal.SIGALRM, on_alarm)


def _worker_main(conn, seed: int) -> None:
    """Worker loop: receive a case index, run it, send the outcome back (None ends)."""
    _limit_worker()
    import wansim.analytical
    import wansim.sim  # noqa: F401  (imported before the clock starts)

    while True:
        index = conn.recv()
        if index is None:
            return
        case = make_case(seed, index)
        with tempfile.TemporaryDirectory(prefix="wansim-fuzz-") as tmp:
            signal.alarm(SOFT_TIMEOUT_S)
            try:
                outcome = run_in_process(case, Path(tmp))
            finally:
                signal.alarm(0)
        conn.send(dataclasses.asdict(outcome))


class _Worker:
    def __init__(self, ctx, seed: int):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, seed), daemon=True)
        self.proc.start()
        child.close()

    def run(self, index: int, timeout_s: float) -> dict | None:
        self.conn.send(index)
        if self.conn.poll(timeout_s):
            try:
                return self.conn.recv()
            except EOFError:
                return None
        return None

    def stop(self, kill: bool = False) -> None:
        if kill or not self.proc.is_alive():
            self.proc.kill()
        else:
            with contextlib.suppress(OSError):
                self.conn.send(None)
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def run_pool(seed: int, indices: list[int], workers: int = 2) -> list[Outcome]:
    """Run cases ``indices`` of seed ``seed`` in ``workers`` processes (outcomes in order)."""
    ctx = multiprocessing.get_context("spawn")
    todo = list(indices)
    lock = threading.Lock()
    outcomes: dict[int, Outcome] = {}
    saved = {k: os.environ.get(k) for k in THREADS_ENV}
    os.environ.update(THREADS_ENV)

    def loop() -> None:
        worker = _Worker(ctx, seed)
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    index = todo.pop(0)
                start = time.perf_counter()
                got = worker.run(index, HARD_TIMEOUT_S)
                if got is None:  # killed by the limit, or died (a segfault, the OOM killer)
                    alive = worker.proc.is_alive()
                    worker.stop(kill=True)
                    case = make_case(seed, index)  # (the worker made it without raising)
                    got = dataclasses.asdict(
                        Outcome(
                            index,
                            case.family,
                            case.label,
                            "hang" if alive else "crash",
                            f"past {HARD_TIMEOUT_S} s"
                            if alive
                            else f"worker died ({worker.proc.exitcode})",
                            time.perf_counter() - start,
                        )
                    )
                    worker = _Worker(ctx, seed)
                with lock:
                    outcomes[index] = Outcome(**got)
        finally:
            worker.stop()

    try:
        threads = [threading.Thread(target=loop) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return [outcomes[i] for i in indices]


# ----------------------------------------------------------------------------- CLI
def _cli_limits() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


_ERROR_LINE = re.compile(r"^error: (\S.*)$")


def run_cli(case: Case, command: str, workdir: Path) -> Outcome:
    """``python -m wansim validate|run`` on the case in a subprocess. ok: exit 0 with strict
    JSON (run) or exit 2 with exactly one stderr line ``error: <field>: ...``."""
    start = time.perf_counter()

    def done(kind: str, detail: str = "") -> Outcome:
        return Outcome(
            case.index, case.family, case.label, kind, detail, time.perf_counter() - start
        )

    try:
        path = write_case(case, workdir)
    except (RecursionError, ValueError, TypeError) as exc:  # not expressible as YAML
        return done("ok", f"skipped: {type(exc).__name__}")
    argv = [sys.executable, "-m", "wansim", command, str(path)]
    for item in case.overrides:
        argv += ["--set", item]
    if command == "run":
        argv += ["--engine", "analytical", "--json"]
    env = {**os.environ, **THREADS_ENV}
    try:
        proc = subprocess.run(
            argv,
            cwd=workdir,
            env=env,
            capture_output=True,
            timeout=CLI_TIMEOUT_S,
            preexec_fn=_cli_limits,
        )
    except subprocess.TimeoutExpired:
        return done("hang", f"past {CLI_TIMEOUT_S} s")
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode == 0:
        if command == "run":
            try:
                doc = json.loads(
                    proc.stdout, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))
                )
            except ValueError as exc:
                return done("nonfinite", f"stdout is not strict JSON: {exc}")
            bad = nonfinite_metrics(doc.get("metrics", {}))
            if bad:
                return done("nonfinite", ", ".join(bad))
        return done("ok")
    if proc.returncode == 2:
        lines = err.splitlines()
        if len(lines) != 1 or not _ERROR_LINE.match(lines[0]):
            return done("bad_error", f"stderr: {err[-300:]!r}")
        problem = error_problem(lines[0])
        if problem:
            return done("bad_error", f"{problem}: {lines[0][:200]!r}")
        return done("rejected", lines[0])
    kind = "memory" if "MemoryError" in err else "crash"
    return done(kind, f"exit {proc.returncode}: {err.strip().splitlines()[-1:] or ''}")


# ----------------------------------------------------------------------------- summaries
def summarise(outcomes: list[Outcome]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.kind] = counts.get(o.kind, 0) + 1
    failures = [o for o in outcomes if o.failed]
    return {
        "cases": len(outcomes),
        "counts": counts,
        "slowest_s": round(max((o.seconds for o in outcomes), default=0.0), 2),
        "failures": [f"#{o.index} [{o.kind}] {o.label} -> {o.detail}" for o in failures[:40]],
    }


def main(argv: list[str]) -> int:
    seed, index = int(argv[0]), int(argv[1])
    case = make_case(seed, index)
    print(f"case {seed}:{index} family {case.family}: {case.label}")
    print(f"overrides: {case.overrides}")
    print(f"files: {sorted(case.files)}")
    with tempfile.TemporaryDirectory(prefix="wansim-fuzz-") as tmp:
        if "--cli" in argv:
            for command in ("validate", "run"):
                print(command, run_cli(case, command, Path(tmp)))
        else:
            print(run_in_process(case, Path(tmp)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
