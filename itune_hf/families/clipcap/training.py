"""How `itune train` builds a ClipCap model: the vision tower and the LM frozen, only the mapping network trains;
saved as a full checkpoint (the family's `saves="full"`).

From a preset (`clipcap-mlp-*`, `clipcap-transformer-*`: the mapper is the preset's), or from two backbones
(`--family clipcap --vision-model ... --text-model ...`, MLP mapper). I-Tuning and XGPT options are refused by
`itune_hf.training.build_training_model` before this runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...models.registry import TrainingModel, enable_activation_checkpointing

if TYPE_CHECKING:
    from ...training.config import TrainingConfig


def _from_backbones(config: TrainingConfig):
    """The model and processor from `vision_model` and `text_model` references (MLP mapper)."""
    from transformers import AutoModelForCausalLM

    from ...models._shared.backbones import load_vision_tower, resolve_reference
    from ...models.clipcap.configuration_clipcap import ClipCapConfig
    from ...models.clipcap.modeling_clipcap import ClipCapForCaptioning
    from ...models.ituning.processing_ituning import ITuningProcessor

    vision = load_vision_tower(resolve_reference(config.vision_model))
    text = AutoModelForCausalLM.from_pretrained(resolve_reference(config.text_model))
    model_config = ClipCapConfig.from_vision_text_configs(vision.config, text.config)
    model_config.vision_config._name_or_path = config.vision_model
    model_config.text_config._name_or_path = config.text_model
    model = ClipCapForCaptioning(model_config, vision_model=vision, language_model=text)
    return model, ITuningProcessor.from_vision_text_pretrained(config.vision_model, config.text_model)


def build_for_training(config: TrainingConfig) -> TrainingModel:
    """The ClipCap model to train (only the mapper requires grad) and its processor.

    Args:
        config: The run's settings: `preset` (a clipcap preset) or `vision_model` and `text_model`; `pretrained`;
            `max_caption_length`.

    Raises:
        ValueError: for a preset of another family or an `--init-adapter` (ClipCap has no adapter to start from).
    """
    from ...presets import build_model, build_processor, get_preset

    if getattr(config, "init_adapter", None):
        raise ValueError(f"--init-adapter loads an I-Tuning adapter; ClipCap ({config.preset}) trains its own mapper")
    if config.preset:
        preset = get_preset(config.preset)
        if preset.family_name != "clipcap":
            raise ValueError(f"Preset {config.preset!r} builds a {preset.family_name} model, not ClipCap")
        model, processor = build_model(config.preset, pretrained=config.pretrained), build_processor(config.preset)
    else:
        model, processor = _from_backbones(config)
    model.freeze_backbones()
    if config.gradient_checkpointing:  # the frozen LM's activations: the mapper's gradients pass back through it
        enable_activation_checkpointing(model)
    processor.max_caption_length = config.max_caption_length
    return TrainingModel(
        model, model, processor, settings=model.config.settings, description="ClipCap mapping-network parameters"
    )


__all__ = ["build_for_training"]
