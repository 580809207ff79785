"""Moved to `itune_hf.models.ituning.images`; this module re-exports it so that existing imports keep working."""

from .models.ituning.images import *  # noqa: F403
from .models.ituning.images import __all__  # noqa: F401
