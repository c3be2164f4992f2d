"""Analytical engine: closed forms, vectorised over parameter grids (never imports simpy)."""

from wansim.analytical.engine import analyze, check_supported
from wansim.analytical.grid import evaluate_grid

__all__ = ["analyze", "check_supported", "evaluate_grid"]
