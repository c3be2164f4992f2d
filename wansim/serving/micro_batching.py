"""Micro-batched pipeline parallelism: the rules both engines share.

With ``schedule.batching: continuous`` and ``schedule.micro_batches: N`` the requests in flight
are split into N micro-batches that circulate the ring at once (as pipeline-parallel serving
engines keep one batch per stage busy). Each micro-batch is one message and one pass per stage;
stages serve micro-batches FIFO, one at a time, and never merge two of them.

- **Slots.** At most ``max_batch_size`` sequences per micro-batch, so at most
  ``N * max_batch_size`` requests in flight; further requests wait for admission
  (:func:`serving_slots`). An admitted request joins the micro-batch with the fewest members
  (ties: the one whose request just finished, then the lowest index).
- **Prefill shares the passes.** A new member's prompt waits at S0 for its micro-batch's next
  pass and rides in it beside the members' verify passes. With ``prefill_chunk_tokens: C`` a
  pass carries at most C prompt tokens, taken first come first served (a prompt may be split
  over several passes: chunked prefill); without it every waiting prompt goes in whole. The
  pass that completes a prompt yields its first token at the last stage; the next pass carries
  the request's first verify pass.
- **Return message.** The last stage sends the micro-batch back to S0 as one message of one
  verdict record per sequence it carried that stays (continuing verify passes and unfinished
  prompt chunks; at least one record while the micro-batch has members).

Equal-length requests admitted together finish together; with a chunk budget their
replacements' prompts are served one after another (C tokens a pass), so their first tokens,
and then their finishes, spread out by about ``prompt / C`` laps each instead of refilling as
one block forever (:func:`prefill_chunks`).
"""

from __future__ import annotations

import numpy as np


def micro_batched(scenario) -> bool:
    """Whether the scenario keeps several batches in flight (``schedule.micro_batches`` set)."""
    return scenario.schedule.micro_batches is not None


def serving_slots(scenario):
    """Requests in flight at once: ``workload.concurrency`` (at most ``requests``), capped at
    ``micro_batches * max_batch_size`` when micro-batched with a cap. Arrays broadcast."""
    wl = scenario.workload
    slots = np.minimum(np.asarray(wl.concurrency), np.asarray(wl.requests))
    sched = scenario.schedule
    if micro_batched(scenario) and sched.max_batch_size is not None:
        slots = np.minimum(slots, sched.micro_batches * sched.max_batch_size)
    return slots


def active_batches(scenario):
    """Micro-batches that hold sequences: min(N, slots)."""
    return np.minimum(scenario.schedule.micro_batches, serving_slots(scenario))


def prefill_chunks(prompt_tokens, chunk_tokens):
    """Passes one prompt takes alone: ceil(prompt / C) (1 without a budget). Arrays broadcast."""
    prompt = np.asarray(prompt_tokens)
    if chunk_tokens is None:
        return np.ones_like(prompt)
    return -(-prompt // chunk_tokens)
