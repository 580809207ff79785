"""How `itune train` builds a cross-attention baseline: the model of a preset (`crossattn-*`), everything frozen but
the LM's cross-attention blocks (+ layer norms); saved as a full checkpoint (the family's `saves="full"`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...models.registry import TrainingModel, enable_activation_checkpointing

if TYPE_CHECKING:
    from ...training.config import TrainingConfig


def build_for_training(config: TrainingConfig) -> TrainingModel:
    """The model to train (only the cross-attention blocks require grad) and its processor.

    Args:
        config: The run's settings: `preset` (a crossattn preset), `pretrained`, `max_caption_length`.

    Raises:
        ValueError: without a crossattn preset, or with `--init-adapter`.
    """
    from ...presets import build_model, build_processor, get_preset

    if not config.preset:
        raise ValueError("The cross-attention baseline is built from a preset (crossattn-gpt2, ...): pass --preset")
    if getattr(config, "init_adapter", None):
        raise ValueError(f"--init-adapter loads an I-Tuning adapter; {config.preset} trains its cross-attention")
    preset = get_preset(config.preset)
    if preset.family_name != "crossattn":
        raise ValueError(f"Preset {config.preset!r} builds a {preset.family_name} model, not the crossattn baseline")
    model = build_model(config.preset, pretrained=config.pretrained)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(model)
    processor = build_processor(config.preset)
    processor.max_caption_length = config.max_caption_length
    return TrainingModel(
        model, model, processor, settings=model.config.settings, description="cross-attention parameters"
    )


__all__ = ["build_for_training"]
