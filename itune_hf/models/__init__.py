"""Captioning model families, one folder each, as in transformers' `models/` (configuration, modeling, processing).

`itune_hf.models.registry` is what the rest of the package uses to reach a family (its classes, how it is built for
training, what is saved); each family registers itself when its package is imported, and every built-in family is
imported here. Importing this package imports neither torch nor transformers.
"""

from . import clipcap, crossattn, ituning, xgpt  # noqa: F401  (registers the families)
from .registry import (
    DEFAULT_FAMILY,
    ModelFacts,
    ModelFamily,
    TrainingModel,
    families,
    family_of,
    get_family,
    register_family,
)

__all__ = [
    "DEFAULT_FAMILY",
    "ModelFacts",
    "ModelFamily",
    "TrainingModel",
    "families",
    "family_of",
    "get_family",
    "register_family",
]
