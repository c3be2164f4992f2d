"""Studies built on the engines: questions answered by running many scenarios, not physics.

- :mod:`wansim.studies.optimize`: the best configuration over a grid of fields (analytical,
  optionally confirmed by the DES) - ``wansim optimize``;
- :mod:`wansim.studies.approximation_error`: the measured error of the analytical
  approximations against the DES, written to ``docs/approximations.md``
  (``make approximations``).

Tree sizing (the bandwidth-aware tree budget) is a closed form of the analytical engine
(:mod:`wansim.analytical.tree_sizing`); the depth wall of async speculation is a figure
(``paper_figures/fig_depth_wall.py``) over the engines.
"""
