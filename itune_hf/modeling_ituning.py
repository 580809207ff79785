"""Moved to `itune_hf.models.ituning.modeling_ituning`; re-exported here so that existing imports keep working."""

from .models.ituning.modeling_ituning import *  # noqa: F403
from .models.ituning.modeling_ituning import __all__  # noqa: F401
