"""Moved to `itune_hf.training.checkpoints`: this name is that module (every name, monkeypatching included), so that
existing imports keep working."""

import sys

from .training import checkpoints as _moved

sys.modules[__name__] = _moved
