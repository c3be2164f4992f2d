"""Wire bytes per token versus activation bits, and when compression buys speed.

Question: every forward hop carries the verified block's activations (hidden_size x bits / 8
bytes per token, plus a scale per 128 values below 16 bits); the return hop carries token ids
only. How many bytes cross the WAN per committed token at 16/8/4/3 bits, with and without
speculation - and at which bandwidths does quantising activations make decoding faster?

Scenario: scenarios/v4pro-dspark-10stage-wan.yaml (hidden size 7168, 10 stages, 25 ms per hop,
DSpark K = 7 on math, 3000-token outputs). (a) bytes per committed token over all hops
(analytical lines; DES markers at 16 and 4 bits). (b) tokens/s of one request (chain K = 7)
versus bits at 50 Mbit/s, 200 Mbit/s, 1 Gbit/s and 10 Gbit/s per hop (analytical).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from _common import COLORS, MARKERS, Policy, des_workload, fast, save, style, sweep

BITS = [3, 4, 8, 16]
POLICIES = [
    Policy("no speculation", {"speculation.policy": "none"}),
    Policy("chain, K = 3", {"speculation.policy": "chain", "speculation.k": 3}),
    Policy("chain, K = 7", {"speculation.policy": "chain", "speculation.k": 7}),
]
BANDWIDTHS = fast([50, 200, 1000, 10000], [50, 1000])
DES_BITS = fast([4, 16], [16])
FIXED = {"workload.output_tokens": 3000}


def main() -> None:
    style()
    fig, (ax_bytes, ax_rate) = plt.subplots(1, 2, figsize=(9.6, 3.9))
    for i, policy in enumerate(POLICIES):
        table = sweep(
            f"bytes-{i}", {"payload.activation_bits": BITS}, {**FIXED, **policy.overrides}
        )
        ax_bytes.plot(
            table["payload.activation_bits"],
            table["bytes_per_token"] / 1e3,
            color=COLORS[i],
            marker=MARKERS[i],
            ms=4,
            label=policy.label,
        )
        des = sweep(
            f"bytes-{i}-des",
            {"payload.activation_bits": DES_BITS},
            {**policy.overrides, **des_workload(16, 3000)},
            engine="des",
        )
        ax_bytes.plot(
            des["payload.activation_bits"],
            des["bytes_per_token"] / 1e3,
            ls="none",
            marker=MARKERS[i],
            mfc="white",
            ms=8,
            color=COLORS[i],
        )
    ax_bytes.plot([], [], ls="none", marker="o", mfc="white", ms=8, color="gray", label="DES")
    ax_bytes.set_ylim(0, None)
    ax_bytes.set_xticks(BITS)
    ax_bytes.set_xlabel("activation bits per value")
    ax_bytes.set_ylabel("wire kB per committed token (all hops)")
    ax_bytes.set_title("(a) bytes on the wire per token", loc="left")
    ax_bytes.legend(frameon=False, loc="upper left")

    table = sweep(
        "bits-bandwidth",
        {"network.bandwidth_mbps": BANDWIDTHS, "payload.activation_bits": BITS},
        FIXED,
    )
    for i, bw in enumerate(BANDWIDTHS):
        rows = table[table["network.bandwidth_mbps"] == bw].sort_values("payload.activation_bits")
        label = f"{bw / 1000:g} Gbit/s" if bw >= 1000 else f"{bw:g} Mbit/s"
        ax_rate.plot(
            rows["payload.activation_bits"],
            rows["tokens_per_s"],
            color=COLORS[i],
            marker=MARKERS[i],
            ms=4,
            label=label,
        )
    ax_rate.set_xticks(BITS)
    ax_rate.set_ylim(0, None)
    ax_rate.set_xlabel("activation bits per value")
    ax_rate.set_ylabel("tokens/s of one request")
    ax_rate.set_title("(b) chain K = 7, bandwidth per hop varies", loc="left")
    ax_rate.legend(frameon=False, title="link bandwidth", loc="lower left")
    fig.suptitle("V4-Pro (hidden 7168), 10 stages, 25 ms per hop, DSpark on math")
    save(fig, "bytes_vs_bits")


if __name__ == "__main__":
    main()
