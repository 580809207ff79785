"""Cross-attention fine-tuning in a frozen LM, VisionEncoderDecoder style: a frozen vision tower (the encoder) and a
frozen causal LM (the decoder) with a new cross-attention block (+ its layer norm) in every layer, attending to the
vision tower's last hidden state; only those blocks (and, when the widths differ, the encoder-to-decoder projection)
train. Built on transformers' `VisionEncoderDecoderModel`, under its own model type (`CrossAttnConfig`).

This file is copied next to a full checkpoint by ``register_for_auto_class``; it imports only torch, transformers
and its sibling configuration file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel, VisionEncoderDecoderModel
from transformers.modeling_outputs import BaseModelOutput

from .configuration_crossattn import CrossAttnConfig
from .generation import callers_length, padded_positions


def is_cross_attention_parameter(name: str) -> bool:
    """Whether a decoder parameter belongs to a cross-attention block or its layer norm (GPT-2: `crossattention`,
    `ln_cross_attn`; BERT-style decoders: `crossattention`)."""
    return "cross" in name.lower()


def with_cross_attention(language_model: PreTrainedModel, decoder_config) -> PreTrainedModel:
    """`language_model` with cross-attention blocks: a model built from `decoder_config` (which has
    `add_cross_attention=True`) holding every weight of `language_model`; the new blocks keep their fresh init.

    Args:
        language_model: A causal LM without cross-attention (pretrained, or a seeded random backbone).
        decoder_config: Its config with `is_decoder=True, add_cross_attention=True`.

    Raises:
        ValueError: when the weights do not fit (a different architecture or size).
    """
    decoder = AutoModelForCausalLM.from_config(decoder_config)
    result = decoder.load_state_dict(language_model.state_dict(), strict=False)
    missing = [name for name in result.missing_keys if not is_cross_attention_parameter(name)]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"The language model {type(language_model).__name__} does not fit the decoder config: missing "
            f"{missing[:3]}, unexpected {list(result.unexpected_keys)[:3]}"
        )
    return decoder


# Copied from itune_hf.models._shared.captioning.check_pixel_values
def check_pixel_values(pixel_values: torch.Tensor) -> torch.Tensor:
    """`pixel_values` as given, refused in one line unless `(batch, channels, height, width)` (a tower fails inside
    with "not enough values to unpack")."""
    if pixel_values.dim() != 4:
        raise ValueError(
            f"pixel_values has shape {tuple(pixel_values.shape)}; expected (batch, channels, height, width): pass the "
            "processor's output (processor(images=[image])), or add the batch dimension (pixel_values[None])"
        )
    return pixel_values


# Copied from itune_hf.models._shared.captioning.check_generate_inputs
def check_generate_inputs(args: tuple, kwargs: dict, inputs: tuple[str, ...]) -> None:
    """Refuse, in one line naming what to pass, a `generate()` call given no image or `pixel_values` that are not
    `(batch, channels, height, width)` (transformers fails inside).

    Args:
        args, kwargs: The `generate` call's arguments.
        inputs: The keywords that carry an image in this family (any one of them is enough).
    """
    if kwargs.get("pixel_values") is not None:
        check_pixel_values(kwargs["pixel_values"])
    if args or kwargs.get("inputs") is not None or any(kwargs.get(name) is not None for name in inputs):
        return
    given = ", ".join(sorted(k for k, v in kwargs.items() if v is not None)) or "nothing"
    raise ValueError(
        f"generate() captions an image, but got no {' or '.join(inputs)} (got: {given}). Pass the processor's "
        "output: model.generate(**processor(images=image)); a prompt goes in as processor(images=image, text=prompt) "
        "(decoder_input_ids), not input_ids."
    )


# Copied from itune_hf.models._shared.captioning.ImageInputGeneration
class ImageInputGeneration:
    """`generate()` for a model whose main input is an image (the first base of a family's captioning model)."""

    def _prepare_special_tokens(self, generation_config, kwargs_has_attention_mask=None, *args, **kwargs):
        # generate() warns that a batch without attention_mask may be padded; the main input is an image, never
        # padded (padded regions carry region_mask, prompts decoder_attention_mask), so that warning never applies.
        return super()._prepare_special_tokens(generation_config, None, *args, **kwargs)

    def create_masks_for_generate(self, *, attention_mask=None, **_):
        """The caption's attention mask as `generate` passes it with a static cache: 2-D, unchanged.

        `generate` turns the 2-D mask into a 4-D one over the whole static cache when the cache is compilable; the
        families build their own masks from the 2-D one (ClipCap's prefix, XGPT's regions, left-padded positions)
        and a wrapped LM builds its 4-D mask over its static cache itself, so the 2-D mask is what they need.
        """
        return attention_mask


# Copied from itune_hf.models._shared.captioning.FrozenBackbonesCaptioner
class FrozenBackbonesCaptioner(ImageInputGeneration):
    """Loading and generation of a captioner that trains a part between two frozen backbones and reads cached vision
    states as `encoder_outputs` (the baselines: ClipCap's mapper, cross-attention in a frozen LM). The model defines
    `freeze_backbones()`."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, with the backbones frozen again (loading makes fresh parameters)."""
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).freeze_backbones()
        return loaded

    def train(self, mode: bool = True):
        """`nn.Module.train`, except that a frozen vision tower stays in eval mode: it computes as at inference (a
        convolutional tower's batch norm keeps its statistics, as I-Tuning's and XGPT's towers do).

        Args:
            mode: Training mode (True) or evaluation mode (False).
        """
        super().train(mode)
        tower = self.get_encoder()
        if tower is not None and not any(p.requires_grad for p in tower.parameters()):
            tower.eval()
        return self

    def generate(self, *args, **kwargs):
        """`GenerationMixin.generate` (beam search with 5 beams by default); `encoder_outputs` (cached vision
        states) may be a tensor, a tuple or a `BaseModelOutput` and is wrapped anew (beam search expands it). A
        `max_length=` given without `max_new_tokens` replaces the saved default `max_new_tokens`."""
        check_generate_inputs(args, kwargs, ("pixel_values", "encoder_outputs"))
        callers_length(kwargs)
        encoder_outputs = kwargs.get("encoder_outputs")
        if encoder_outputs is not None:
            states = encoder_outputs if isinstance(encoder_outputs, torch.Tensor) else encoder_outputs[0]
            kwargs["encoder_outputs"] = BaseModelOutput(last_hidden_state=states)
        return super().generate(*args, **kwargs)


class CrossAttnForCaptioning(FrozenBackbonesCaptioner, VisionEncoderDecoderModel):
    r"""Image captioning by cross-attention fine-tuning: `VisionEncoderDecoderModel` with the vision tower and the
    LM frozen, the LM's cross-attention blocks (+ their layer norms) trainable.

    Args:
        config: The `CrossAttnConfig`.
        vision_model: A vision tower to use instead of building one from `config.encoder` (alias: `encoder`).
        language_model: A causal LM to use instead of building one from `config.decoder` (alias: `decoder`); one
            without cross-attention gets the blocks added (its own weights kept).
    """

    config_class = CrossAttnConfig
    accepts_loss_kwargs = True  # Trainer passes num_items_in_batch: gradient accumulation as one large batch

    def __init__(
        self,
        config: CrossAttnConfig,
        vision_model: PreTrainedModel | None = None,
        language_model: PreTrainedModel | None = None,
        encoder: PreTrainedModel | None = None,
        decoder: PreTrainedModel | None = None,
    ) -> None:
        if not isinstance(config, CrossAttnConfig):  # remote code: the Auto classes may load another copy of the class
            config = CrossAttnConfig.from_dict(config.to_dict())
        encoder = encoder if encoder is not None else vision_model
        decoder = decoder if decoder is not None else language_model
        if decoder is not None and not getattr(decoder.config, "add_cross_attention", False):
            decoder = with_cross_attention(decoder, config.decoder)
        super().__init__(config, encoder=encoder, decoder=decoder)
        self.freeze_backbones()
        if self.generation_config is not None:
            self.generation_config.num_beams = 5
            self.generation_config.max_new_tokens = 30

    @property
    def vision_model(self) -> nn.Module:
        """The frozen vision tower (the encoder), under the name the other captioners use."""
        return self.encoder

    @property
    def language_model(self) -> nn.Module:
        """The LM with its cross-attention blocks (the decoder)."""
        return self.decoder

    def freeze_backbones(self) -> None:
        """Freeze everything but the decoder's cross-attention blocks (+ layer norms) and the width projection."""
        self.requires_grad_(False)
        for name, parameter in self.decoder.named_parameters():
            if is_cross_attention_parameter(name):
                parameter.requires_grad_(True)
        projection = getattr(self, "enc_to_dec_proj", None)
        if projection is not None:
            projection.requires_grad_(True)

    def _set_gradient_checkpointing(self, enable: bool = True, *args, **kwargs):
        # The frozen encoder's states and the frozen word embeddings need no grad, so with reentrant checkpointing
        # no input of a checkpointed decoder layer would require one and its cross-attention would get no gradient:
        # the embeddings' output is made to require grad (what `enable_input_require_grads()` does by hand)
        super()._set_gradient_checkpointing(enable, *args, **kwargs)
        if enable and getattr(self, "_require_grads_hook", None) is None:
            self.enable_input_require_grads()

    def forward(
        self,
        pixel_values=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        decoder_inputs_embeds=None,
        labels=None,
        return_dict=None,
        decoder_position_ids=None,
        num_items_in_batch=None,
        **kwargs,
    ):
        """`VisionEncoderDecoderModel.forward` (labels aligned with `decoder_input_ids`, not shifted); cached vision
        states may be passed as a `(B, N_v, d_v)` tensor in `encoder_outputs`. Left-padded prompts
        (`decoder_attention_mask`) get positions counted from each row's first token, so that a row's caption does
        not depend on the rest of its batch. `logits_to_keep` limits the decoder's logits, as in every family. The
        loss is taken in fp32 as every family's is (`VisionEncoderDecoderModel` takes it in the logits' dtype, bf16
        under autocast), over `num_items_in_batch` caption tokens when `Trainer` passes it. The inputs a processor
        gives are named here: `Trainer` drops the columns that `forward` does not name."""
        if isinstance(encoder_outputs, torch.Tensor):
            encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs)
        if encoder_outputs is None and pixel_values is not None:
            check_pixel_values(pixel_values)
        if "logits_to_keep" in kwargs:  # the decoder's (VisionEncoderDecoderModel hands it to the encoder otherwise)
            kwargs["decoder_logits_to_keep"] = kwargs.pop("logits_to_keep")
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        tokens = decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds
        if decoder_attention_mask is not None and tokens is not None and decoder_position_ids is None:
            decoder_position_ids = padded_positions(decoder_attention_mask, tokens.shape[1])
        if decoder_position_ids is not None:
            kwargs["decoder_position_ids"] = decoder_position_ids
        output = super().forward(
            pixel_values=pixel_values, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
            decoder_inputs_embeds=decoder_inputs_embeds, return_dict=True, **kwargs,
        )  # fmt: skip
        if labels is not None:  # a new output: a field set after construction would be missing from to_tuple()
            output = type(output)(loss=caption_loss(output.logits, labels, num_items_in_batch), **output)
        return output if (self.config.return_dict if return_dict is None else return_dict) else output.to_tuple()


# Copied from itune_hf.models._shared.captioning.caption_loss
def caption_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: torch.Tensor | int | None = None
) -> torch.Tensor:
    """Cross-entropy over the caption tokens (`labels` -100 elsewhere), `labels` aligned with the logits: their mean,
    or their sum over `num_items_in_batch` when given (`Trainer`'s count of the caption tokens of every micro-batch
    of one optimizer step, so that gradient accumulation gives the large batch's gradient)."""
    if logits.shape[1] != labels.shape[1]:
        raise ValueError(
            f"labels have length {labels.shape[1]} but the logits cover {logits.shape[1]} positions; "
            "pass labels aligned with decoder_input_ids and logits_to_keep=0"
        )
    flat_logits, flat_labels = logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1).to(logits.device)
    if num_items_in_batch is None:
        return F.cross_entropy(flat_logits, flat_labels, ignore_index=-100)
    total = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


__all__ = ["CrossAttnForCaptioning", "is_cross_attention_parameter", "with_cross_attention"]
