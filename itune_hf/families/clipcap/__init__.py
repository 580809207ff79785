"""The ClipCap baseline's application half: `training.py` (the mapper on frozen backbones, for `itune train`) and
`card.py`."""
