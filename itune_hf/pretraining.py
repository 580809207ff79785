"""Moved to `itune_hf.training.pretraining`: this name is that module (every name, monkeypatching included), so that
existing imports keep working."""

import sys

from .training import pretraining as _moved

sys.modules[__name__] = _moved
