"""Auto-class registration: after `import itune_hf`, `AutoConfig`, `AutoModelForImageTextToText` and `AutoProcessor`
resolve the I-Tuning classes, and full checkpoints are saved with an `auto_map` plus their code files, so they load
with `trust_remote_code=True` where `itune_hf` is not installed."""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from .configuration_ituning import ITuningConfig
from .modeling_ituning import ITuningForCaptioning
from .processing_ituning import ITuningProcessor


def register_auto_classes() -> None:
    """Register the I-Tuning classes with the Auto factories (idempotent)."""
    AutoConfig.register(ITuningConfig.model_type, ITuningConfig, exist_ok=True)
    AutoModelForImageTextToText.register(ITuningConfig, ITuningForCaptioning, exist_ok=True)
    AutoProcessor.register(ITuningConfig, ITuningProcessor, exist_ok=True)
    # Saving then writes auto_map and copies configuration/modeling/processing code next to the weights.
    ITuningConfig.register_for_auto_class()
    ITuningForCaptioning.register_for_auto_class("AutoModelForImageTextToText")
    ITuningProcessor.register_for_auto_class("AutoProcessor")


__all__ = ["register_auto_classes"]
