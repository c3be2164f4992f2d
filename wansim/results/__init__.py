"""What comes out: the result object, metric names and units, strict JSON, readable reports,
plots, and output-path checks."""
