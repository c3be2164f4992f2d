"""Measurements of the real path that docs/real.md reports (each a function returning rows).

- :func:`acceptance_by_noise`: greedy and T=1 acceptance of the tiny pair vs drafter weight noise
  (in process, the pipeline's exact algorithm).
- :func:`acceptance_mtp`: the same measurement for the MTP head at the last stage.
- :func:`wire_bits_effect`: activation bits on the wire vs accepted length and output agreement
  with the fp32 run (a real staged pipeline per bit width).
- :func:`speed_matrix`: real tokens/s, tau and lap percentiles over stages x latency x K.
- :func:`corun_cost`: a stage's pass beside another pipeline's stages on the same host cores
  (compute wall and CPU time, alone and beside, interleaved).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np

from wansim.real.config import DecodeSpec, PipelineSpec, Prompt
from wansim.real.link import LinkSpec
from wansim.real.runner import Pipeline


def acceptance_by_noise(
    target_dir: str,
    drafter_dir: str,
    prompts: Sequence[Prompt],
    noises: Sequence[float] = (0.0, 0.05, 0.1, 0.2, 0.4),
    k: int = 4,
    max_new_tokens: int = 64,
    temperatures: Sequence[float] = (0.0, 1.0),
) -> list[dict]:
    """Per (noise, temperature): acceptance rate (accepted / drafted), tau, per-position rates."""
    import torch

    from wansim.real.model import load_lm
    from wansim.real.speculative import Drafter, speculative_decode

    torch.set_num_threads(1)
    target = load_lm(target_dir)
    rows = []
    for noise in noises:
        drafter = Drafter(load_lm(drafter_dir, field="drafter_dir", noise=noise, noise_seed=0))
        for temp in temperatures:
            verifier = "greedy" if temp == 0 else "lossless"
            accepted = []
            for j, p in enumerate(prompts):
                _, acc = speculative_decode(
                    target,
                    drafter,
                    list(p.tokens),
                    max_new_tokens,
                    k,
                    verifier,
                    temp,
                    seed=0,
                    prompt_index=j,
                )
                accepted += acc
            rows.append({"drafter_noise": noise, **acceptance_row(accepted, k, temp)})
    return rows


def acceptance_row(accepted: list[int], k: int, temperature: float) -> dict:
    """Accepted drafts per step at block size ``k`` -> rate, tau and per-position rates."""
    from wansim.acceptance.trace import fit_per_position

    a = np.array(accepted)
    rates = fit_per_position(np.full(len(a), k), a)
    return {
        "temperature": temperature,
        "k": k,
        "steps": len(a),
        "acceptance_rate": float(a.sum() / (k * len(a))),
        "tau": float(1 + a.mean()),
        "per_position": [round(float(r), 4) for r in rates],
    }


def acceptance_mtp(
    target_dir: str,
    mtp_dir: str,
    prompts: Sequence[Prompt],
    k: int = 4,
    max_new_tokens: int = 64,
    temperatures: Sequence[float] = (0.0, 1.0),
) -> list[dict]:
    """Per temperature: the MTP head's acceptance rate, tau and per-position rates (in process,
    :func:`wansim.real.mtp.mtp_speculative_decode`: the staged pipeline's exact algorithm)."""
    import torch

    from wansim.real.config import check_mtp_dir
    from wansim.real.model import load_lm
    from wansim.real.mtp import load_mtp, mtp_speculative_decode

    check_mtp_dir(mtp_dir)
    torch.set_num_threads(1)
    target = load_lm(target_dir)
    head = load_mtp(mtp_dir, target)
    rows = []
    for temp in temperatures:
        verifier = "greedy" if temp == 0 else "lossless"
        accepted = []
        for j, p in enumerate(prompts):
            _, acc = mtp_speculative_decode(
                target, head, list(p.tokens), max_new_tokens, k, verifier, temp, 0, j
            )
            accepted += acc
        rows.append({"drafter": "mtp", **acceptance_row(accepted, k, temp)})
    return rows


def wire_bits_effect(
    target_dir: str,
    drafter_dir: str,
    prompts: Sequence[Prompt],
    bits: Sequence[int] = (32, 16, 8, 4, 3),
    k: int = 4,
    max_new_tokens: int = 64,
    stages: int = 2,
    run_dir: str | Path | None = None,
) -> list[dict]:
    """Greedy decoding with activations at each bit width vs the fp32 run."""
    rows = []
    ref: dict[int, list[int]] | None = None
    for b in bits:
        spec = PipelineSpec(
            target_dir=target_dir, drafter_dir=drafter_dir, stages=stages, activation_bits=b
        )
        sub = Path(run_dir) / f"bits{b}" if run_dir else None
        with Pipeline(spec, sub) as pipe:
            res = pipe.generate(prompts, DecodeSpec(k=k, max_new_tokens=max_new_tokens))
        if ref is None:
            ref = res.outputs
        same, prefix = [], []
        for pid, out in res.outputs.items():
            r = ref[pid]
            same.append(np.mean([a == b_ for a, b_ in zip(out, r, strict=True)]))
            n = next((i for i, (a, b_) in enumerate(zip(out, r, strict=True)) if a != b_), len(r))
            prefix.append(n)
        rows.append(
            {
                "activation_bits": b,
                "tau": res.summary["tau"],
                "acceptance_rate": res.summary["acceptance_rate"],
                "bytes_per_pass_hop0": float(res.links.loc[0, "bytes_per_pass_mean"]),
                "tokens_equal_to_fp32": float(np.mean(same)),
                "identical_prefix_mean": float(np.mean(prefix)),
            }
        )
    return rows


def speed_matrix(
    target_dir: str,
    drafter_dir: str,
    prompts: Sequence[Prompt],
    stages: Sequence[int] = (2, 4),
    latencies_ms: Sequence[float] = (5.0, 20.0),
    ks: Sequence[int] = (0, 4),
    max_new_tokens: int = 64,
    run_dir: str | Path | None = None,
    drafter_noise: float = 0.0,
    mtp_dir: str | None = None,
) -> list[dict]:
    """Real tokens/s per (stages, latency, K), greedy; one pipeline per (stages, latency).
    ``mtp_dir``: draft with that MTP head at the last stage instead of the draft model."""
    rows = []
    for p in stages:
        for lat in latencies_ms:
            spec = PipelineSpec(
                target_dir=target_dir,
                drafter_dir=None if mtp_dir else drafter_dir,
                stages=p,
                links=(LinkSpec(latency_ms=lat),),
                drafter_noise=drafter_noise,
                drafter_kind="mtp" if mtp_dir else "draft_model",
                mtp_dir=mtp_dir,
            )
            sub = Path(run_dir) / f"p{p}-lat{lat:g}" if run_dir else None
            with Pipeline(spec, sub) as pipe:
                for k in ks:
                    res = pipe.generate(
                        prompts, DecodeSpec(k=k, max_new_tokens=max_new_tokens), name=f"k{k}"
                    )
                    s = res.summary
                    ct = res.compute_table
                    stage_ms = ct[(ct["stage"] != "drafter") & (ct["n_tokens"] == k + 1)]
                    rows.append(
                        {
                            "stages": p,
                            "latency_ms": lat,
                            "k": k,
                            "tokens_per_s": s["tokens_per_s"],
                            "tau": s["tau"],
                            "lap_ms_p50": s["lap_ms_p50"],
                            "lap_ms_p99": s["lap_ms_p99"],
                            "draft_ms_mean": s["draft_ms_mean"],
                            "stage_ms_median": [round(float(x), 3) for x in stage_ms["median_ms"]],
                            "link_error_ms_p50": [
                                round(float(x), 3) for x in res.links["error_ms_p50"]
                            ],
                            "steps": s["steps"],
                        }
                    )
    return rows


def corun_cost(
    target_dir: str,
    drafter_dir: str,
    prompts: Sequence[Prompt],
    k: int = 4,
    max_new_tokens: int = 48,
    rounds: int = 2,
    run_dir: str | Path | None = None,
    latency_ms: float = 0.0,
) -> list[dict]:
    """What sharing the host's cores with other stage processes does to a pass. Two identical
    2-stage pipelines (links of ``latency_ms``, 0 by default: their relays then forward at
    once, where at a latency they wake on a timer), A and B; each round A decodes ``prompts`` alone and beside
    B (B decoding the same prompts one at a time, over and over, until A is done), in an order
    that alternates by round. Per round, condition and stage of A: its decode passes' compute
    wall time and the stage thread's CPU time over it (median, mean; their difference is time
    spent waiting for a core), the gap before each pass (median), A's tokens/s, and the host's
    cores by process role over A's decode (B's processes are ``beside_stage``/``beside_link``)."""
    import threading

    from wansim.real.errors import RealConfigError
    from wansim.real.host_load import measured
    from wansim.real.recording import read_raw

    if rounds < 1:
        raise RealConfigError("rounds", "must be >= 1", rounds)

    link = LinkSpec(latency_ms=latency_ms)  # (a bad latency: one line, before any process)
    spec = PipelineSpec(target_dir=target_dir, drafter_dir=drafter_dir, stages=2, links=(link,))
    decode = DecodeSpec(k=k, max_new_tokens=max_new_tokens)
    base = Path(run_dir) if run_dir else None
    rows = []
    with (
        Pipeline(spec, base / "a" if base else None) as a,
        Pipeline(spec, base / "b" if base else None) as b,
    ):
        for pipe in (a, b):  # unmeasured warm-up (a fresh pipeline's first passes are slower)
            pipe.generate(prompts[:1], DecodeSpec(k=k, max_new_tokens=8), name="warmup")
        names = {**a.pids, **{f"beside_{n}": pid for n, pid in b.pids.items()}}
        for r in range(rounds):
            for condition in ("alone", "beside") if r % 2 == 0 else ("beside", "alone"):
                stop = threading.Event()

                def beside(stop=stop) -> None:
                    i = 0
                    while not stop.is_set():
                        b.generate([prompts[i % len(prompts)]], decode, name="beside")
                        i += 1

                worker = threading.Thread(target=beside, daemon=True)
                if condition == "beside":
                    worker.start()
                res, load = measured(
                    names, partial(a.generate, prompts, decode, name=f"{condition}{r}")
                )
                stop.set()
                if condition == "beside":
                    worker.join()
                raw = read_raw(a.raw_dir, 2)
                for i in range(2):
                    st = raw[f"stage{i}"]
                    st = st[(st["job"] == st["job"].max()) & (st["pos"] != 0)]
                    st = st.sort_values("start_ns")
                    wall = st["compute_ms"].to_numpy(float)
                    cpu = st["compute_cpu_ms"].to_numpy(float)
                    gap = np.diff(st["start_ns"].to_numpy(float)) / 1e6 - wall[:-1]
                    rows.append(
                        {
                            "round": r,
                            "condition": condition,
                            "stage": i,
                            "passes": len(st),
                            "wall_ms_median": _stat(np.median, wall),
                            "wall_ms_mean": _stat(np.mean, wall),
                            "cpu_ms_median": _stat(np.median, cpu),
                            "cpu_ms_mean": _stat(np.mean, cpu),
                            "gap_ms_median": _stat(np.median, gap),
                            "tokens_per_s": res.summary["tokens_per_s"],
                            "host_cpu": load.as_dict() if load else None,
                        }
                    )
    return rows


def _stat(f, x: np.ndarray) -> float | None:
    """``f(x)`` as a float, None for no values (strict JSON: never NaN)."""
    return float(f(x)) if len(x) else None
