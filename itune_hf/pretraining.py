"""Moved to `itune_hf.training.pretraining`; re-exported here so that existing imports keep working."""

from .training.pretraining import *  # noqa: F403
from .training.pretraining import __all__  # noqa: F401
