"""Moved to `itune_hf.training.config`; re-exported here so that existing imports keep working."""

from .training.config import *  # noqa: F403
from .training.config import __all__  # noqa: F401
