"""Configuration of the XGPT captioning model.

This file is copied next to a full checkpoint by ``register_for_auto_class`` so that the checkpoint loads with
``trust_remote_code=True`` where ``itune_hf`` is not installed: it imports only ``transformers``,
``huggingface_hub`` and its sibling ``settings`` and ``backbones`` files.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .backbones import gives_feature_map, vision_width
from .settings import ARCHITECTURES, ENCODER_SIGNALS, VISUAL_SOURCES, XGPTSettings

#: The vision tower used when a config names none (CLIP ViT-B/16, as in the I-Tuning presets).
DEFAULT_VISION_CONFIG = {"model_type": "clip_vision_model", "patch_size": 16, "projection_dim": 512}

#: Width of bottom-up-attention Faster R-CNN region features (the detector XGPT's regions come from).
DEFAULT_REGION_FEATURE_SIZE = 2048


@strict
class XGPTConfig(PreTrainedConfig, XGPTSettings):
    r"""Configuration of [`XGPTForCaptioning`] (Xia et al., "XGPT: Cross-modal Generative Pre-Training for Image
    Captioning", sections 3-4, appendix A).

    The paper's model: regions, each a feature concatenated with its 5-d position (normalised x1, y1, x2, y2 and the
    fraction of the image it covers), linearly projected to `hidden_size`, refined by one AoA layer, encoded by a
    Transformer whose parameters the decoder shares (`architecture="encdec_share"`). Its decoder attends to the
    encoder memory and to the caption prefix in **one** attention: keys/values are [memory; caption prefix], the
    caption part under a causal mask, and a learned signal marks the memory's keys/values (the paper says only that
    there is "a signal"; `encoder_signal` chooses its form, `"key_value"` by default: a learned vector added to the
    memory keys and another to the memory values, per layer). Layers are post-LayerNorm (BERT/Vaswani et al.), GELU.

    Args:
        architecture, use_aoa_refiner, encoder_signal, region_feature_norm:
            The switches the paper ablates (and one it does not have), defined (with their defaults and checks) by
            [`XGPTSettings`].
        vision_config (`PreTrainedConfig` or `dict`, *optional*):
            Config of the frozen vision tower whose last hidden state gives the regions (`visual_source` `"grid"` or
            `"boxes"`); defaults to CLIP ViT-B/16. A ViT-style tower's patch tokens, or a convolutional tower's
            feature map (ResNet, ConvNeXt: `hidden_sizes`), whose cells are read as patches. Must be `None` for
            `visual_source="regions"`.
        visual_source (`str`, defaults to `"grid"`):
            One of `VISUAL_SOURCES`: `"grid"` (patch tokens pooled to a grid), `"boxes"` (patch tokens mean-pooled
            inside the boxes passed as `region_boxes`), `"regions"` (precomputed `region_features`).
        grid_size (`int`, *optional*, defaults to 10):
            `"grid"`: the patch grid is mean-pooled (area-weighted) to `grid_size` x `grid_size` cells, 10 x 10 = the
            paper's 100 regions; `None` keeps one region per patch.
        use_cls_region (`bool`, defaults to `True`):
            With a vision tower: its first (CLS) token is one more region, with the whole-image box (0, 0, 1, 1, 1),
            placed first; a convolutional tower has no CLS token, and the mean of its feature map (ResNet's pooled
            output) takes its place. `False` drops it.
        region_feature_size (`int`, *optional*):
            Width of a region feature before the projection; defaults to the vision tower's width (`hidden_size`,
            or a convolutional tower's last `hidden_sizes`), or 2048
            (bottom-up-attention features) for `visual_source="regions"`.
        vocab_size (`int`, defaults to 50257): Size of the BPE vocabulary (GPT-2's; the paper's own Wikipedia BPE is
            not available).
        hidden_size (`int`, defaults to 768), num_hidden_layers (`int`, defaults to 12: Base; Tiny has 6),
        num_attention_heads (`int`, defaults to 8, as printed: 96 per head), intermediate_size (`int`, defaults to
        3072), hidden_act (`str`, defaults to `"gelu"`):
            The Transformer (paper 4.2, 5.3).
        hidden_dropout_prob, attention_probs_dropout_prob (`float`, defaults to 0.1): Dropout (paper 5.3).
        max_position_embeddings (`int`, defaults to 60): Longest decoder sequence, BOS included (the paper's maximum
            text length, A.2); generation stops there.
        initializer_range (`float`, defaults to 0.02), layer_norm_eps (`float`, defaults to 1e-12): As in BERT.
        decoder_start_token_id, bos_token_id, eos_token_id, pad_token_id (`int`, *optional*):
            Special tokens; default to GPT-2's `<|endoftext|>` (50256) for all four.
        tie_word_embeddings (`bool`, defaults to `True`): The LM head reuses the token embeddings.
    """

    model_type = "xgpt"
    sub_configs_defaults = {
        "vision_config": SubConfigSpec(
            config_class=AutoConfig, model_type="clip_vision_model", init_kwargs=DEFAULT_VISION_CONFIG, optional=True
        ),
    }

    vision_config: dict | PreTrainedConfig | None = None
    visual_source: str = "grid"
    grid_size: int | None = 10
    use_cls_region: bool = True
    region_feature_size: int | None = None
    vocab_size: int = 50257
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 60
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    decoder_start_token_id: int | None = None
    bos_token_id: int | None = 50256
    eos_token_id: int | list[int] | None = 50256
    pad_token_id: int | None = 50256
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        if self.vision_config is None and self.visual_source != "regions":
            self.vision_config = dict(DEFAULT_VISION_CONFIG)
        super().__post_init__(**kwargs)
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.bos_token_id
        if self.region_feature_size is None:
            self.region_feature_size = (
                DEFAULT_REGION_FEATURE_SIZE if self.vision_config is None else vision_width(self.vision_config)
            )
        self.check_settings()
        self.check_model()

    def check_model(self) -> None:
        """Check the fields beyond the ablation switches.

        Raises:
            ValueError: naming the offending field, its value and what would work.
        """
        if self.visual_source not in VISUAL_SOURCES:
            raise ValueError(f"visual_source must be one of {VISUAL_SOURCES}, got {self.visual_source!r}")
        if self.visual_source == "regions" and self.vision_config is not None:
            raise ValueError(
                "visual_source='regions' takes precomputed region features and has no vision tower: drop vision_config"
            )
        if self.vision_config is not None and self.region_feature_size != vision_width(self.vision_config):
            raise ValueError(
                f"region_feature_size={self.region_feature_size} differs from the width "
                f"{vision_width(self.vision_config)} of the vision tower whose tokens are the regions; leave it unset"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        if self.grid_size is not None and self.grid_size < 1:
            raise ValueError(
                f"grid_size must be a positive integer or None (one region per patch), got {self.grid_size}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.max_position_embeddings < 2:
            raise ValueError(
                f"max_position_embeddings must be at least 2 (BOS and one token), got {self.max_position_embeddings}"
            )
        if self.num_hidden_layers < 1:
            raise ValueError(f"num_hidden_layers must be at least 1, got {self.num_hidden_layers}")

    @property
    def settings(self) -> XGPTSettings:
        """The ablation switches of this config, as an `XGPTSettings`."""
        return XGPTSettings.from_object(self)

    @property
    def has_vision_tower(self) -> bool:
        """Whether the model holds a (frozen) vision tower: `visual_source` `"grid"` or `"boxes"`."""
        return self.vision_config is not None

    @property
    def reads_feature_map(self) -> bool:
        """Whether the vision tower is convolutional: its feature map's cells are the patches, and its mean stands in
        for the CLS region."""
        return self.vision_config is not None and gives_feature_map(self.vision_config)

    @classmethod
    def from_vision_config(cls, vision_config: PreTrainedConfig, **kwargs) -> XGPTConfig:
        """Build a config around a vision-tower config (how presets build XGPT: it has no pretrained LM).

        With `visual_source="regions"` the regions are precomputed and the model holds no vision tower: the
        config is built without one (`vision_config=None`), and `region_feature_size` should give the features'
        width (default 2048, bottom-up-attention's).

        Args:
            vision_config: Config of the vision tower (a full CLIP/SigLIP config is reduced to its `vision_config`);
                unused for `visual_source="regions"`.
            **kwargs: The other fields, as in the class docstring.
        """
        if kwargs.get("visual_source") == "regions":
            return cls(vision_config=None, **kwargs)
        vision_config = getattr(vision_config, "vision_config", None) or vision_config
        return cls(vision_config=vision_config.to_dict(), **kwargs)


__all__ = ["ARCHITECTURES", "ENCODER_SIGNALS", "VISUAL_SOURCES", "XGPTConfig", "XGPTSettings"]
