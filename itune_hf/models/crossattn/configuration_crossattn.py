"""Configuration of the cross-attention fine-tuning baseline (a `VisionEncoderDecoderConfig` of its own type).

Copied next to a full checkpoint by ``register_for_auto_class`` (imports only transformers and huggingface_hub).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig, VisionEncoderDecoderConfig


@dataclass(frozen=True)
class CrossAttnSettings:
    """What trains in a cross-attention baseline, as cards and logs list it."""

    def card_rows(self, model_config: Any) -> dict[str, Any]:
        """The rows of the card of a model with `model_config` (a `CrossAttnConfig`)."""
        decoder = model_config.decoder
        projected = model_config.encoder.hidden_size != decoder.hidden_size
        return {
            "trainable": "a cross-attention block (+ its layer norm) in every decoder layer"
            + (", and the vision-to-LM width projection" if projected else ""),
            "decoder layers": decoder.num_hidden_layers,
            "attends to": "every token of the vision tower's last hidden state",
        }


@strict
class CrossAttnConfig(VisionEncoderDecoderConfig):
    r"""Configuration of [`CrossAttnForCaptioning`]: `VisionEncoderDecoderConfig` (`encoder`: the frozen vision
    tower, `decoder`: a causal LM with `add_cross_attention=True`) under its own `model_type`, so that the package's
    registry, Auto classes and commands tell it from other vision-encoder-decoder checkpoints.

    Args:
        encoder, decoder (`PreTrainedConfig` or `dict`): As in `VisionEncoderDecoderConfig`; the decoder must be an
            architecture with cross-attention (GPT-2, BERT-style decoders; Llama-family LMs have none).
        decoder_start_token_id, bos_token_id, eos_token_id, pad_token_id (`int`, *optional*): Special tokens;
            default to the decoder's BOS/EOS.
    """

    model_type = "crossattn"

    decoder_start_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        decoder = self.decoder
        if not (getattr(decoder, "is_decoder", False) and getattr(decoder, "add_cross_attention", False)):
            raise ValueError(
                f"The decoder config ({decoder.model_type}) must have is_decoder=True and add_cross_attention=True; "
                "build the config with CrossAttnConfig.from_vision_text_configs"
            )
        if self.bos_token_id is None:
            self.bos_token_id = getattr(decoder, "bos_token_id", None)
        if self.eos_token_id is None:
            self.eos_token_id = getattr(decoder, "eos_token_id", None)
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.bos_token_id
        if self.pad_token_id is None:
            pad = getattr(decoder, "pad_token_id", None)
            eos = self.eos_token_id[0] if isinstance(self.eos_token_id, list) else self.eos_token_id
            self.pad_token_id = pad if pad is not None else eos

    @property
    def vision_config(self) -> PreTrainedConfig:
        """The vision tower's config (`encoder`), under the name the other captioners' configs use."""
        return self.encoder

    @property
    def text_config(self) -> PreTrainedConfig:
        """The LM's config (`decoder`), under the name the other captioners' configs use."""
        return self.decoder

    def get_text_config(self, decoder=None, encoder=None) -> PreTrainedConfig:
        """The LM's config (`decoder`; `text_config` is its alias, not a second text config)."""
        return self.decoder

    @property
    def settings(self) -> CrossAttnSettings:
        """What trains, for cards."""
        return CrossAttnSettings()

    @classmethod
    def from_vision_text_configs(
        cls, vision_config: PreTrainedConfig, text_config: PreTrainedConfig, **kwargs
    ) -> CrossAttnConfig:
        """Build a config from a vision-tower config and a causal-LM config (cross-attention switched on).

        Args:
            vision_config: Config of the vision tower (a full CLIP/SigLIP config is reduced to its `vision_config`).
            text_config: Config of the causal LM.
            **kwargs: Special tokens.

        Raises:
            ValueError: when the LM architecture has no cross-attention.
        """
        vision_config = getattr(vision_config, "vision_config", None) or vision_config
        decoder = text_config.to_dict()
        if text_config.model_type not in CROSS_ATTENTION_DECODERS:
            raise ValueError(
                f"The LM type {text_config.model_type!r} has no cross-attention blocks in transformers; use one of "
                f"{', '.join(CROSS_ATTENTION_DECODERS)} (e.g. GPT-2)"
            )
        decoder.update(is_decoder=True, add_cross_attention=True)
        return cls(encoder=vision_config.to_dict(), decoder=decoder, **kwargs)


#: Causal LMs of transformers whose layers take `add_cross_attention=True`.
CROSS_ATTENTION_DECODERS = ("gpt2", "bert", "roberta", "xlm-roberta", "electra", "bert-generation", "trocr")

__all__ = ["CROSS_ATTENTION_DECODERS", "CrossAttnConfig", "CrossAttnSettings"]
