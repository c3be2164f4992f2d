"""Discrete-event engine (SimPy): stages, links, verifier, requests; never imports analytical."""

from wansim.sim.engine import check_supported, simulate

__all__ = ["check_supported", "simulate"]
