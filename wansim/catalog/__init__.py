"""Catalogs: models (from their config.json) and GPUs (from datasheets), every figure sourced."""
