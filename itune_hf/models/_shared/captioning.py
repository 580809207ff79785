"""What every family's captioning model does alike, written once: the caption loss, decoder inputs from labels, and
the generation hooks of a model whose main input is an image.

Remote code imports only the files beside the model file, so each family's modeling file carries a copy of what it
uses under a `# Copied from itune_hf.models._shared.captioning.<name>` marker; `make fix-copies` writes them and
`tests/models/test_shared_copies.py` fails on a copy that differs. The package's own modules import from here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import BaseModelOutput

from .generation import callers_length


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


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Build decoder inputs from labels: prepend the start token, drop the last label, turn -100 into padding."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def check_pixel_values(pixel_values: torch.Tensor) -> torch.Tensor:
    """`pixel_values` as given, refused in one line unless `(batch, channels, height, width)` (a tower fails inside
    with "not enough values to unpack")."""
    if pixel_values.dim() != 4:
        raise ValueError(
            f"pixel_values has shape {tuple(pixel_values.shape)}; expected (batch, channels, height, width): pass the "
            "processor's output (processor(images=[image])), or add the batch dimension (pixel_values[None])"
        )
    return pixel_values


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


__all__ = [
    "FrozenBackbonesCaptioner",
    "ImageInputGeneration",
    "caption_loss",
    "check_pixel_values",
    "check_generate_inputs",
    "shift_tokens_right",
]
