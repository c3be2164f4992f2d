"""Configuration: the scenario schema and how user YAML becomes frozen dataclasses.

- :mod:`wansim.config.scenario`: the :class:`~wansim.config.scenario.Scenario` (README's
  scenario section), the checks between its sections and ``load_scenario``;
- one module per section: :mod:`~wansim.config.model` (compute, overheads, shared host, noise,
  stragglers, idle costs), :mod:`~wansim.config.network` (links, jitter, loss, tcp, drift),
  :mod:`~wansim.config.payload`, :mod:`~wansim.config.drafter` (and acceptance sources),
  :mod:`~wansim.config.speculation` (policy, K, verifier, trees),
  :mod:`~wansim.config.schedule`, :mod:`~wansim.config.workload`, :mod:`~wansim.config.faults`;
  :mod:`~wansim.config.limits` holds the limits they share;
- :mod:`wansim.config.raw`: the raw YAML mapping (``extends:``, anchored file fields, dotted
  paths, dataclasses back to YAML's shape); :mod:`wansim.config.overrides`: ``--set``;
- :mod:`wansim.config.validation`: the generic strict parser the schema is declared with;
- :mod:`wansim.config.user_yaml`: reading YAML users wrote, with size and structure limits.
"""
