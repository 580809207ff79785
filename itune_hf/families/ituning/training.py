"""How `itune train` builds an I-Tuning model: a PEFT I-Tuning adapter on the bare captioning model (frozen
backbones, no native modules), so that only the adapter trains and only the adapter is saved.

The adapter's settings are the base's (its preset's, e.g. I-Tuning Dropping's `first_layer`) with the run's
overrides applied (`itune train --num-heads 2`, a recipe's `attention_scale: 1.0`), resolved and checked once by
`ITuningSettings`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...models.ituning.settings import ITuningSettings
from ...models.registry import TrainingModel, enable_activation_checkpointing

if TYPE_CHECKING:
    from ...training.config import TrainingConfig


def setting_overrides(config: TrainingConfig) -> dict[str, Any]:
    """The I-Tuning settings the run sets explicitly (`None`: keep the preset's).

    Args:
        config: The run's settings.
    """
    return config.setting_overrides("ituning")


def adapter_config(config: TrainingConfig, base_config: Any):
    """The `ITuningAdapterConfig` of a run: the base's settings with the run's overrides.

    Args:
        config: The run's settings.
        base_config: The `ITuningConfig` of the bare base model (it carries the preset's settings).
    """
    from ...adapter import ITuningAdapterConfig

    settings = ITuningSettings.from_object(base_config, **setting_overrides(config))
    return ITuningAdapterConfig(**settings.as_dict())


def build_base(config: TrainingConfig):
    """The bare captioning model (frozen backbones, no modules) and its processor, from a preset or two backbones;
    with `load_in`, its frozen LM quantised (`itune_hf.models.quantization`).

    Args:
        config: The run's settings (`preset`, optionally with `vision_model` weights for its vision tower; or
            `vision_model` and `text_model`; `load_in`).
    """
    from ...models.ituning.modeling_ituning import ITuningForCaptioning
    from ...models.ituning.processing_ituning import ITuningProcessor
    from ...presets import build_model, build_processor

    if config.preset:
        base = build_model(
            config.preset, pretrained=config.pretrained, vision_model=config.vision_model, add_ituning_modules=False
        )
        processor = build_processor(config.preset)
    else:
        base = ITuningForCaptioning.from_vision_text_pretrained(
            config.vision_model, config.text_model, add_ituning_modules=False
        )
        processor = ITuningProcessor.from_vision_text_pretrained(config.vision_model, config.text_model)
    processor.max_caption_length = config.max_caption_length
    if config.load_in:  # before PEFT wraps the LM's blocks: only the frozen LM's own layers are quantised
        from ...models.quantization import quantize_frozen_lm

        quantize_frozen_lm(base, config.load_in)
    return base, processor


def build_for_training(config: TrainingConfig) -> TrainingModel:
    """The PEFT model to train (only the adapter requires grad), its base and processor.

    With `init_adapter` (or `init_model`, a trained run's directory), the adapter starts from that adapter's
    settings and weights (fine-tuning after VLP, SCST after cross-entropy); setting overrides are then refused, since
    they would not match the weights.

    Args:
        config: The run's settings.
    """
    from peft import PeftConfig, get_peft_model

    base, processor = build_base(config)
    base.vision_model.requires_grad_(False)
    if config.gradient_checkpointing:  # before PEFT wraps the model, which prepares it for checkpointing
        enable_activation_checkpointing(base)
    start_from, flag = starting_adapter(config)
    if start_from:
        if setting_overrides(config):
            raise ValueError(
                f"{flag} {start_from} brings its own I-Tuning settings; drop "
                f"{', '.join('--' + n.replace('_', '-') for n in setting_overrides(config))}"
            )
        start = PeftConfig.from_pretrained(start_from)  # the adapter's own settings (e.g. after VLP)
        start.inference_mode = False  # saved adapters say inference mode; this one is trained on
        model = get_peft_model(base, start)
        load_adapter_weights(model, start_from, flag)
    else:
        model = get_peft_model(base, adapter_config(config, base.config))
    settings = model.peft_config["default"].settings
    quantized = getattr(base.language_model, "itune_quantization", None)
    description = "I-Tuning parameters" + (f" ({quantized.describe()})" if quantized is not None else "")
    return TrainingModel(model, base, processor, settings=settings, description=description)


def starting_adapter(config: TrainingConfig) -> tuple[str | None, str]:
    """The adapter a run starts from and the option that named it: `--init-adapter`, or `--init-model` (a trained
    run's output directory, which holds its adapter); `(None, "")` for a fresh adapter.

    Args:
        config: The run's settings.

    Raises:
        ValueError: both options given, or an `--init-model` directory without an adapter.
    """
    from pathlib import Path

    if config.init_adapter and config.init_model:
        raise ValueError(
            f"--init-adapter {config.init_adapter} and --init-model {config.init_model} both name the adapter to "
            "start from: pass one"
        )
    if config.init_adapter:
        return config.init_adapter, "--init-adapter"
    if not config.init_model:
        return None, ""
    if not (Path(config.init_model) / "adapter_config.json").is_file():
        raise ValueError(
            f"--init-model {config.init_model}: no adapter_config.json there; pass the output directory of an itune "
            "train run of an I-Tuning preset (it holds the run's best adapter)"
        )
    return config.init_model, "--init-model"


def load_adapter_weights(model, adapter_dir: str, flag: str = "--init-adapter") -> None:
    """Load an adapter's weights into the (single, default) adapter of `model`, refusing a partial load.

    Args:
        model: A `PeftModel` with one I-Tuning adapter.
        adapter_dir: Directory (or Hub repo) of an adapter-only checkpoint.
        flag: The option that named it, for the messages.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from ...adapter.convert import ADAPTER_WEIGHTS_NAME, find_adapter_file
    from ...utils.numbers import check_finite

    path = find_adapter_file(adapter_dir, ADAPTER_WEIGHTS_NAME)
    if path is None:
        raise FileNotFoundError(f"{flag} {adapter_dir}: no {ADAPTER_WEIGHTS_NAME} there")
    weights = load_file(str(path))
    check_finite(weights, f"{flag} {path}", "that run diverged: start from an adapter trained without NaNs")
    result = set_peft_model_state_dict(model, weights)
    missing = [k for k in result.missing_keys if ".ituning_modules." in k]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{flag} {adapter_dir} does not fit this model (another preset's adapter?): missing {missing[:3]}, "
            f"unexpected {list(result.unexpected_keys)[:3]}"
        )


__all__ = [
    "adapter_config",
    "build_base",
    "build_for_training",
    "load_adapter_weights",
    "setting_overrides",
    "starting_adapter",
]
