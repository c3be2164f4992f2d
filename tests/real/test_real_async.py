"""Async in-pipe speculation with cancellation through real stage processes: greedy output ==
plain greedy, lossless output distributed as the target (chi-square on tokens committed by bet
blocks), stale blocks never computed by the last stage, one-line errors."""

from __future__ import annotations

from collections import Counter, deque

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from wansim.real.config import DecodeSpec, PipelineSpec, Prompt  # noqa: E402
from wansim.real.errors import RealConfigError  # noqa: E402
from wansim.real.link import LinkSpec  # noqa: E402
from wansim.real.runner import Pipeline  # noqa: E402
from wansim.real.speculative import plain_decode  # noqa: E402

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def target(tiny_models):
    target_dir, _, load_lm = tiny_models
    torch.set_num_threads(1)
    return load_lm(target_dir)


def test_async_greedy_equals_plain_and_cancels_stale_blocks(tiny_dirs, target, tmp_path):
    """P = 3, B = 3, K = 3 over 2 ms links: same tokens as plain greedy decoding; lost bets
    cancel blocks, which the last stage never computes; the sync run on the same pipeline
    gives the same tokens with no cancellation."""
    from wansim.real.prompts import builtin_prompts

    target_dir, drafter_dir = tiny_dirs
    prompts = builtin_prompts("code", n=2, prompt_tokens=40, seed=3)
    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        stages=3,
        links=(LinkSpec(latency_ms=2.0),),
        drafter_noise=0.2,  # a worse drafter: more lost bets
    )
    decode = DecodeSpec(k=3, max_new_tokens=40, schedule="async", max_inflight_blocks=3)
    with Pipeline(spec, tmp_path) as pipe:
        res = pipe.generate(prompts, decode, "async")
        sync = pipe.generate(prompts, DecodeSpec(k=3, max_new_tokens=40), "sync")
    for p in prompts:
        ref = plain_decode(target, list(p.tokens), 40)
        assert res.outputs[p.prompt_id] == ref
        assert sync.outputs[p.prompt_id] == ref
    s = res.summary
    assert s["cancelled_blocks"] > 0
    assert s["cancelled_computed_per_stage"][0] == s["cancelled_blocks"]  # S0 computed each
    assert s["cancelled_computed_per_stage"][2] == 0  # the last stage drops them uncomputed
    assert s["cancelled_stage_tokens"] == 4 * sum(s["cancelled_computed_per_stage"])
    assert sync.summary["cancelled_blocks"] == 0
    assert s["meta"]["schedule"] == "async"


def _exact_next(model, ctx: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ctx])).logits[0, -1].double()
    return torch.softmax(logits, -1).numpy()


@pytest.mark.parametrize("n", [pytest.param(300), pytest.param(1500, marks=pytest.mark.slow)])
def test_async_lossless_tokens_follow_the_target(tiny_dirs, target, tmp_path, n):
    """K = 1, B = 2, T = 1, 4 new tokens: the second block is a bet launched before the first
    verdict, so token 4 is committed by it whenever the bet won. Each of tokens 2, 3, 4 is
    tested against the target's exact next-token distribution after the most frequent prefix
    (chi-square), and the bet blocks must have been used (cancellations and wins both seen)."""
    from real_helpers import CTX, chi2_pvalue

    target_dir, drafter_dir = tiny_dirs
    spec = PipelineSpec(target_dir=target_dir, drafter_dir=drafter_dir, stages=2)
    prompts = [Prompt("chi2", j, tuple(CTX)) for j in range(n)]
    decode = DecodeSpec(
        k=1,
        verifier="lossless",
        temperature=1.0,
        max_new_tokens=4,
        seed=7,
        schedule="async",
        max_inflight_blocks=2,
    )
    with Pipeline(spec, tmp_path) as pipe:
        res = pipe.generate(prompts, decode)
    outs = [tuple(o) for o in res.outputs.values()]
    assert 0 < res.summary["cancelled_blocks"] < n  # bets were lost and won
    for i in (1, 2, 3):  # token i + 1 given the commonest prefix of i tokens
        prefix, count = Counter(o[:i] for o in outs).most_common(1)[0]
        assert count >= 60, (i, count)
        tokens = np.bincount([o[i] for o in outs if o[:i] == prefix], minlength=256)
        assert chi2_pvalue(tokens, _exact_next(target, [*CTX, *prefix])) > 1e-3, i


def test_cancel_drops_only_its_requests_passes():
    """A ``CANCEL`` of request 1 after pass 5 drops request 1's passes 7 and 9 from a relay's
    mailbox, and the last stage forgets request 1's pending passes 7 and 9 (not its pass 4):
    request 0's passes 6 and 8 (later ids, sent before the cancel) stay in both."""
    from wansim.real.frames import Kind, array_frame, with_request
    from wansim.real.last_stage import LastStageWorker
    from wansim.real.worker import ServingStageWorker

    def frame(kind, step, request, values=(1, 2)):
        arr = np.array(values, dtype=np.int32)
        return with_request(array_frame(kind, arr, step=step), request)

    passes = [(6, 0), (7, 1), (8, 0), (9, 1)]
    relay = ServingStageWorker.__new__(ServingStageWorker)
    relay.dropped = 0
    relay.inbox = deque(
        (frame(kind, step, r), 0) for step, r in passes for kind in (Kind.DRAFT_IDS, Kind.HIDDEN)
    )
    relay._drop_stale(5, 1)
    assert [(f.kind, f.header.step) for f, _ in relay.inbox] == [
        (Kind.DRAFT_IDS, 6),
        (Kind.HIDDEN, 6),
        (Kind.DRAFT_IDS, 8),
        (Kind.HIDDEN, 8),
    ]
    assert relay.dropped == 2

    last = LastStageWorker.__new__(LastStageWorker)
    last.job = {"schedule": "async"}
    last.pending = {}
    for step, r in [(4, 1), *passes]:
        last._draft_ids(frame(Kind.DRAFT_IDS, step, r))
    last._cancel(frame(Kind.CANCEL, 5, 1, ()))
    assert sorted(last.pending) == [4, 6, 8]


def test_async_bad_input_is_one_line(tiny_dirs):
    with pytest.raises(RealConfigError, match=r"^max_inflight_blocks: is 1 for the sync"):
        DecodeSpec(max_inflight_blocks=2)
    with pytest.raises(RealConfigError, match=r"^schedule: async needs a chain of k >= 1"):
        DecodeSpec(k=0, schedule="async", max_inflight_blocks=2)
    with pytest.raises(RealConfigError, match=r"^schedule: must be one of"):
        DecodeSpec(schedule="eager")
    target_dir, _ = tiny_dirs
    pipe = Pipeline(PipelineSpec(target_dir=target_dir, stages=2))
    prompt = [Prompt("w", 0, (1, 2, 3))]
    with pytest.raises(RealConfigError, match=r"^schedule: async needs the draft model"):
        pipe.check_job(prompt, DecodeSpec(k=2, schedule="async", max_inflight_blocks=2))
