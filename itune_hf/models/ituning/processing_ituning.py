"""Processor of the I-Tuning captioning model: the vision tower's image processor plus the LM tokenizer.

Copied next to full checkpoints for remote code (imports only transformers, torch and its sibling files, generated
from `itune_hf/models/_shared/`).
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import BatchFeature, ProcessorMixin

from .caption_processing import CaptionProcessingMixin
from .images import ImageInput
from .text_inputs import TextInput, pop_text_kwargs


class ITuningProcessor(CaptionProcessingMixin, ProcessorMixin):
    r"""Turns images (and captions or prompts) into inputs of [`ITuningForCaptioning`], and generated ids into text.

    The processor of every family that reads pixels through a vision tower into a causal LM: I-Tuning, ClipCap and
    cross-attention fine-tuning (its name is stored in their checkpoints' `processor_config.json`, so it stays).

    * Images may be paths, PIL images of any mode (RGB, RGBA, L, P, CMYK, 16-bit, ...) or numpy arrays; EXIF
      orientation is applied.
    * Decoder inputs start with the LM's BOS token. For generation an optional prompt follows (left-padded in a
      batch); for training (`captions=`) the caption follows and `labels` hold the caption plus EOS (-100 on the
      prompt and on padding, right-padded): `labels[t]` is the token after position `t`, as the model expects.

    Args:
        image_processor: The vision tower's image processor (e.g. `CLIPImageProcessor`).
        tokenizer: The LM tokenizer. A tokenizer without a pad token pads with its EOS token.
        max_caption_length: Token budget of prompt + caption (BOS and EOS included) for training inputs.
        caption_prefix: Text placed after BOS before every prompt or caption, in training and generation alike;
            empty (the paper: BOS only) by default. LMs that park a massive activation on the first position
            (Llama-family models such as SmolLM2) need one token here, or the first word of every caption is
            predicted from that position, where the I-Tuning output is swamped and the image cannot steer it.
    """

    def __init__(
        self, image_processor=None, tokenizer=None, max_caption_length: int = 64, caption_prefix: str = "", **kwargs
    ):
        self.max_caption_length = max_caption_length
        self.caption_prefix = caption_prefix
        super().__init__(image_processor, tokenizer, **kwargs)
        if self.tokenizer.pad_token is None and self.tokenizer.eos_token is not None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    @classmethod
    def from_vision_text_pretrained(
        cls, vision_model_name_or_path: str, text_model_name_or_path: str, **kwargs
    ) -> ITuningProcessor:
        """Build a processor from the vision tower's image processor and the LM's tokenizer.

        Args:
            vision_model_name_or_path: Hub id or directory of the vision checkpoint (e.g. a CLIP model).
            text_model_name_or_path: Hub id or directory of the causal LM.
            **kwargs: Processor settings (e.g. `max_caption_length`).
        """
        from transformers import AutoImageProcessor, AutoTokenizer

        from .backbones import resolve_reference

        image_processor = AutoImageProcessor.from_pretrained(resolve_reference(vision_model_name_or_path))
        tokenizer = AutoTokenizer.from_pretrained(resolve_reference(text_model_name_or_path))
        return cls(image_processor, tokenizer, **kwargs)

    @property
    def model_input_names(self) -> list[str]:
        return ["pixel_values", "decoder_input_ids", "decoder_attention_mask"]

    # ------------------------------------------------------------------ encoding
    def _prefix_ids(self) -> list[int]:
        """BOS and the caption prefix: the start of every decoder sequence."""
        prefix = (
            self.tokenizer(self.caption_prefix, add_special_tokens=False)["input_ids"] if self.caption_prefix else []
        )
        return [self.bos_token_id, *prefix]

    def __call__(
        self,
        images: ImageInput | Sequence[ImageInput] | None = None,
        text: TextInput = None,
        captions: TextInput = None,
        return_tensors: str | None = "pt",
        **kwargs,
    ) -> BatchFeature:
        """Prepare a batch.

        Args:
            images: One image or a list of images (paths, PIL images, numpy arrays, torch tensors).
            text: Optional prompt, or one prompt per image, that the caption continues (conditional captioning).
            captions: One reference caption per image, for training: adds `labels`.
            return_tensors: `"pt"` (default) or `None` for Python lists.
            **kwargs: `padding`, `truncation` and `max_length` shape the decoder sequences (as a tokenizer's
                would: see `pop_text_kwargs`); the rest go to the image processor (e.g. `do_center_crop=False`).

        Returns:
            `BatchFeature` with `pixel_values` (when images are given), `decoder_input_ids`,
            `decoder_attention_mask` and, with `captions`, `labels`.
        """
        if images is None and text is None and captions is None:
            raise ValueError("Pass images, and optionally a prompt (text=) or training captions (captions=).")
        data, count = {}, None
        self._refuse_other_modalities(kwargs)
        pad_to, limit = pop_text_kwargs(kwargs)
        if images is not None:
            opened = self._open_images(images)
            data.update(self.image_processor(opened, return_tensors="pt", **kwargs))
            count = len(opened)
        if count is None:
            count = (
                len(captions)
                if isinstance(captions, (list, tuple))
                else len(text)
                if isinstance(text, (list, tuple))
                else 1
            )
        data.update(self._text_inputs(text, captions, count, pad_to, limit))
        return self._batch_feature(data, return_tensors)

    # ------------------------------------------------------------------ decoding
    def _clean(self, text: str) -> str:
        text, prefix = text.strip(), self.caption_prefix.strip()
        return text[len(prefix) :].strip() if prefix and text.startswith(prefix) else text


__all__ = ["ITuningProcessor"]
