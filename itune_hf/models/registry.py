"""The registry of model families: what the model-agnostic parts of the package (training, evaluation, hub, cards,
presets, the CLI) need to know about a captioning model family, without importing it.

A family names its classes by import path (`"package.module:Name"`), so the registry is read without importing
torch or transformers; `ModelFamily.load` imports one on demand. Families register themselves in their package's
`__init__` (see `itune_hf/models/ituning/__init__.py`); `itune_hf.models` imports every built-in family.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import UnknownNameError

SAVES = ("adapter", "full")
EXPLAINS = ("patches", "regions", None)
#: The family of a preset, recipe or `itune train` run that names none.
DEFAULT_FAMILY = "ituning"


@dataclass(frozen=True)
class ModelFamily:
    """One family of captioning models and how the package builds, trains and saves it.

    Args:
        name: Family name, used by presets (`"family"` key) and `itune train --family`.
        model_type: The `model_type` of its configuration (what `AutoConfig` reads in `config.json`).
        description: One line for `--help` texts and listings.
        config_class: Import path of its `PreTrainedConfig` subclass.
        model_class: Import path of its `PreTrainedModel` (registered with `AutoModelForImageTextToText`).
        processor_class: Import path of its processor (registered with `AutoProcessor`).
        settings_class: Import path of the dataclass of its own settings (each field an `itune train` option of the
            same name, `None` meaning the preset's value), or None.
        build_for_training: Import path of `build(config: TrainingConfig) -> TrainingModel`: the model to train
            (only what should learn requires grad), the base it wraps, and the processor.
        saves: `"adapter"` (only the trained modules are saved; the frozen backbones are referenced) or `"full"`.
        save_adapter: Import path of `save(peft_model, directory, **save_kwargs)`, writing an adapter-only
            checkpoint that loads on its own (for `saves="adapter"`).
        display_name: How cards and logs name the family (e.g. "I-Tuning"); `name` when empty.
        card: Import path of its `itune_hf.hub.cards.FamilyCard` (what every model card says about the method);
            required.
        vision_states_input: The model's keyword for the frozen vision tower's last hidden state (what a feature
            cache holds): I-Tuning reads it as its `encoder_outputs`, XGPT as `vision_hidden_states`.
        explains: What `itune explain` and the demo page draw of the captioner's attention over the image, read with
            `output_attentions=True`: `"patches"` (attention over the vision tower's patch grid, as heatmaps; the
            model has `image_layers()` and `num_heads`), `"regions"` (attention over regions, as boxes; decoder
            layers and `num_attention_heads`), or None (explaining is refused).
        takes_vision_model: Whether its presets take other weights for their vision tower (`itune train --preset P
            --vision-model DIR`, e.g. a tower from `itune pretrain-vision`).
        unused_parameters: Whether some trainable parameters get no gradient in plain captioning (XGPT's
            encoder-text parameters serve only the pre-training tasks): distributed training must look for them.
        describe_preset: Import path of `describe(preset, config, model, overrides) -> list[str]`, what `itune
            params` prints about a preset before its trainable count; None: its backbones and settings.
        quantizes_frozen_lm: Whether its runs can load their frozen LM in 8 or 4 bits (`itune train --load-in`,
            `itune_hf.models.quantization`): the family builds a frozen LM whose linear layers do not train.
        retrieval_prompts: Whether its runs can train with retrieved captions as the LM's prompt (`itune train
            --retrieval`, `itune_hf.vision.datastore`): its LM reads a text prompt that the caption continues.
        onnx_graphs: Import path of its `itune_hf.onnx.graphs.FamilyGraphs` (the image side and one decoding step
            with its KV cache as ONNX graphs) when `itune export --format onnx` covers its captioners; None: refused.
        training_defaults: Optimisation settings that suit the family (keys of
            `itune_hf.training.config.TRAINING_DEFAULTS`: learning rate, warm-up, schedule, batch, weight decay,
            Adam's beta2), used where neither the command line, a recipe nor the preset sets them.
    """

    name: str
    model_type: str
    description: str
    config_class: str
    model_class: str
    processor_class: str
    settings_class: str | None
    build_for_training: str
    saves: Literal["adapter", "full"]
    save_adapter: str | None = None
    display_name: str = ""
    card: str | None = None
    vision_states_input: str = "encoder_outputs"
    explains: Literal["patches", "regions"] | None = None
    takes_vision_model: bool = False
    unused_parameters: bool = False
    describe_preset: str | None = None
    quantizes_frozen_lm: bool = False
    retrieval_prompts: bool = False
    onnx_graphs: str | None = None
    training_defaults: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.saves not in SAVES:
            raise ValueError(f"ModelFamily {self.name!r}: saves must be one of {SAVES}, got {self.saves!r}")
        if self.explains not in EXPLAINS:
            raise ValueError(f"ModelFamily {self.name!r}: explains must be one of {EXPLAINS}, got {self.explains!r}")
        if self.card is None:  # checked here, not when a trained model's card is written at the end of a run
            raise ValueError(
                f"ModelFamily {self.name!r}: name its card, an itune_hf.hub.cards.FamilyCard (what every model card "
                "says about the method: paper, citation, parts, beams), e.g. card='mypackage.card:CARD'"
            )
        if self.saves == "adapter" and self.save_adapter is None:
            raise ValueError(f"ModelFamily {self.name!r} saves adapters: name its save_adapter function")

    @property
    def exports_onnx(self) -> bool:
        """Whether `itune export --format onnx` covers its captioners."""
        return self.onnx_graphs is not None

    @property
    def title(self) -> str:
        """The family's display name."""
        return self.display_name or self.name

    def load(self, what: str) -> Any:
        """Import and return one of the family's objects.

        Args:
            what: `"config_class"`, `"model_class"`, `"processor_class"`, `"settings_class"`,
                `"build_for_training"`, `"save_adapter"`, `"card"` or `"onnx_graphs"`.
        """
        path = getattr(self, what)
        if path is None:
            raise ValueError(f"The model family {self.name!r} has no {what}")
        module, _, name = path.partition(":")
        return getattr(importlib.import_module(module), name)


@dataclass
class TrainingModel:
    """What a family's `build_for_training` returns.

    Args:
        model: The model to train; only the parameters that learn require grad (a `PeftModel` for adapters).
        base: The captioning model it wraps (the same object as `model` for families trained whole).
        processor: The processor of the model.
        settings: The family's settings the model was built with (for the card).
        description: What trains, for the log line (e.g. "I-Tuning parameters").
        region_features: The precomputed regions the model reads instead of images (an
            `itune_hf.data.RegionFeatures`, for XGPT with `visual_source="regions"`), or None: the run's batches and
            validation take them from here.
    """

    model: Any
    base: Any
    processor: Any
    settings: Any = None
    description: str = "parameters"
    region_features: Any = None
    trainable_parameters: int = field(init=False)  # how many parameters train, counted once

    def __post_init__(self) -> None:
        self.trainable_parameters = sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def facts(self) -> ModelFacts:
        """What cards and logs say about the model, holding no reference to it (a training run must be able to
        drop every reference to the model it trained)."""
        regions = self.region_features.describe() if self.region_features is not None else None
        return ModelFacts(self.base.config, self.trainable_parameters, self.settings, self.description, regions)


def enable_activation_checkpointing(model: Any) -> None:
    """Turn on activation (gradient) checkpointing in a transformers model, under the name its version has.

    transformers 5.23 renamed `gradient_checkpointing_enable` to `activation_checkpointing_enable` and kept the old
    name as an alias that raises a `FutureWarning`; the families' `build_for_training` call this, so
    `itune train --gradient-checkpointing` warns on no version.

    Args:
        model: A `PreTrainedModel`.
    """
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


@dataclass(frozen=True)
class ModelFacts:
    """What a card says about a trained model, without the model.

    Args:
        config: The config of the captioning model (the base, for adapters).
        trainable_parameters: How many parameters trained.
        settings: The family's settings (e.g. `ITuningSettings`), or None.
        description: What trains, for the log line.
        region_source: Where precomputed regions came from (`RegionFeatures.describe()`), for the card; None
            when the model reads images.
    """

    config: Any
    trainable_parameters: int
    settings: Any
    description: str
    region_source: str | None = None


_FAMILIES: dict[str, ModelFamily] = {}
_HOOKS: list[Callable[[ModelFamily], None]] = []


def on_register(hook: Callable[[ModelFamily], None]) -> None:
    """Call `hook(family)` for every family registered from now on (e.g. the Auto-class registration, for a family
    whose package is imported after transformers': a plug-in's).

    Args:
        hook: Called with each newly registered family.
    """
    if hook not in _HOOKS:
        _HOOKS.append(hook)


def register_family(family: ModelFamily) -> ModelFamily:
    """Add a family to the registry (idempotent for the same definition); returns it.

    Args:
        family: The family to register.

    Raises:
        ValueError: when another family already uses its name or model type.
    """
    for other in _FAMILIES.values():
        if other != family and (other.name == family.name or other.model_type == family.model_type):
            raise ValueError(f"A model family named {other.name!r} (model_type {other.model_type!r}) is registered")
    new = family.name not in _FAMILIES
    _FAMILIES[family.name] = family
    for hook in _HOOKS if new else ():
        hook(family)
    return family


def families() -> Mapping[str, ModelFamily]:
    """Every registered family, by name."""
    return dict(_FAMILIES)


def get_family(name: str) -> ModelFamily:
    """The family called `name`.

    Args:
        name: A registered family name (e.g. `"ituning"`).

    Raises:
        KeyError: naming the unknown family and the known ones.
    """
    if name not in _FAMILIES:
        raise UnknownNameError(f"Unknown model family {name!r}; known families: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[name]


def family_of(model_or_config: Any) -> ModelFamily:
    """The family of a model, a PEFT model wrapping one, or a config (by its `model_type`).

    Args:
        model_or_config: A `PreTrainedModel`, `PeftModel` or `PreTrainedConfig`.

    Raises:
        ValueError: when no registered family has that model type.
    """
    base = getattr(model_or_config, "get_base_model", None)
    target = base() if callable(base) else model_or_config
    config = getattr(target, "config", target)
    model_type = getattr(config, "model_type", None)
    for family in _FAMILIES.values():
        if family.model_type == model_type:
            return family
    raise ValueError(
        f"{type(model_or_config).__name__} (model_type {model_type!r}) is not a captioning model of a registered "
        f"family ({', '.join(f'{f.name}: {f.model_type}' for f in _FAMILIES.values())})"
    )


__all__ = [
    "DEFAULT_FAMILY",
    "ModelFacts",
    "ModelFamily",
    "TrainingModel",
    "enable_activation_checkpointing",
    "families",
    "family_of",
    "get_family",
    "on_register",
    "register_family",
]
