"""The cross-attention baseline's application half (VisionEncoderDecoder-style cross-attention trained in a frozen
LM): `training.py` (for `itune train`) and `card.py`."""
