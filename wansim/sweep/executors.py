"""One executor interface, three backends: in-process, a local process pool, and Dask.

``executor.imap(fn, tasks)`` calls ``fn(*task)`` for every task and yields the results as they
complete (any order); closing the generator early (Ctrl-C, a failed run) cancels what has not
started. A task is a batch of runs, so per-task overheads (pickling, scheduling: ~2 ms per task
on Dask) are paid once per 1-500 runs. No cluster code lives here: the local backend is the
standard library's ``ProcessPoolExecutor``, the Dask backend is ``dask.distributed``'s
``Client`` on a ``LocalCluster`` or on a scheduler address.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from wansim.errors import WansimInputError

BACKENDS = ("local", "dask")


class SweepRunError(Exception):
    """A run failed or a worker was lost (not bad input). Finished work is kept."""


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def batch_size_for(n_runs: int, workers: int) -> int:
    """About 16 tasks per worker (load balance: the last tasks are short; results are written
    as tasks finish), never more than 500 runs per task."""
    return max(1, min(500, -(-n_runs // (16 * max(1, workers)))))


class Executor(abc.ABC):
    name = "executor"
    workers = 1

    @abc.abstractmethod
    def imap(self, fn: Callable, tasks: Iterable[tuple]) -> Iterator[Any]: ...

    def close(self) -> None:  # noqa: B027 (optional hook)
        pass

    def describe(self) -> str:
        return f"{self.name} x{self.workers}"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SerialExecutor(Executor):
    """In this process, one task after another (one worker: no pool to pay for)."""

    name = "serial"

    def imap(self, fn, tasks):
        for task in tasks:
            yield fn(*task)


def _ignore_sigint() -> None:
    # Ctrl-C is the parent's to handle: it keeps finished work and stops the pool
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _sigint_ignored():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class LocalExecutor(Executor):
    """``concurrent.futures.ProcessPoolExecutor`` (forkserver start: safe with threads in the
    parent, and the server preloads wansim once so workers start fast)."""

    name = "local"

    def __init__(self, workers: int):
        self.workers = workers
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["wansim.sweep.worker", "wansim.analytical", "wansim.sim"])
        self.pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_ignore_sigint
        )

    def imap(self, fn, tasks):
        pending = {self.pool.submit(fn, *task) for task in tasks}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    try:
                        result = fut.result()
                    except BrokenProcessPool:
                        raise SweepRunError(
                            "a worker process died (killed, out of memory, or the main script"
                            " cannot be re-imported by a worker: run sweeps from a file or"
                            " `wansim sweep`)"
                        ) from None
                    yield result
        finally:
            if pending:  # stopped early: don't wait for batches already running
                self._terminate()

    def _terminate(self) -> None:
        """Stop the workers; the pool then fails every pending future as broken. The futures
        are not cancelled first: Python 3.11's pool fails them from its manager thread without
        checking, and a cancelled one raises ``InvalidStateError`` there (a traceback printed
        after a Ctrl-C)."""
        terminate = getattr(self.pool, "terminate_workers", None)  # Python >= 3.14
        if terminate is not None:
            terminate()
            return
        for proc in list((getattr(self.pool, "_processes", None) or {}).values()):
            proc.terminate()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class DaskExecutor(Executor):
    """``dask.distributed``: a ``LocalCluster`` of ``workers`` single-threaded processes, or
    the cluster behind ``scheduler`` (its workers need wansim installed and the scenario's
    files at the same paths)."""

    name = "dask"

    def __init__(self, workers: int, scheduler: str | None = None):
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise WansimInputError(
                "--backend", "dask needs the dist extra: pip install 'wansim[dist]'", "dask"
            ) from None
        self.cluster = None
        if scheduler:
            try:
                self.client = Client(scheduler, timeout="10s")
            except (OSError, TimeoutError) as err:
                raise WansimInputError(
                    "--scheduler", f"cannot reach the Dask scheduler ({err})", scheduler
                ) from None
            self.workers = max(1, sum(self.client.nthreads().values()))
            self.name = f"dask@{scheduler}"
        else:
            # the worker processes start with SIGINT ignored (inherited through exec): Ctrl-C
            # in a terminal reaches the whole process group, and it is the parent's to handle
            with _sigint_ignored():
                self.cluster = LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.ERROR,
                )
            self.client = Client(self.cluster)
            self.workers = workers

    def imap(self, fn, tasks):
        from dask.distributed import as_completed

        futures = [self.client.submit(fn, *task, pure=False) for task in tasks]
        remaining = set(futures)
        try:
            for fut in as_completed(futures):
                remaining.discard(fut)
                yield fut.result()
        finally:
            if remaining:
                self.client.cancel(list(remaining))

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def check_options(backend: str, workers: int | None, scheduler: str | None) -> None:
    if backend not in BACKENDS:
        raise WansimInputError("--backend", f"must be one of {' | '.join(BACKENDS)}", backend)
    if workers is not None and workers < 1:
        raise WansimInputError("--workers", "must be >= 1", workers)
    if scheduler and backend != "dask":
        raise WansimInputError("--scheduler", "needs --backend dask", scheduler)


def make_executor(backend: str, workers: int | None = None, scheduler: str | None = None):
    check_options(backend, workers, scheduler)
    n = workers or default_workers()
    if backend == "dask":
        return DaskExecutor(n, scheduler)
    if n == 1:
        return SerialExecutor()
    return LocalExecutor(n)
