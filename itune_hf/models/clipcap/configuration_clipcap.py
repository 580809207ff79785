"""Configuration of the ClipCap captioning baseline.

Copied next to a full checkpoint by ``register_for_auto_class`` so that the checkpoint loads with
``trust_remote_code=True`` where ``itune_hf`` is not installed: it imports only ``transformers`` and
``huggingface_hub``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

#: The two mapping networks of ClipCap (Mokady et al. 2021, section 3): an MLP with one hidden layer, or a
#: Transformer over the mapped image embedding and learned constant prefix tokens.
MAPPING_TYPES = ("mlp", "transformer")


@dataclass(frozen=True)
class ClipCapSettings:
    """The mapping network of a ClipCap model, as cards and logs list it.

    Args:
        mapping_type: One of `MAPPING_TYPES`.
        prefix_length: Prefix embeddings given to the LM (the paper: 10).
        clip_length: Transformer mapper: tokens the image embedding is mapped to (the paper: 10).
        mapper_num_layers: Transformer mapper: layers (the paper: 8).
        mapper_num_heads: Transformer mapper: attention heads (the paper: 8).
        mlp_hidden_size: MLP mapper: hidden width (the paper: half of prefix_length x LM width).
    """

    mapping_type: str
    prefix_length: int
    clip_length: int
    mapper_num_layers: int
    mapper_num_heads: int
    mlp_hidden_size: int

    def card_rows(self, model_config: Any) -> dict[str, Any]:
        """The settings as the card of a model with `model_config` (a `ClipCapConfig`) lists them."""
        rows: dict[str, Any] = {"mapping network": self.mapping_type, "prefix length": self.prefix_length}
        if self.mapping_type == "mlp":
            rows["MLP hidden width"] = self.mlp_hidden_size
        else:
            rows.update(
                {"mapped image tokens": self.clip_length, "mapper layers": self.mapper_num_layers,
                 "mapper heads": self.mapper_num_heads}
            )  # fmt: skip
        token_tower = isinstance(getattr(model_config.vision_config, "hidden_size", None), int)
        rows["image embedding"] = (
            "the vision tower's CLS state after its final layer norm" if token_tower else "its feature map's mean"
        )
        return rows


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
class ClipCapConfig(VisionTextConfig, PreTrainedConfig):
    r"""Configuration of [`ClipCapForCaptioning`]: a frozen vision tower, a frozen causal LM and a trainable mapping
    network turning the image embedding into `prefix_length` LM input embeddings (ClipCap, "frozen GPT-2" variant).

    Args:
        vision_config (`PreTrainedConfig` or `dict`, *optional*): The vision tower (defaults to CLIP ViT-B/16). Its
            CLS state after the final layer norm (CLIP's `pooler_output`) is the image embedding.
        text_config (`PreTrainedConfig` or `dict`, *optional*): The causal LM (defaults to GPT-2 base).
        mapping_type (`str`, defaults to `"mlp"`): `"mlp"` or `"transformer"` (`MAPPING_TYPES`).
        prefix_length (`int`, defaults to 10): Prefix embeddings given to the LM (the paper's 10).
        clip_length (`int`, defaults to 10): Transformer mapper: tokens the image embedding is linearly mapped to,
            attended together with `prefix_length` learned constant tokens (the paper's 10).
        mapper_num_layers (`int`, defaults to 8), mapper_num_heads (`int`, defaults to 8): Transformer mapper depth
            and heads (the paper's 8 and 8; pre-LayerNorm layers, MLP ratio 2, as in its code).
        mlp_hidden_size (`int`, *optional*): MLP mapper hidden width; defaults to `prefix_length * LM width // 2`
            (the paper's code).
        decoder_start_token_id, bos_token_id, eos_token_id, pad_token_id (`int`, *optional*): Special tokens;
            default to the LM's BOS/EOS.
    """

    model_type = "clipcap"
    sub_configs_defaults = {
        "vision_config": SubConfigSpec(
            config_class=AutoConfig, model_type="clip_vision_model", init_kwargs={"patch_size": 16}
        ),
        "text_config": SubConfigSpec(config_class=AutoConfig, model_type="gpt2"),
    }

    vision_config: dict | PreTrainedConfig | None = None
    text_config: dict | PreTrainedConfig | None = None
    mapping_type: str = "mlp"
    prefix_length: int = 10
    clip_length: int = 10
    mapper_num_layers: int = 8
    mapper_num_heads: int = 8
    mlp_hidden_size: int | None = None
    decoder_start_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
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
        if self.mlp_hidden_size is None:
            self.mlp_hidden_size = self.prefix_length * text.hidden_size // 2
        self.check_mapper()

    def check_mapper(self) -> None:
        """Check the mapping-network fields.

        Raises:
            ValueError: naming the offending field, its value and what would work.
        """
        if self.mapping_type not in MAPPING_TYPES:
            raise ValueError(f"mapping_type must be one of {MAPPING_TYPES}, got {self.mapping_type!r}")
        for name in ("prefix_length", "clip_length", "mapper_num_layers", "mapper_num_heads", "mlp_hidden_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        width = self.text_config.hidden_size
        if self.mapping_type == "transformer" and width % self.mapper_num_heads:
            raise ValueError(
                f"mapper_num_heads={self.mapper_num_heads} does not divide the LM width {width}: pick a divisor"
            )

    @property
    def settings(self) -> ClipCapSettings:
        """The mapping network of this config, as a `ClipCapSettings`."""
        return ClipCapSettings(
            self.mapping_type, self.prefix_length, self.clip_length, self.mapper_num_layers, self.mapper_num_heads,
            self.mlp_hidden_size,
        )  # fmt: skip


__all__ = ["MAPPING_TYPES", "ClipCapConfig", "ClipCapSettings"]
