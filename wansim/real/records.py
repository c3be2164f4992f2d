"""The records a real run writes (torch-free): one frozen dataclass per raw log, whose fields
are the log's CSV columns in order, and the appending writer the stage processes use.

- :class:`StageRow` -> ``raw/stage{i}.csv``: one row per pass through stage i;
- :class:`StepRow` -> ``raw/steps.csv``: stage 0, one row per verify step (the trace + timings);
- :class:`CancelRow` -> ``raw/cancelled.csv``: stage 0, one row per block cancelled by a lost
  bet (async schedule).

Times are ``time.monotonic_ns()`` (one clock for every process on the machine); ``*_ms`` are
milliseconds written with 4 decimals. :mod:`wansim.real.recording` reads these files back.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class StageRow:
    job: int
    pass_: int  # column "pass"
    n_tokens: int
    pos: int
    recv_ns: int
    upstream_send_ns: int
    start_ns: int
    end_ns: int
    sent_ns: int
    compute_ms: str
    codec_ms: str
    verify_ms: str
    out_bytes: int
    draft_ms: str
    # the stage's own thread's CPU time over the compute (``time.thread_time_ns``): below
    # compute_ms by the time the process waited for a core; "" in logs written before it
    compute_cpu_ms: str = ""
    # the same thread's CPU time over the whole pass here: decoding the activation (stage 0:
    # from its compute), the compute, the outputs (verifier, encoding) and sending them
    pass_cpu_ms: str = ""


@dataclasses.dataclass(frozen=True)
class StepRow:
    job: int
    workload: str
    prompt_id: int
    prompt_index: int
    step: int
    pass_: int  # column "pass"
    k: int  # drafts per pass (trees: the depth)
    accepted: int
    new_tokens: int
    pos: int
    start_ns: int
    draft_end_ns: int
    sent_ns: int
    verdict_ns: int
    draft_ms: str
    stage0_ms: str
    lap_ms: str
    send_ns_verdict: int
    draft_stage: int
    nodes: int  # drafted tokens in the pass (k for chains)
    accepted_ranks: str  # trees: "1;2" sibling rank accepted per depth
    walk_children: str  # trees: "2;2;0" candidates per walked node


def step_row(
    *,
    job: int,
    workload: str,
    prompt_id: int,
    prompt_index: int,
    step: int,
    pass_: int,
    k: int,
    accepted: int,
    pos: int,
    start_ns: int,
    draft_end_ns: int,
    sent_ns: int,
    verdict_ns: int,
    stage0_ms: float,
    send_ns_verdict: int,
    draft_stage: int = 0,
    nodes: int | None = None,
    accepted_ranks: str = "",
    walk_children: str = "",
) -> StepRow:
    """One verified pass as stage 0 logs it: the committed tokens (accepted + 1) and the
    drafting and lap milliseconds are derived here, once, from the clock readings (ns)."""
    return StepRow(
        job,
        workload,
        prompt_id,
        prompt_index,
        step,
        pass_,
        k,
        accepted,
        accepted + 1,
        pos,
        start_ns,
        draft_end_ns,
        sent_ns,
        verdict_ns,
        f"{(draft_end_ns - start_ns) / 1e6:.4f}",
        f"{stage0_ms:.4f}",
        f"{(verdict_ns - start_ns) / 1e6:.4f}",
        send_ns_verdict,
        draft_stage,
        k if nodes is None else nodes,
        accepted_ranks,
        walk_children,
    )


@dataclasses.dataclass(frozen=True)
class CancelRow:
    job: int
    prompt_index: int
    pass_: int  # column "pass"
    n_tokens: int
    after_pass: int  # the verified pass whose verdict lost the bet
    cancel_ns: int


def columns(row_type) -> tuple[str, ...]:
    """CSV columns of a record type (``pass_`` is written ``pass``)."""
    return tuple(f.name.rstrip("_") for f in dataclasses.fields(row_type))


STAGE_COLUMNS = columns(StageRow)
STEP_COLUMNS = columns(StepRow)
CANCEL_COLUMNS = columns(CancelRow)


class RecordLog:
    """Appends records of one type to a CSV (header first when new), flushed per row so a
    failed run keeps what it recorded."""

    def __init__(self, path: Path, row_type):
        self.row_type = row_type
        new = not path.exists()
        self.fh = open(path, "a", newline="")  # noqa: SIM115
        self.w = csv.writer(self.fh)
        if new:
            self.w.writerow(columns(row_type))
            self.fh.flush()

    def write(self, record) -> None:
        if not isinstance(record, self.row_type):
            raise TypeError(f"{type(record).__name__} written to a {self.row_type.__name__} log")
        self.w.writerow(dataclasses.astuple(record))
        self.fh.flush()
