"""Moved to `itune_hf.training.averaging`; re-exported here so that existing imports keep working."""

from .training.averaging import *  # noqa: F403
from .training.averaging import __all__  # noqa: F401
