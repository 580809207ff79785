"""How `itune train` builds an XGPT model: the whole model of a preset, every parameter trained except the frozen
vision tower, saved as a full checkpoint (the family's `saves="full"`).

The run may override the preset's architecture switches (`XGPTSettings`: `architecture`, `use_aoa_refiner`,
`encoder_signal`) through `TrainingConfig` fields of the same names, when the command defines them, and its visual
input (`visual_source`; `region_features`: precomputed regions, no vision tower); I-Tuning's settings and adapters do
not apply and are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...models.registry import TrainingModel, enable_activation_checkpointing

if TYPE_CHECKING:
    from ...training.config import TrainingConfig


def setting_overrides(config: TrainingConfig) -> dict[str, Any]:
    """The XGPT settings the run sets explicitly (`None`: keep the preset's).

    Args:
        config: The run's settings.
    """
    return config.setting_overrides("xgpt")


def check_training_config(config: TrainingConfig) -> None:
    """Refuse run settings that an XGPT run cannot honour.

    Args:
        config: The run's settings.

    Raises:
        ValueError: naming the settings and what to do instead.
    """
    if not config.preset:
        raise ValueError(
            "XGPT is built from a preset (xgpt-base, xgpt-tiny, ...): pass --preset; it has no pretrained text model "
            "to name with --vision-model/--text-model"
        )
    foreign = config.foreign_settings("xgpt")
    if foreign:
        raise ValueError(
            f"{', '.join('--' + n.replace('_', '-') for n in foreign)}: I-Tuning adapter settings, which "
            f"the XGPT preset {config.preset!r} does not have; drop them"
        )
    if getattr(config, "init_adapter", None):
        raise ValueError(f"--init-adapter loads an I-Tuning adapter; the XGPT preset {config.preset!r} trains whole")


def visual_overrides(config: TrainingConfig) -> tuple[dict[str, Any], Any]:
    """The config fields the run's visual input sets, and the precomputed regions it reads (None without).

    `visual_source` replaces the preset's; `region_features` (implying `"regions"`) are opened here, and the model is
    built without a vision tower, its `region_feature_size` the files' feature width.

    Args:
        config: The run's settings (`visual_source`, `region_features`).

    Raises:
        FileNotFoundError, itune_hf.data.DataError: the region features cannot be read.
    """
    source = config.chosen_visual_source
    if source is None:
        return {}, None
    if source != "regions":
        return {"visual_source": source}, None
    from ...data.regions import RegionFeatures

    regions = RegionFeatures(config.region_features)
    return {"visual_source": "regions", "region_feature_size": regions.feature_size}, regions


def load_initial_weights(model, directory: str) -> None:
    """Load an XGPT model directory's weights (`--init-model`: a pre-training stage's model, or the average of its
    top checkpoints) into `model`, built from the same preset.

    Args:
        model: The freshly built `XGPTForCaptioning`.
        directory: A directory with `model.safetensors` (itune train's or itune average-checkpoints' output).

    Raises:
        FileNotFoundError: no weights there.
        ValueError: weights of another model (missing, extra or differently shaped trainable weights).
    """
    from pathlib import Path

    from safetensors.torch import load_file

    from ...utils.numbers import check_finite

    files = sorted(Path(directory).glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"--init-model {directory}: no model.safetensors there (pass an XGPT model directory: the output of "
            "itune train or itune average-checkpoints)"
        )
    state = {}
    for file in files:
        state.update(load_file(file))
    check_finite(state, f"--init-model {directory}", "that run diverged: start from a model trained without NaNs")
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # a shape mismatch: another preset's weights
        raise ValueError(f"--init-model {directory}: its weights do not fit the preset's model ({error})") from None
    missing = [name for name in missing if name in trainable and not name.startswith("lm_head.")]  # lm_head: tied
    if missing or unexpected:
        raise ValueError(
            f"--init-model {directory}: weights of another model (missing {missing[:3]}, unexpected {unexpected[:3]}); "
            "start from a model of the same preset"
        )
    model.freeze_vision_tower()


def build_for_training(config: TrainingConfig) -> TrainingModel:
    """The XGPT model to train (all parameters but the vision tower's require grad) and its processor.

    Args:
        config: The run's settings: `preset` (an xgpt preset), `pretrained` (load the preset's real vision tower),
            `max_caption_length` (at most the model's 60 positions), `gradient_checkpointing`, the `XGPTSettings`
            overrides it defines, and the visual input (`visual_source`, `region_features`: see `visual_overrides`).

    Raises:
        ValueError: for settings that do not apply to XGPT, or a caption budget beyond the model's positions.
    """
    from ...presets import build_model, build_processor, get_preset

    check_training_config(config)
    preset = get_preset(config.preset)
    if preset.family_name != "xgpt":
        raise ValueError(f"Preset {config.preset!r} builds a {preset.family_name} model, not XGPT")
    visual, regions = visual_overrides(config)
    model = build_model(config.preset, pretrained=config.pretrained, **setting_overrides(config), **visual)
    if model.config.visual_source == "regions" and regions is None:
        raise ValueError(f"The preset {config.preset!r} reads precomputed regions: pass --region-features PATH")
    limit = model.config.max_position_embeddings
    if config.max_caption_length > limit:
        raise ValueError(
            f"max_caption_length={config.max_caption_length} exceeds the model's {limit} text positions (the "
            f"paper's maximum text length); use --max-caption-length {limit} or less"
        )
    if config.init_model:
        load_initial_weights(model, config.init_model)
    if config.gradient_checkpointing:  # every trained layer recomputes its activations in the backward pass
        enable_activation_checkpointing(model)
    processor = build_processor(config.preset)
    processor.max_caption_length = config.max_caption_length
    return TrainingModel(
        model=model, base=model, processor=processor, settings=model.config.settings, region_features=regions
    )


__all__ = [
    "build_for_training",
    "check_training_config",
    "load_initial_weights",
    "setting_overrides",
    "visual_overrides",
]
