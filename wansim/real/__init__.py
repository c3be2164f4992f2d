"""Real execution path: an actual target split into stage processes, an actual drafter, lossless
verification, emulated WAN links; records ground truth for calibrating the simulator.

Modules (one concept each; only this package imports torch, and only where it must):
``config`` (run settings), ``frames`` (wire format), ``codec`` (activation quantization),
``link`` (link emulator relay + accuracy), ``model`` (checkpoint loading, stage shards),
``speculative`` (drafter, verification rules, in-process reference), ``worker`` (stage
processes), ``runner`` (orchestration: :class:`~wansim.real.runner.Pipeline`, ``run_real``),
``recording`` (trace, compute table, link timings, summary), ``prompts``, ``experiments``,
``train_tiny`` (the tiny pair). Importing this package imports nothing heavy.
"""
