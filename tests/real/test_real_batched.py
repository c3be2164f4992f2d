"""Continuous batching with micro-batches through real stage processes: each stage runs one
forward over the blocks of several requests (ragged lengths, one KV cache per request), several
micro-batches in flight; each request's tokens are those of decoding it alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from wansim.real.config import DecodeSpec, PipelineSpec, Prompt  # noqa: E402
from wansim.real.errors import RealConfigError  # noqa: E402
from wansim.real.link import LinkSpec  # noqa: E402
from wansim.real.runner import Pipeline  # noqa: E402
from wansim.real.speculative import Drafter, plain_decode, speculative_decode  # noqa: E402

pytestmark = pytest.mark.real


def ragged_prompts(n: int) -> list[Prompt]:
    from wansim.real.prompts import builtin_prompts

    base = builtin_prompts("code", n=n, prompt_tokens=40, seed=7)
    return [Prompt(p.workload, p.prompt_id, p.tokens[: 17 + 6 * j]) for j, p in enumerate(base)]


def test_batched_forward_equals_separate_passes(tiny_models):
    """StageShard.forward_batch over ragged blocks (a prefill beside verify blocks, requests in
    any order) gives each block the rows of its own separate pass, and leaves each request's
    cache as its separate passes would (checked by the next pass on it)."""
    from wansim.real.model import StageShard

    target_dir, _, load_lm = tiny_models
    torch.set_num_threads(1)
    n = len(load_lm(target_dir).model.layers)
    sep = [StageShard(load_lm(target_dir), 0, 2), StageShard(load_lm(target_dir), 2, n)]
    bat = [StageShard(load_lm(target_dir), 0, 2), StageShard(load_lm(target_dir), 2, n)]
    gen = torch.Generator().manual_seed(3)

    def alone(request, ids, pos):
        x = ids
        for s in sep:
            s.select(request)
            x = s.forward(x, pos)
        return x

    def batched(blocks, ids):
        x = ids
        for s in bat:
            x = s.forward_batch(x, blocks)
        return x

    p = {r: torch.randint(0, 256, (L,), generator=gen) for r, L in ((1, 11), (2, 6), (3, 9))}
    ref = torch.cat([alone(1, p[1], 0), alone(2, p[2], 0)])
    got = batched([(1, 0, 11), (2, 0, 6)], torch.cat([p[1], p[2]]))
    assert torch.allclose(got, ref, atol=1e-4)
    # request 2 verifies 3 tokens (rolled back to 5: one position dropped), request 3 prefills,
    # request 1 verifies 4 tokens at 11; packed in another order
    v1, v2 = torch.randint(0, 256, (4,), generator=gen), torch.randint(0, 256, (3,), generator=gen)
    ref = [alone(2, v2, 5), alone(3, p[3], 0), alone(1, v1, 11)]
    got = batched([(2, 5, 3), (3, 0, 9), (1, 11, 4)], torch.cat([v2, p[3], v1]))
    assert torch.allclose(got, torch.cat(ref), atol=1e-4)
    assert [bat[1].caches[r].get_seq_length() for r in (1, 2, 3)] == [15, 8, 9]
    # the caches carry on: one more pass per request, alone again on both sides
    for r, pos in ((1, 15), (2, 8), (3, 9)):
        ids = torch.randint(0, 256, (2,), generator=gen)
        assert torch.allclose(batched([(r, pos, 2)], ids), alone(r, ids, pos), atol=1e-4)
    with pytest.raises(ValueError, match="rows for blocks"):
        bat[0].forward_batch(torch.zeros(3, dtype=torch.long), [(1, 0, 2)])


def test_batched_drafting_equals_drafting_alone(tiny_models):
    """Drafter.draft_batch (one drafter forward per draft position for several requests) gives
    each request the drafts and distributions of Drafter.draft with the same generator, over
    consecutive calls with rollbacks (the cached prefix reused), greedy and sampled."""
    from wansim.real.prompts import builtin_prompts

    _, drafter_dir, load_lm = tiny_models
    torch.set_num_threads(1)
    alone = Drafter(load_lm(drafter_dir, field="drafter_dir"))
    batch = Drafter(load_lm(drafter_dir, field="drafter_dir"))
    prompts = [list(p.tokens[: 20 + 5 * j]) for j, p in enumerate(builtin_prompts("code", 3, 40))]
    for temp in (0.0, 1.0):
        gens_a = [torch.Generator().manual_seed(10 + j) for j in range(3)]
        gens_b = [torch.Generator().manual_seed(10 + j) for j in range(3)]
        committed = [list(p) for p in prompts]
        for round_ in range(3):
            ref = []
            for j in range(3):
                alone.select(j + 3 * int(temp))
                ref.append(alone.draft(committed[j], 4, temp, gens_a[j]))
            items = [(j + 3 * int(temp), committed[j], gens_b[j]) for j in range(3)]
            got = batch.draft_batch(items, 4, temp)
            for (d_ref, q_ref), (d, q) in zip(ref, got, strict=True):
                assert d == d_ref
                assert (q is None) == (q_ref is None)
                if q is not None:
                    assert torch.allclose(q, q_ref, atol=1e-5)
            for j in range(3):  # keep 1 + round_ drafts and a correction: a rollback
                committed[j] = committed[j] + ref[j][0][: 1 + round_] + [7 + j]


def test_batched_pipeline_greedy_fast(tiny_models, tmp_path):
    """The default suite's real batched run: P = 2, 3 ragged prompts in 2 micro-batches, no
    added delay: greedy == plain greedy per prompt, and a pass carried two requests."""
    import pandas as pd

    target_dir, drafter_dir, load_lm = tiny_models
    torch.set_num_threads(1)
    target = load_lm(target_dir)
    prompts = ragged_prompts(3)
    spec = PipelineSpec(target_dir=target_dir, drafter_dir=drafter_dir, stages=2)
    decode = DecodeSpec(
        k=2, max_new_tokens=10, batching="continuous", concurrency=3, micro_batches=2
    )
    with Pipeline(spec, tmp_path) as pipe:
        res = pipe.generate(prompts, decode, "g")
    for p in prompts:
        assert res.outputs[p.prompt_id] == plain_decode(target, list(p.tokens), 10)
    steps = pd.read_csv(res.paths["steps"])
    assert steps.groupby("pass")["prompt_index"].nunique().max() == 2


@pytest.mark.slow
def test_batched_micro_batches_decode_as_alone(tiny_models, tmp_path):
    """P = 3, 5 ragged prompts, 4 in flight as 2 micro-batches over 3 ms links: greedy ==
    plain greedy per prompt; lossless == the in-process reference with each prompt's own
    streams; passes really carried several requests and two micro-batches were in flight."""
    import pandas as pd

    target_dir, drafter_dir, load_lm = tiny_models
    torch.set_num_threads(1)
    target = load_lm(target_dir)
    drafter = Drafter(load_lm(drafter_dir, field="drafter_dir"))
    prompts = ragged_prompts(5)
    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        stages=3,
        links=(LinkSpec(latency_ms=3.0),),
    )
    batched = {"batching": "continuous", "concurrency": 4, "micro_batches": 2}
    with Pipeline(spec, tmp_path) as pipe:
        greedy = pipe.generate(prompts, DecodeSpec(k=3, max_new_tokens=22, **batched), "g")
        sampled = pipe.generate(
            prompts,
            DecodeSpec(
                k=2, verifier="lossless", temperature=1.0, max_new_tokens=16, seed=5, **batched
            ),
            "l",
        )
    for j, p in enumerate(prompts):
        assert greedy.outputs[p.prompt_id] == plain_decode(target, list(p.tokens), 22)
        ref, _ = speculative_decode(target, drafter, list(p.tokens), 16, 2, "lossless", 1.0, 5, j)
        assert sampled.outputs[p.prompt_id] == ref
    steps = pd.read_csv(greedy.paths["steps"])
    per_pass = steps.groupby("pass")["prompt_index"].nunique()
    assert per_pass.max() >= 2  # one pass verified several requests' blocks
    stage1 = pd.read_csv(tmp_path / "raw" / "stage1.csv")
    stage1 = stage1[stage1["job"] == steps["job"].iloc[0]]
    assert (stage1["pos"] == -1).all()  # every pass of the job was batched
    # two micro-batches in flight: some pass was sent before the previous one's verdict
    order = steps.drop_duplicates("pass").sort_values("pass")
    assert (order["sent_ns"].to_numpy()[1:] < order["verdict_ns"].to_numpy()[:-1]).any()
    assert greedy.summary["meta"]["batching"] == "continuous"


def test_batching_bad_input_is_one_line():
    with pytest.raises(RealConfigError, match=r"^batching: must be one of"):
        DecodeSpec(batching="static")
    with pytest.raises(RealConfigError, match=r"^micro_batches: needs batching: continuous"):
        DecodeSpec(concurrency=4, micro_batches=2)
    with pytest.raises(RealConfigError, match=r"^micro_batches: must be <= concurrency \(2\)"):
        DecodeSpec(concurrency=2, batching="continuous", micro_batches=3)
    with pytest.raises(RealConfigError, match=r"^batching: continuous batches chains"):
        DecodeSpec(k=2, batching="continuous", schedule="async", max_inflight_blocks=2)
