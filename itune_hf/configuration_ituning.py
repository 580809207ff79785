"""Moved to `itune_hf.models.ituning.configuration_ituning`; re-exported here so that existing imports keep working."""

from .models.ituning.configuration_ituning import *  # noqa: F403
from .models.ituning.configuration_ituning import __all__  # noqa: F401
