"""Several requests in flight through real stage processes (FIFO per stage, one KV cache per
request): each request's tokens are those of decoding it alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from wansim.real.config import DecodeSpec, PipelineSpec, TreeSpec  # noqa: E402
from wansim.real.errors import RealConfigError  # noqa: E402
from wansim.real.link import LinkSpec  # noqa: E402
from wansim.real.runner import Pipeline  # noqa: E402
from wansim.real.speculative import Drafter, plain_decode, speculative_decode  # noqa: E402

pytestmark = pytest.mark.real


def test_concurrent_requests_decode_as_alone(tiny_models, tmp_path):
    """P = 3, 4 prompts, 3 in flight over 3 ms links: greedy output == plain greedy per prompt;
    lossless (2 in flight) == the in-process reference with each prompt's own streams; the
    stages really interleaved requests (passes of different requests back to back)."""
    import pandas as pd

    from wansim.real.prompts import builtin_prompts

    target_dir, drafter_dir, load_lm = tiny_models
    torch.set_num_threads(1)
    target = load_lm(target_dir)
    drafter = Drafter(load_lm(drafter_dir, field="drafter_dir"))
    prompts = builtin_prompts("code", n=4, prompt_tokens=40, seed=4)
    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        stages=3,
        links=(LinkSpec(latency_ms=3.0),),
    )
    lossless = DecodeSpec(k=3, verifier="lossless", temperature=1.0, max_new_tokens=20, seed=2)
    with Pipeline(spec, tmp_path) as pipe:
        greedy = pipe.generate(prompts, DecodeSpec(k=3, max_new_tokens=24, concurrency=3), "g")
        sampled = pipe.generate(
            prompts,
            DecodeSpec(
                k=3, verifier="lossless", temperature=1.0, max_new_tokens=20, seed=2, concurrency=2
            ),
            "l",
        )
    for j, p in enumerate(prompts):
        assert greedy.outputs[p.prompt_id] == plain_decode(target, list(p.tokens), 24)
        ref, _ = speculative_decode(
            target, drafter, list(p.tokens), 20, 3, "lossless", 1.0, lossless.seed, j
        )
        assert sampled.outputs[p.prompt_id] == ref
    steps = pd.read_csv(greedy.paths["steps"]).sort_values("pass")
    switches = (steps["prompt_index"].diff().fillna(0) != 0).sum()
    assert switches > len(prompts)  # interleaved, not one request after another
    assert greedy.summary["meta"]["concurrency"] == 3


def test_concurrency_bad_input_is_one_line():
    with pytest.raises(RealConfigError, match=r"^concurrency: must be an integer in 1\.\.256"):
        DecodeSpec(concurrency=0)
    DecodeSpec(k=2, concurrency=2, schedule="async", max_inflight_blocks=2)  # accepted
    DecodeSpec(concurrency=2, tree=TreeSpec("static", branching=(2, 1)))  # accepted


def test_concurrent_tree_requests_decode_as_alone(tiny_models, tmp_path):
    """P = 4, 4 prompts, 3 in flight over 2 ms links, a draft tree per pass: greedy (static
    tree) == plain greedy per prompt; lossless (sequoia tree, 2 in flight) == the in-process
    tree reference with each prompt's own streams; the stages interleaved requests, every
    request kept its own previous tree's accepted path (a wrong keep list would change the
    tokens), and the steps record each pass's tree."""
    import pandas as pd

    from wansim.real.prompts import builtin_prompts
    from wansim.real.tree_speculative import tree_speculative_decode

    target_dir, drafter_dir, load_lm = tiny_models
    torch.set_num_threads(1)
    target = load_lm(target_dir)
    drafter = Drafter(load_lm(drafter_dir, field="drafter_dir"))
    prompts = builtin_prompts("code", n=4, prompt_tokens=40, seed=5)
    static = TreeSpec("static", branching=(2, 2, 1))
    sequoia = TreeSpec("sequoia", budget=8, depth=4, acceptance=(0.8, 0.1, 0.05))
    spec = PipelineSpec(
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        stages=4,
        links=(LinkSpec(latency_ms=2.0),),
    )
    with Pipeline(spec, tmp_path) as pipe:
        greedy = pipe.generate(
            prompts, DecodeSpec(max_new_tokens=24, tree=static, concurrency=3), "g"
        )
        sampled = pipe.generate(
            prompts,
            DecodeSpec(
                verifier="lossless",
                temperature=1.0,
                max_new_tokens=20,
                seed=3,
                tree=sequoia,
                concurrency=2,
            ),
            "l",
        )
    for j, p in enumerate(prompts):
        assert greedy.outputs[p.prompt_id] == plain_decode(target, list(p.tokens), 24)
        ref, _ = tree_speculative_decode(
            target, drafter, list(p.tokens), 20, sequoia, "lossless", 1.0, 3, j
        )
        assert sampled.outputs[p.prompt_id] == ref
    steps = pd.read_csv(greedy.paths["steps"]).sort_values("pass")
    switches = (steps["prompt_index"].diff().fillna(0) != 0).sum()
    assert switches > len(prompts)  # interleaved, not one request after another
    assert (steps["nodes"] == 10).all() and (steps["accepted"] > 0).any()
    assert greedy.summary["meta"]["concurrency"] == 3
