"""Renamed `itune_hf.feature_cache`: this name is that module (every name, monkeypatching included), so that existing
imports keep working."""

import sys

from . import feature_cache as _moved

sys.modules[__name__] = _moved
