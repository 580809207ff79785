"""Configuration of the I-Tuning captioning model.

This file is copied next to a full checkpoint by ``register_for_auto_class`` so that the checkpoint loads with
``trust_remote_code=True`` where ``itune_hf`` is not installed: it imports only ``transformers``,
``huggingface_hub`` and its sibling ``settings`` file.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .settings import ITUNING_INITS, LEGACY_CONFIG_NAMES, ITuningSettings


# Copied from itune_hf.models._shared.configuration.VisionTextConfig
class VisionTextConfig:
    """`from_vision_text_configs` for a config holding a `vision_config` and a `text_config`."""

    @classmethod
    def from_vision_text_configs(
        cls, vision_config: PreTrainedConfig, text_config: PreTrainedConfig, **kwargs
    ) -> PreTrainedConfig:
        """Build a config from a vision-tower config and an LM config.

        Args:
            vision_config: Config of the vision tower (a full CLIP/SigLIP config is reduced to its `vision_config`).
            text_config: Config of the causal LM.
            **kwargs: The config's other fields (the family's settings) and special tokens, as in its docstring.
        """
        vision_config = getattr(vision_config, "vision_config", None) or vision_config
        return cls(vision_config=vision_config.to_dict(), text_config=text_config.to_dict(), **kwargs)


@strict
class ITuningConfig(VisionTextConfig, PreTrainedConfig, ITuningSettings):
    r"""Configuration of [`ITuningForCaptioning`]: a frozen vision tower, a frozen causal LM and the I-Tuning modules.

    Args:
        vision_config (`PreTrainedConfig` or `dict`, *optional*):
            Config of the vision tower (CLIP vision, SigLIP vision, or any `AutoModel` vision model whose output has
            `last_hidden_state`). Defaults to a CLIP ViT-B/16 vision config.
        text_config (`PreTrainedConfig` or `dict`, *optional*):
            Config of the decoder-only LM (GPT-2, Llama, ...). Defaults to GPT-2 base.
        bottleneck_dim, num_heads, scale, attention_scale, first_layer, init, dropout, visual_tokens, final_norm:
            The I-Tuning settings, defined (with their defaults and checks) by [`ITuningSettings`]: the same names
            in the PEFT adapter config, `itune train` and the recipes. Configs saved with the former names
            (`ituning_num_heads`, `ituning_first_layer`, ...) still load.
        add_ituning_modules (`bool`, defaults to `True`):
            Whether the model carries its own I-Tuning modules. `False` gives the bare frozen backbones, the base that
            a PEFT I-Tuning adapter is attached to.
        decoder_start_token_id, bos_token_id, eos_token_id, pad_token_id (`int`, *optional*):
            Special tokens; default to the LM's BOS/EOS (GPT-2 has no pad token, EOS is used).
    """

    model_type = "ituning"
    attribute_map = LEGACY_CONFIG_NAMES  # `config.ituning_first_layer` reads and writes `config.first_layer`
    sub_configs_defaults = {
        "vision_config": SubConfigSpec(
            config_class=AutoConfig,
            model_type="clip_vision_model",
            init_kwargs={"patch_size": 16, "projection_dim": 512},
        ),
        "text_config": SubConfigSpec(config_class=AutoConfig, model_type="gpt2"),
    }

    vision_config: dict | PreTrainedConfig | None = None
    text_config: dict | PreTrainedConfig | None = None
    add_ituning_modules: bool = True
    decoder_start_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        for legacy, name in LEGACY_CONFIG_NAMES.items():  # configs saved before the settings had one naming scheme
            if legacy in kwargs:
                setattr(self, name, kwargs.pop(legacy))
        super().__post_init__(**kwargs)
        text = self.text_config
        if self.bos_token_id is None:
            self.bos_token_id = getattr(text, "bos_token_id", None)
        if self.eos_token_id is None:
            self.eos_token_id = getattr(text, "eos_token_id", None)
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.bos_token_id
        if self.pad_token_id is None:
            pad = getattr(text, "pad_token_id", None)
            eos = self.eos_token_id[0] if isinstance(self.eos_token_id, list) else self.eos_token_id
            self.pad_token_id = pad if pad is not None else eos
        self.check_settings()
        if self.add_ituning_modules:
            self.ituning_layers  # noqa: B018  (raises when first_layer leaves the LM without a module)

    @property
    def settings(self) -> ITuningSettings:
        """The I-Tuning settings of this config, as an `ITuningSettings`."""
        return ITuningSettings.from_object(self)

    @property
    def resolved_bottleneck_dim(self) -> int:
        """The bottleneck width actually used: `bottleneck_dim`, or half the LM width."""
        return self.settings.resolved_bottleneck_dim(self.text_config.hidden_size)

    @property
    def ituning_layers(self) -> list[int]:
        """Indices of the LM layers that carry a native I-Tuning module (empty for a bare base)."""
        if not self.add_ituning_modules:
            return []
        try:
            return self.settings.layers(self.text_config.num_hidden_layers)
        except ValueError as error:
            raise ValueError(
                f"{error} ({self.text_config.model_type}), or add_ituning_modules=False for a bare base model"
            ) from None


__all__ = ["ITUNING_INITS", "ITuningConfig", "ITuningSettings"]
