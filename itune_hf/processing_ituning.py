"""Moved to `itune_hf.models.ituning.processing_ituning`; re-exported here so that existing imports keep working."""

from .models.ituning.processing_ituning import *  # noqa: F403
from .models.ituning.processing_ituning import __all__  # noqa: F401
