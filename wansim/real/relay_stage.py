"""A relay stage's worker (stages 1..P-2): compute the pass, send its activations onward.

The frames that describe a pass (draft ids and probabilities, tree shapes, cancels) are passed
on as they arrive; ``HIDDEN`` is decoded, run through the stage's layers and re-encoded at
``activation_bits`` (:class:`~wansim.real.worker.ServingStageWorker` runs the frame loop).
"""

from __future__ import annotations

import time

import torch

from wansim.real import codec
from wansim.real.frames import Frame, Kind
from wansim.real.worker import ServingStageWorker


class RelayStageWorker(ServingStageWorker):
    """A stage between stage 0 and the last (module docstring)."""

    def _pass_on(self, f: Frame) -> None:
        self.send(f)

    _draft_ids = _draft_probs = _cancel = _pass_on

    def _tree(self, f: Frame, parents: list[int]) -> None:
        self.send(f)  # the shape is kept too: this stage computes the tree-masked pass

    def _batch(self, f: Frame, blocks: list) -> None:
        self.send(f)  # the blocks are kept too: this stage computes the batched pass

    def _outputs(self, h, x: torch.Tensor, out: torch.Tensor):
        t0 = time.perf_counter_ns()
        frame = codec.encode(
            Kind.HIDDEN,
            out.cpu().numpy(),
            self.cfg.activation_bits,
            self.cfg.group_size,
            step=h.step,
            pos=h.pos,
        )
        return [frame], time.perf_counter_ns() - t0, 0.0, 0.0
