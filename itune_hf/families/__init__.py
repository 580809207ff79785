"""The application half of each model family: how `itune train` builds it (`training.py`), what its model cards say
(`card.py`) and, for I-Tuning, what the package plugs into the model (`extensions.py`).

`itune_hf/models/<family>/` holds the transformers model alone (the remote code of full checkpoints); its
`ModelFamily` names these modules by import path, so the model layer never imports them.
"""
