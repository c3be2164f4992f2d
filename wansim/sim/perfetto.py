"""Timeline -> Chrome/Perfetto trace JSON (open it at ui.perfetto.dev or chrome://tracing).

Layout: process 1 "stages" has one track (thread) per stage, S0 first, with a complete ("X")
slice per compute pass and per drafter pass, named by request, kind and step
(``r3 verify 5``; a continuous batch is ``batch of 3: ...``); the gaps between slices are the
bubbles. Process 2 "links" has one track per hop (``S0->S1`` .. ``S9->S0 (return)``) with an
"X" slice per message while it occupies the link (serialisation, retransmissions included) and
an async slice from offer to delivery (queueing + serialisation + propagation; these overlap
when several messages are in flight). Nested in those: ``software`` (a message's per-message
and codec cost), ``window stall`` (tcp: the sender waiting for ACKs) and, on stage tracks,
``compute xF`` (a pass scaled by compute noise or a straggler, with the time it added). With
faults, process 3 "faults" has a track "ring" with a slice per outage (failure to recovery:
``stage 2 down``, the requests it hit in its args). Times are microseconds of simulated time.

The slices are the record the metrics use: a stage track's slice durations sum to that stage's
busy time, so divided by the makespan they give ``stage_utilization``.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

from wansim.errors import WansimInputError
from wansim.results import strict_json
from wansim.results.result import Result
from wansim.sim.messages import batch_label
from wansim.sim.record import Timeline

STAGES_PID = 1
LINKS_PID = 2
FAULTS_PID = 3
US_PER_MS = 1e3


def _meta(pid: int, tid: int | None, kind: str, value) -> dict:
    event = {"ph": "M", "pid": pid, "name": kind, "args": {}}
    if tid is not None:
        event["tid"] = tid
    event["args"]["sort_index" if kind.endswith("sort_index") else "name"] = value
    return event


def fault_events(log) -> list[dict]:
    """The faults' track (:class:`wansim.sim.faults.FaultLog`): a slice per outage."""
    events = [
        _meta(FAULTS_PID, None, "process_name", "faults"),
        _meta(FAULTS_PID, None, "process_sort_index", 2),
        _meta(FAULTS_PID, 0, "thread_name", "ring"),
    ]
    for outage in log.outages:
        events.append(
            {
                "ph": "X",
                "pid": FAULTS_PID,
                "tid": 0,
                "ts": outage.start_ms * US_PER_MS,
                "dur": (outage.end_ms - outage.start_ms) * US_PER_MS,
                "name": " + ".join(outage.components) + " down",
                "cat": "outage",
                "args": {"requests_hit": outage.hit, "recovery": log.recovery},
            }
        )
    return events


def trace_events(timeline: Timeline, faults=None) -> list[dict]:
    """The trace's event list: metadata (track names), stage slices, link slices (and the
    faults' outages when ``faults``, a :class:`wansim.sim.faults.FaultLog`, is given)."""
    events = [
        _meta(STAGES_PID, None, "process_name", "stages"),
        _meta(STAGES_PID, None, "process_sort_index", 0),
        _meta(LINKS_PID, None, "process_name", "links"),
        _meta(LINKS_PID, None, "process_sort_index", 1),
    ]
    for i, name in enumerate(timeline.stage_names):
        events.append(_meta(STAGES_PID, i, "thread_name", name))
        events.append(_meta(STAGES_PID, i, "thread_sort_index", i))
    for i, name in enumerate(timeline.link_names):
        events.append(_meta(LINKS_PID, i, "thread_name", name))
        events.append(_meta(LINKS_PID, i, "thread_sort_index", i))
    for stage, start, end, what, passes in timeline.stage_slices:
        label = batch_label(passes)
        events.append(
            {
                "ph": "X",
                "pid": STAGES_PID,
                "tid": stage,
                "ts": start * US_PER_MS,
                "dur": (end - start) * US_PER_MS,
                "name": label if what != "draft" else f"draft for {label}",
                "cat": what,
            }
        )
    for n, (hop, offer, start, busy_end, delivery, n_bytes, losses, passes) in enumerate(
        timeline.transfers
    ):
        label = batch_label(passes)
        args = {"bytes": n_bytes, "losses": losses, "queued_ms": start - offer}
        events.append(
            {
                "ph": "X",
                "pid": LINKS_PID,
                "tid": hop,
                "ts": start * US_PER_MS,
                "dur": (busy_end - start) * US_PER_MS,
                "name": label,
                "cat": "serialise",
                "args": args,
            }
        )
        common = {"pid": LINKS_PID, "tid": hop, "cat": "transfer", "id": n, "name": label}
        events.append({"ph": "b", "ts": offer * US_PER_MS, "args": args, **common})
        events.append({"ph": "e", "ts": delivery * US_PER_MS, **common})
    events.extend(_wan_slices(timeline))
    if faults is not None:
        events.extend(fault_events(faults))
    return events


def _wan_slices(timeline: Timeline) -> list[dict]:
    """Slices nested in the ones above: a message's software cost (per-message and codec, at
    the start of its link slice), a tcp sender's window stalls (waiting for ACKs inside its
    link slice) and a compute pass slowed by noise or a straggler (over its stage slice, with
    the factor and the time it added)."""
    out = []

    def add(pid, tid, start, end, name, cat, args=None) -> None:
        event = {"ph": "X", "pid": pid, "tid": tid, "ts": start * US_PER_MS}
        event.update({"dur": (end - start) * US_PER_MS, "name": name, "cat": cat})
        if args:
            event["args"] = args
        out.append(event)

    for hop, start, end in timeline.software:
        add(LINKS_PID, hop, start, end, "software", "software", {"ms": end - start})
    for hop, start, end in timeline.window_stalls:
        add(LINKS_PID, hop, start, end, "window stall", "tcp", {"ms": end - start})
    for stage, start, end, factor in timeline.slowdowns:
        extra = (end - start) * (1.0 - 1.0 / factor)
        name = f"compute x{factor:.3g}"
        add(STAGES_PID, stage, start, end, name, "slowdown", {"factor": factor, "extra_ms": extra})
    return out


def write_perfetto(result: Result, path: str | os.PathLike) -> Path:
    """Write ``result``'s timeline as a Chrome trace JSON file (needs ``timeline=True``)."""
    timeline = result.details.get("timeline")
    if timeline is None:
        raise WansimInputError(
            "--perfetto", "the run kept no timeline (simulate(scenario, timeline=True))"
        )
    out = Path(path)
    if out.parent and not out.parent.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
    paused = gc.isenabled()  # hundreds of thousands of small dicts: no collection midway
    if paused:
        gc.disable()
    try:
        events = trace_events(timeline, result.details.get("faults"))
    finally:
        if paused:
            gc.enable()
    doc = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "scenario": result.scenario.name,
            "engine": "des",
            "makespan_ms": result.details["makespan_ms"],
        },
    }
    try:
        out.write_text(strict_json.dumps_large(doc))
    except OSError as exc:
        raise WansimInputError("--perfetto", f"cannot write ({exc.strerror})", str(path)) from None
    return out
