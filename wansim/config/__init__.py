"""Configuration: the scenario schema and how user YAML becomes frozen dataclasses.

- :mod:`wansim.config.scenario`: the scenario dataclasses (README's scenario section), defaults,
  ``--set`` overrides, ``extends:`` and strict validation (``load_scenario``);
- :mod:`wansim.config.validation`: the generic strict parser the schema is declared with;
- :mod:`wansim.config.user_yaml`: reading YAML users wrote, with size and structure limits.
"""
