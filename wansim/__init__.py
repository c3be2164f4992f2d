"""wansim: how fast does a WAN pipeline-parallel LLM decode with speculative decoding?

Python API::

    import wansim
    sc = wansim.load_scenario("scenarios/v4pro-dspark-10stage-wan.yaml", ["speculation.k=5"])
    wansim.analyze(sc).metrics      # closed forms
    wansim.simulate(sc).metrics     # discrete-event simulation
"""

from __future__ import annotations

from wansim.config.scenario import Scenario, load_scenario, register_raw_resolver
from wansim.errors import WansimInputError

__all__ = ["Scenario", "WansimInputError", "analyze", "load_scenario", "simulate"]
__version__ = "0.1.0"


def _deployment_scenario_raw(raw: dict, base_dir):
    """A deployment file (``nodes`` + a model preset) as a plain scenario mapping."""
    from wansim.deploy.plan import deployment_scenario_raw

    return deployment_scenario_raw(raw, base_dir)


# the scenario loader stays at the bottom: the deployment layer is wired in here, above it
register_raw_resolver("nodes", _deployment_scenario_raw)


def analyze(scenario: Scenario):
    """Closed-form metrics for a scenario (``Result`` with ``.metrics`` and ``.to_frame()``)."""
    from wansim.analytical import analyze as _analyze

    return _analyze(scenario)


def simulate(scenario: Scenario, **options):
    """Discrete-event simulation of a scenario (``Result``)."""
    from wansim.sim import simulate as _simulate

    return _simulate(scenario, **options)
