"""Renamed `itune_hf.packaged_backbones`: this name is that module (every name, monkeypatching included), so
that existing imports keep working."""

import sys

from . import packaged_backbones as _moved

sys.modules[__name__] = _moved
