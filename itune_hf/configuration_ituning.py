"""Configuration of the I-Tuning captioning model.

This file is copied next to a full checkpoint by ``register_for_auto_class`` so that the checkpoint loads with
``trust_remote_code=True`` where ``itune_hf`` is not installed: it imports only ``transformers`` and
``huggingface_hub``.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

#: Initialisation schemes of the I-Tuning modules.
#: ``"zero"``: ``W_o`` and ``b_o`` start at zero, so a fresh model is exactly the frozen LM (our default, as in
#: Flamingo's zero-initialised gates and LoRA's ``B = 0``); ``"random"``: every projection keeps PyTorch's random
#: ``nn.Linear`` initialisation, the paper's "randomly initialized" modules.
ITUNING_INITS = ("zero", "random")


def validate_ituning_settings(
    *,
    bottleneck_dim: int | None,
    num_heads: int,
    scale: float,
    attention_scale: float | None,
    first_layer: int,
    init: str,
    dropout: float,
) -> None:
    """Check I-Tuning module settings; shared by the model config and the PEFT adapter config.

    Args:
        bottleneck_dim: Width ``r`` of the module's attention space, or ``None`` for half the LM width.
        num_heads: Attention heads; must divide ``bottleneck_dim``.
        scale: The paper's ``lambda`` that multiplies the module output.
        attention_scale: Factor on ``Q K^T`` before the softmax, ``None`` for ``1/sqrt(head_dim)``.
        first_layer: Index of the first LM layer with a module (I-Tuning Dropping).
        init: One of ``ITUNING_INITS``.
        dropout: Dropout on the attention probabilities.

    Raises:
        ValueError: naming the offending setting and its value.
    """
    if bottleneck_dim is not None and bottleneck_dim <= 0:
        raise ValueError(f"bottleneck_dim must be a positive integer or None (half the LM width), got {bottleneck_dim}")
    if num_heads <= 0:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads}")
    if bottleneck_dim is not None and bottleneck_dim % num_heads != 0:
        raise ValueError(
            f"bottleneck_dim={bottleneck_dim} is not divisible by num_heads={num_heads}; pick values where "
            "bottleneck_dim % num_heads == 0"
        )
    if scale <= 0:
        raise ValueError(f"scale (the paper's lambda) must be positive, got {scale}; the paper uses lambda >= 1")
    if attention_scale is not None and attention_scale <= 0:
        raise ValueError(f"attention_scale must be positive or None (1/sqrt(head_dim)), got {attention_scale}")
    if first_layer < 0:
        raise ValueError(f"first_layer must be >= 0, got {first_layer}")
    if init not in ITUNING_INITS:
        raise ValueError(f"init must be one of {ITUNING_INITS}, got {init!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")


@strict
class ITuningConfig(PreTrainedConfig):
    r"""Configuration of [`ITuningForCaptioning`]: a frozen vision tower, a frozen causal LM and the I-Tuning modules.

    Args:
        vision_config (`PreTrainedConfig` or `dict`, *optional*):
            Config of the vision tower (CLIP vision, SigLIP vision, or any `AutoModel` vision model whose output has
            `last_hidden_state`). Defaults to a CLIP ViT-B/16 vision config.
        text_config (`PreTrainedConfig` or `dict`, *optional*):
            Config of the decoder-only LM (GPT-2, Llama, ...). Defaults to GPT-2 base.
        bottleneck_dim (`int`, *optional*):
            Width `r` of each module's attention space. `None` means half the LM width, the paper's setting.
        ituning_num_heads (`int`, defaults to 1):
            Attention heads per module. The paper writes single-head attention.
        ituning_scale (`float`, defaults to 1.0):
            The paper's `lambda >= 1` multiplying the module output (its value is not given in the paper).
        ituning_attention_scale (`float`, *optional*):
            Factor on `Q K^T` before the softmax. `None` means `1/sqrt(head_dim)` (standard attention); the paper's
            equation (4) has no factor, i.e. `1.0`.
        ituning_first_layer (`int`, defaults to 0):
            I-Tuning Dropping: LM layers below this index get no module and run without autograd in training.
            The paper's large model with dropping uses 18 (of 36).
        ituning_init (`str`, defaults to `"zero"`):
            `"zero"` (output projection starts at zero, so a fresh model equals the frozen LM) or `"random"` (the
            paper's random initialisation of every projection).
        ituning_dropout (`float`, defaults to 0.0):
            Dropout on the cross-attention probabilities (the paper uses none).
        add_ituning_modules (`bool`, defaults to `True`):
            Whether the model carries its own I-Tuning modules. `False` gives the bare frozen backbones, the base that
            a PEFT I-Tuning adapter is attached to.
        decoder_start_token_id, bos_token_id, eos_token_id, pad_token_id (`int`, *optional*):
            Special tokens; default to the LM's BOS/EOS (GPT-2 has no pad token, EOS is used).
    """

    model_type = "ituning"
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
    bottleneck_dim: int | None = None
    ituning_num_heads: int = 1
    ituning_scale: float = 1.0
    ituning_attention_scale: float | None = None
    ituning_first_layer: int = 0
    ituning_init: str = "zero"
    ituning_dropout: float = 0.0
    add_ituning_modules: bool = True
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
        validate_ituning_settings(
            bottleneck_dim=self.bottleneck_dim,
            num_heads=self.ituning_num_heads,
            scale=self.ituning_scale,
            attention_scale=self.ituning_attention_scale,
            first_layer=self.ituning_first_layer,
            init=self.ituning_init,
            dropout=self.ituning_dropout,
        )
        num_layers = self.text_config.num_hidden_layers
        if self.ituning_first_layer >= num_layers and self.add_ituning_modules:
            raise ValueError(
                f"ituning_first_layer={self.ituning_first_layer} leaves no layer with a module: the LM "
                f"({self.text_config.model_type}) has {num_layers} layers. Use a value below {num_layers}, or "
                "add_ituning_modules=False for a bare base model."
            )

    @property
    def resolved_bottleneck_dim(self) -> int:
        """The bottleneck width actually used: `bottleneck_dim`, or half the LM width."""
        return self.bottleneck_dim if self.bottleneck_dim is not None else self.text_config.hidden_size // 2

    @property
    def ituning_layers(self) -> list[int]:
        """Indices of the LM layers that carry a native I-Tuning module (empty for a bare base)."""
        if not self.add_ituning_modules:
            return []
        return list(range(self.ituning_first_layer, self.text_config.num_hidden_layers))

    @classmethod
    def from_vision_text_configs(
        cls, vision_config: PreTrainedConfig, text_config: PreTrainedConfig, **kwargs
    ) -> ITuningConfig:
        """Build a config from a vision-tower config and an LM config.

        Args:
            vision_config: Config of the vision tower (a full CLIP/SigLIP config is reduced to its `vision_config`).
            text_config: Config of the causal LM.
            **kwargs: I-Tuning settings and special tokens, as in the class docstring.
        """
        vision_config = getattr(vision_config, "vision_config", None) or vision_config
        return cls(vision_config=vision_config.to_dict(), text_config=text_config.to_dict(), **kwargs)


__all__ = ["ITuningConfig", "ITUNING_INITS", "validate_ituning_settings"]
