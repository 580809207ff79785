"""Tools around the frozen vision tower: what a model reads of each image (`inputs.py`), the tower's feature cache
(`feature_cache.py`, `itune cache-features`), pre-training a small tower on the synthetic world (`pretraining.py`,
`itune pretrain-vision`), and the nearest-neighbour caption retrieval baseline over the cached features
(`retrieval.py`)."""
