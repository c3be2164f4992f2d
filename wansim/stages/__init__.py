"""Pipeline stages as physics: how long a pass takes and what a stage holds.

- :mod:`wansim.stages.compute`: compute time of a stage pass and of the drafter (linear,
  roofline, MoE, table models);
- :mod:`wansim.stages.profiled_cost`: a stage's pass time from a calibration bundle's fitted
  costs;
- :mod:`wansim.stages.slowdown`: compute noise and intermittent stragglers;
- :mod:`wansim.stages.memory`: how many sequences fit in a stage's memory.
"""
