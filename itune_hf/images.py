"""Moved to `itune_hf.models.ituning.images`; re-exported here so that existing imports keep working."""

from .models.ituning.images import *  # noqa: F403
from .models.ituning.images import __all__  # noqa: F401
