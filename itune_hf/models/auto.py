"""Auto-class registration: after `import itune_hf`, `AutoConfig`, `AutoModelForImageTextToText` and `AutoProcessor`
resolve the classes of every registered model family (`itune_hf.models`), and full checkpoints are saved with an
`auto_map` plus their code files, so they load with `trust_remote_code=True` where `itune_hf` is not installed."""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from . import ModelFamily, families
from .registry import on_register


def register_auto_classes() -> None:
    """Register the classes of every model family with the Auto factories (idempotent), and of every family
    registered later; and the vision towers the package defines (EfficientNet-Lite)."""
    register_vision_towers()
    for family in families().values():
        register_family_auto_classes(family)
    on_register(register_family_auto_classes)


def register_vision_towers() -> None:
    """Register EfficientNet-Lite (`itune_hf.models.efficientnet_lite`) with `AutoConfig`, `AutoModel` and
    `AutoModelForImageClassification`, so that its checkpoints load as any transformers vision model does."""
    from transformers import AutoModel, AutoModelForImageClassification

    from .efficientnet_lite.configuration_efficientnet_lite import EfficientNetLiteConfig
    from .efficientnet_lite.modeling_efficientnet_lite import (
        EfficientNetLiteForImageClassification,
        EfficientNetLiteModel,
    )

    AutoConfig.register(EfficientNetLiteConfig.model_type, EfficientNetLiteConfig, exist_ok=True)
    AutoModel.register(EfficientNetLiteConfig, EfficientNetLiteModel, exist_ok=True)
    AutoModelForImageClassification.register(
        EfficientNetLiteConfig, EfficientNetLiteForImageClassification, exist_ok=True
    )


def register_family_auto_classes(family: ModelFamily) -> None:
    """Register one family's config, model and processor classes with the Auto factories.

    Args:
        family: A registered model family.
    """
    config_class = family.load("config_class")
    model_class = family.load("model_class")
    processor_class = family.load("processor_class")
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    AutoModelForImageTextToText.register(config_class, model_class, exist_ok=True)
    AutoProcessor.register(config_class, processor_class, exist_ok=True)
    # Saving then writes auto_map and copies configuration/modeling/processing code next to the weights.
    config_class.register_for_auto_class()
    model_class.register_for_auto_class("AutoModelForImageTextToText")
    processor_class.register_for_auto_class("AutoProcessor")


__all__ = ["register_auto_classes", "register_family_auto_classes", "register_vision_towers"]
