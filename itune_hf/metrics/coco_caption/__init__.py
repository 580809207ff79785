"""The `evaluate` metric module: `evaluate.load(itune_hf.metrics.EVALUATE_MODULE_DIR)` (works offline)."""
