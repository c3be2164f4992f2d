"""Writes synthetic-chat-code.csv beside this script: a small request trace for wansim's
examples and tests (``workload.trace: traces/requests/synthetic-chat-code.csv``).

It is SYNTHETIC: drawn from the process below with numpy's PCG64 seeded 2026, not measured and
not fitted to any dataset. The parameters were chosen by the wansim authors to give the shape
serving traces are commonly described to have (long-tailed lengths; code prompts longer and
answers shorter than chat; bursty arrivals), nothing more.

- 300 requests; each is chat (share 0.6) or code (0.4);
- chat: prompt ~ LogNormal(median 700 tokens, sigma 0.8), output ~ LogNormal(median 220,
  sigma 0.7); code: prompt ~ LogNormal(median 1500, sigma 0.6), output ~ LogNormal(median 80,
  sigma 0.9); rounded, prompt clipped to [16, 8192], output to [2, 2048];
- arrivals: gamma inter-arrival gaps with mean 2000 ms (0.5 requests/s) and coefficient of
  variation 2 (burstier than Poisson), the first request at 0 ms.

Run: python make_synthetic_requests.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROWS = 300
SEED = 2026


def main() -> None:
    rng = np.random.default_rng(SEED)
    code = rng.random(ROWS) < 0.4
    prompt = np.where(
        code, rng.lognormal(np.log(1500), 0.6, ROWS), rng.lognormal(np.log(700), 0.8, ROWS)
    )
    output = np.where(
        code, rng.lognormal(np.log(80), 0.9, ROWS), rng.lognormal(np.log(220), 0.7, ROWS)
    )
    prompt = np.clip(np.rint(prompt), 16, 8192).astype(int)
    output = np.clip(np.rint(output), 2, 2048).astype(int)
    cv = 2.0
    shape = 1 / cv**2
    gaps = rng.gamma(shape, 2000.0 / shape, ROWS)
    arrival = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    header = __doc__.strip().splitlines()
    lines = ["# " + line if line else "#" for line in header]
    lines.append("arrival_ms,prompt_tokens,output_tokens,kind")
    for t, p, o, c in zip(arrival, prompt, output, code, strict=True):
        lines.append(f"{t:.3f},{p},{o},{'code' if c else 'chat'}")
    (Path(__file__).parent / "synthetic-chat-code.csv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
