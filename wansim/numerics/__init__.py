"""Numerical helpers with no physics in them: a root finder, Student-t intervals, normal-law
functions from ``scipy.special`` (cheap to import)."""
