"""Prompts for the tiny byte-level pair, from text every Python install has.

Workloads: ``code`` = windows of the standard library files the tiny pair held out from
training (never trained on); ``prose`` = windows of ``pydoc_data/topics.py`` (documentation
prose; part of the training text, so an easier, in-domain workload). Windows start at a line
start and are ``prompt_tokens`` bytes long; choice is seeded.
"""

from __future__ import annotations

import zlib

import numpy as np

from wansim.real.config import Prompt
from wansim.real.errors import RealConfigError

WORKLOADS = ("code", "prose")


def _texts(workload: str) -> list[bytes]:
    from wansim.real.train_tiny import HOLDOUT_MODULUS, corpus_files

    train, held = corpus_files()
    if workload == "code":
        files = [f for f in held if f.name != "topics.py"]
    elif workload == "prose":
        files = [f for f in train + held if f.name == "topics.py"]
        assert zlib.crc32(b"topics.py") % HOLDOUT_MODULUS != 0 or files
    else:
        raise RealConfigError("workload", f"must be one of {list(WORKLOADS)}", workload)
    return [f.read_bytes().replace(b"\x00", b"") for f in files]


def builtin_prompts(
    workload: str = "code", n: int = 8, prompt_tokens: int = 64, seed: int = 0, first_id: int = 0
) -> list[Prompt]:
    """``n`` byte-token prompts of ``prompt_tokens`` bytes from ``workload``."""
    if not 1 <= prompt_tokens <= 4096:
        raise RealConfigError("prompt_tokens", "must be in 1..4096", prompt_tokens)
    if n < 1:
        raise RealConfigError("n", "must be >= 1", n)
    texts = [t for t in _texts(workload) if len(t) > prompt_tokens + 256]
    rng = np.random.default_rng(seed + (0 if workload == "code" else 7919))
    prompts = []
    for j in range(n):
        text = texts[int(rng.integers(len(texts)))]
        starts = [i + 1 for i in range(len(text) - prompt_tokens - 256) if text[i] == 10]
        start = starts[int(rng.integers(len(starts)))] if starts else 0
        window = text[start : start + prompt_tokens]
        prompts.append(Prompt(workload, first_id + j, tuple(window)))
    return prompts
