"""`wansim calibrate`: real runs vs the DES and the analytical engine (see wansim.calibrate.run)."""
