"""I-Tuning's application half: `training.py` (a PEFT I-Tuning adapter on the bare model, for `itune train`),
`card.py` (what every I-Tuning model card says about the method) and `extensions.py` (adapter-only checkpoints and
offline backbones, plugged into the model's loading hooks)."""
