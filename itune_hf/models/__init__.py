"""Captioning model families, one folder each, as in transformers' `models/` (configuration, modeling, processing).

`itune_hf.models.registry` is what the rest of the package uses to reach a family (its classes, how it is built for
training, what is saved); each family registers itself when its package is imported, and every built-in family is
imported here. Importing this package imports neither torch nor transformers.
"""

from . import clipcap, crossattn, ituning, xgpt  # noqa: F401  (registers the families)
from .registry import *  # noqa: F403  (the registry's names are this package's API)
from .registry import __all__  # noqa: F401
