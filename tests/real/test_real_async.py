"""Async in-pipe speculation with cancellation through real stage processes: greedy output ==
plain greedy, lossless output distributed as the target (chi-square on tokens committed by bet
blocks), stale blocks never computed by the last stage, one-line errors; the same with several
requests in flight (``concurrency``), where a request's ``CANCEL`` drops only its own passes."""

from __future__ import annotations

from collections import Counter, deque
from pathlib import Path

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


@pytest.mark.parametrize(
    ("stages", "concurrency", "n"),
    [
        pytest.param(2, 1, 300),
        pytest.param(2, 1, 1500, marks=pytest.mark.slow),
        pytest.param(3, 4, 300, id="concurrent"),
    ],
)
def test_async_lossless_tokens_follow_the_target(
    tiny_dirs, target, tmp_path, stages, concurrency, n
):
    """K = 1, B = 2, T = 1, 4 new tokens: the second block is a bet launched before the first
    verdict, so token 4 is committed by it whenever the bet won. Each of tokens 2, 3, 4 is
    tested against the target's exact next-token distribution after the most frequent prefix
    (chi-square), and the bet blocks must have been used (cancellations and wins both seen).
    ``concurrent``: 4 requests in flight through 3 stages (lost bets send ``CANCEL``)."""
    from real_helpers import CTX, chi2_pvalue

    target_dir, drafter_dir = tiny_dirs
    spec = PipelineSpec(target_dir=target_dir, drafter_dir=drafter_dir, stages=stages)
    prompts = [Prompt("chi2", j, tuple(CTX)) for j in range(n)]
    decode = DecodeSpec(
        k=1,
        verifier="lossless",
        temperature=1.0,
        max_new_tokens=4,
        seed=7,
        schedule="async",
        max_inflight_blocks=2,
        concurrency=concurrency,
    )
    with Pipeline(spec, tmp_path) as pipe:
        res = pipe.generate(prompts, decode)
    outs = [tuple(o) for o in res.outputs.values()]
    assert len(outs) == n
    assert 0 < res.summary["cancelled_blocks"] < n  # bets were lost and won
    for i in (1, 2, 3):  # token i + 1 given the commonest prefix of i tokens
        prefix, count = Counter(o[:i] for o in outs).most_common(1)[0]
        assert count >= 60, (i, count)
        tokens = np.bincount([o[i] for o in outs if o[:i] == prefix], minlength=256)
        assert chi2_pvalue(tokens, _exact_next(target, [*CTX, *prefix])) > 1e-3, i


def test_concurrent_async_greedy_equals_plain_and_cancels_per_request(tiny_dirs, target, tmp_path):
    """P = 4, 4 prompts, C = 3 requests in flight, B = 3, K = 3 over 2 ms links with a noisy
    drafter: every request's tokens == plain greedy decoding; lost bets cancelled blocks of
    several requests (the last stage computed none), the stages interleaved requests, and
    other requests' later passes were in flight when a request's ``CANCEL`` went out (had it
    dropped them, their verdicts would never have come); the bets are countable from the
    records as ``wansim calibrate`` counts them."""
    import pandas as pd

    from wansim.calibrate.measure import real_bets
    from wansim.real.prompts import builtin_prompts

    target_dir, drafter_dir = tiny_dirs
    prompts = builtin_prompts("code", n=4, prompt_tokens=40, seed=6)
    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        stages=4,
        links=(LinkSpec(latency_ms=2.0),),
        drafter_noise=0.2,  # a worse drafter: more lost bets
    )
    decode = DecodeSpec(
        k=3, max_new_tokens=24, schedule="async", max_inflight_blocks=3, concurrency=3
    )
    with Pipeline(spec, tmp_path) as pipe:
        res = pipe.generate(prompts, decode, "ca")
    for p in prompts:
        assert res.outputs[p.prompt_id] == plain_decode(target, list(p.tokens), 24)
    s = res.summary
    assert s["meta"]["concurrency"] == 3 and s["meta"]["schedule"] == "async"
    assert s["cancelled_blocks"] > 0
    assert s["cancelled_computed_per_stage"][0] == s["cancelled_blocks"]
    assert s["cancelled_computed_per_stage"][3] == 0  # the last stage drops them uncomputed
    steps = pd.read_csv(res.paths["steps"]).sort_values("pass")
    cancelled = pd.read_csv(tmp_path / "raw" / "cancelled.csv")
    assert cancelled["prompt_index"].nunique() >= 2
    switches = (steps["prompt_index"].diff().fillna(0) != 0).sum()
    assert switches > len(prompts)  # interleaved, not one request after another
    # a request's CANCEL while another request's later passes were still in flight
    overlapping = [
        ((steps["prompt_index"] != c.prompt_index) & (steps["pass"] > c.after_pass))
        & (steps["sent_ns"] < c.cancel_ns)
        & (steps["verdict_ns"] > c.cancel_ns)
        for c in cancelled.itertuples()
    ]
    assert any(m.any() for m in overlapping)
    for _, g in steps.groupby("prompt_index"):  # each request's steps in order, no gaps
        assert list(g["step"]) == list(range(len(g)))
        assert 1 + g["new_tokens"].sum() >= 24
    bets = real_bets(steps, cancelled)
    lost = set(zip(cancelled["prompt_index"], cancelled["after_pass"], strict=True))
    assert bets["lost"] == len(lost)
    assert bets["won"] > 0


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


def test_concurrent_async_input(tiny_dirs):
    """Several requests in flight with async speculation are accepted; what stays unsupported
    with them (a tree, continuous batching, the MTP head) is a one-line error naming the field."""
    from real_helpers import CTX

    from wansim.real.config import TreeSpec

    ok = DecodeSpec(k=2, concurrency=2, schedule="async", max_inflight_blocks=4)
    assert (ok.concurrency, ok.schedule, ok.max_inflight_blocks) == (2, "async", 4)
    tree = TreeSpec("static", branching=(2, 1))
    with pytest.raises(RealConfigError, match=r"^(concurrency|schedule): .*tree"):
        DecodeSpec(concurrency=2, schedule="async", max_inflight_blocks=2, tree=tree)
    with pytest.raises(RealConfigError, match=r"^batching: continuous batches chains"):
        DecodeSpec(
            k=2, concurrency=2, schedule="async", max_inflight_blocks=2, batching="continuous"
        )
    target_dir, drafter_dir = tiny_dirs
    mtp = Path(target_dir).parent / "tiny-mtp"
    decode = DecodeSpec(k=2, concurrency=2, schedule="async", max_inflight_blocks=2)
    prompts = [Prompt("w", j, tuple(CTX)) for j in range(3)]
    spec = PipelineSpec(target_dir=target_dir, stages=3, drafter_kind="mtp", mtp_dir=str(mtp))
    with pytest.raises(RealConfigError, match=r"^schedule: async needs the draft model"):
        Pipeline(spec).check_job(prompts, decode)
    spec = PipelineSpec(target_dir=target_dir, drafter_dir=drafter_dir, stages=3)
    Pipeline(spec).check_job(prompts, decode)  # no error
