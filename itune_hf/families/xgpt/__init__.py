"""XGPT's application half: `training.py` (the whole model from a preset, over images or precomputed regions, for
`itune train`) and `card.py` (what every XGPT model card says about the method)."""
