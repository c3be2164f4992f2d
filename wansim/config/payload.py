"""Scenario section ``payload``: what a message carries (activation bits, headers, the
return message, extra tensors that ride the ring).

Field documentation: README.md's scenario section."""

from __future__ import annotations

import dataclasses

from wansim.config.limits import MAX_STAGES
from wansim.config.validation import spec

ACTIVATION_BITS = (3, 4, 8, 16, 32)


@dataclasses.dataclass(frozen=True)
class ExtraTensor:
    """A tensor of ``values_per_token`` values per token at ``bits`` that stage ``stage``'s
    output adds to the forward message and every later hop carries until stage ``to_stage``
    consumes it (hops ``stage`` .. ``to_stage - 1``; default the last stage; ``to_stage:
    stages`` carries it over the return hop to S0) - e.g. an EAGLE-3 drafter's auxiliary
    hidden states taken at a few stages, or the last stage's hidden state for a drafter at S0
    (:func:`wansim.links.wire_bytes.forward_bytes`)."""

    stage: int = spec(0, ge=0)
    values_per_token: int = spec(7168, ge=1)
    bits: int = spec(16, choices=ACTIVATION_BITS)
    to_stage: int | None = spec(None, ge=1)


@dataclasses.dataclass(frozen=True)
class Payload:
    """Bytes on the wire: activations of hidden_size*activation_bits/8 per token (plus one fp16
    scale per ``quant_group_size`` values below 16 bits; 32 = fp32), a header per message, the
    ``extra_tensors`` that ride some hops, and a return message of ``return_bytes`` plus
    ``return_token_bytes`` per token id it lists (:func:`wansim.links.wire_bytes.verdict_bytes`)."""

    activation_bits: int = spec(16, choices=ACTIVATION_BITS)
    header_bytes: int = spec(64, ge=0)
    return_bytes: int = spec(50, ge=1)
    return_token_bytes: int = spec(
        0, ge=0, doc="per token id in the verdict (verified positions, next chain drafts)"
    )
    extra_tensors: tuple[ExtraTensor, ...] = spec((), max_items=MAX_STAGES)
    cancel_bytes: int = spec(
        24, ge=1, doc="async: a cancellation message (request id, epoch, position)"
    )
    quant_group_size: int = spec(128, ge=1)
