"""Moved to `itune_hf.training.checkpoints`; re-exported here so that existing imports keep working."""

from .training.checkpoints import *  # noqa: F403
from .training.checkpoints import __all__  # noqa: F401
