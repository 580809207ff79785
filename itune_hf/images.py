"""Moved to `itune_hf.models._shared.images`; re-exported here so that existing imports keep working."""

from .models._shared.images import *  # noqa: F403
from .models._shared.images import __all__  # noqa: F401
