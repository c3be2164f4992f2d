"""Link physics shared by the DES, the analytical engine and the real-path link emulator.

One rule for one message on one hop, written once: :mod:`wansim.links.delivery` (when a
message leaves, how long it holds the sender and the wire, when it arrives) and
:mod:`wansim.links.draws` (its random parts: propagation jitter and lost transmissions, drawn
per message from per-hop seeded streams). ``wansim.sim.link`` (DES), ``wansim.links.expected_delay`` /
``wansim.analytical`` (expectations of the same terms) and ``wansim.real.link`` (the emulator)
call these functions; none of them restates the rule.

numpy only at import (the emulator's relay processes import this and must start fast).
"""
