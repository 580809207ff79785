"""Processor of the I-Tuning captioning model: the vision tower's image processor plus the LM tokenizer.

Copied next to full checkpoints for remote code (imports only transformers, torch and its sibling files, generated
from `itune_hf/models/_shared/`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from PIL import Image
from transformers import BatchFeature, ProcessorMixin

from .images import ImageInput, is_image_input, open_image, shortest_edge_of
from .text_inputs import TextInput, pop_text_kwargs


class ITuningProcessor(ProcessorMixin):
    r"""Turns images (and captions or prompts) into inputs of [`ITuningForCaptioning`], and generated ids into text.

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

    # ------------------------------------------------------------------ special tokens
    @property
    def bos_token_id(self) -> int:
        """Token that starts every decoder sequence (the LM's BOS, falling back to EOS)."""
        token = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.tokenizer.eos_token_id
        if token is None:
            raise ValueError(f"The tokenizer {type(self.tokenizer).__name__} has neither a BOS nor an EOS token")
        return token

    @property
    def eos_token_id(self) -> int:
        token = self.tokenizer.eos_token_id
        if token is None:
            raise ValueError(f"The tokenizer {type(self.tokenizer).__name__} has no EOS token to end captions with")
        return token

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_id

    # ------------------------------------------------------------------ encoding
    def _prefix_ids(self) -> list[int]:
        """BOS and the caption prefix: the start of every decoder sequence."""
        prefix = (
            self.tokenizer(self.caption_prefix, add_special_tokens=False)["input_ids"] if self.caption_prefix else []
        )
        return [self.bos_token_id, *prefix]

    def _tokens(self, text: str, *, continuation: bool) -> list[int]:
        # A caption that follows a prompt starts a new word: BPE tokenizers need the leading space.
        text = text.strip()
        if continuation and text:
            text = " " + text
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @staticmethod
    def _as_list(value: TextInput, count: int, name: str) -> list[str | None]:
        if value is None:
            return [None] * count
        if isinstance(value, str):
            return [value] * count if name == "text" else [value]
        values = list(value)
        if len(values) != count:
            raise ValueError(f"Got {count} images but {len(values)} {name}; pass one per image")
        return values

    def open_image(self, image: ImageInput) -> Image.Image:
        """The RGB image this processor reads from `image`: transparency composited on white, 16-bit rescaled to 8
        bits, EXIF orientation applied, its size checked. Pipelines that open images themselves (transformers'
        `image-text-to-text` where itune_hf is not installed) caption the same pixels when given its result.

        Args:
            image: A path, PIL image of any mode, numpy array or torch tensor.

        Raises:
            ImageError: naming the input and the reason (missing, not an image, too large, ...).
        """
        return open_image(image, shortest_edge=shortest_edge_of(self.image_processor))

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
        data = {}
        count = None
        pad_to, limit = pop_text_kwargs(kwargs)
        if images is not None:
            image_list = [images] if is_image_input(images) else list(images)
            if not image_list:
                raise ValueError("Got an empty list of images")
            edge = shortest_edge_of(self.image_processor)  # bounds the resized size before allocating
            opened = [open_image(image, shortest_edge=edge) for image in image_list]
            data.update(self.image_processor(opened, return_tensors="pt", **kwargs))
            count = len(opened)
        if count is None:
            count = len(captions) if isinstance(captions, (list, tuple)) else len(text) if isinstance(text, list) else 1
        prompts = self._as_list(text, count, "text")
        if captions is not None:
            data.update(self._training_sequences(prompts, self._as_list(captions, count, "captions"), pad_to, limit))
        else:
            data.update(self._generation_prefixes(prompts, pad_to, limit))
        return BatchFeature(data=data, tensor_type=return_tensors)

    def _generation_prefixes(
        self, prompts: list[str | None], pad_to: int | None = None, limit: int | None = None
    ) -> dict[str, torch.Tensor]:
        start = self._prefix_ids()
        sequences = [[*start, *(self._tokens(p, continuation=False) if p else [])][:limit] for p in prompts]
        length = max(*map(len, sequences), pad_to or 0)
        ids = torch.full((len(sequences), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), length), dtype=torch.long)
        for row, sequence in enumerate(sequences):  # left padding: generation continues every row at the end
            ids[row, length - len(sequence) :] = torch.tensor(sequence)
            mask[row, length - len(sequence) :] = 1
        return {"decoder_input_ids": ids, "decoder_attention_mask": mask}

    def _training_sequences(
        self, prompts: list[str | None], captions: list[str], pad_to: int | None = None, limit: int | None = None
    ) -> dict[str, torch.Tensor]:
        rows, start, max_length = [], self._prefix_ids(), limit or self.max_caption_length
        for prompt, caption in zip(prompts, captions):
            if not isinstance(caption, str):
                raise ValueError(f"Each caption must be a string, got {type(caption).__name__}: {caption!r}")
            prompt_ids = self._tokens(prompt, continuation=False) if prompt else []
            budget = max_length - len(start) - 1 - len(prompt_ids)  # BOS, prefix and EOS
            if budget <= 0:
                raise ValueError(
                    f"The prompt {prompt!r} uses {len(prompt_ids)} tokens, leaving no room for a caption within "
                    f"max_caption_length={max_length}"
                )
            caption_ids = self._tokens(caption, continuation=bool(prompt_ids))[:budget]
            inputs = [*start, *prompt_ids, *caption_ids]
            labels = [-100] * (len(start) - 1 + len(prompt_ids)) + [*caption_ids, self.eos_token_id]
            rows.append((inputs, labels))
        length = max(*(len(inputs) for inputs, _ in rows), pad_to or 0)
        ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        for row, (inputs, targets) in enumerate(rows):
            ids[row, : len(inputs)] = torch.tensor(inputs)
            mask[row, : len(inputs)] = 1
            labels[row, : len(targets)] = torch.tensor(targets)
        return {"decoder_input_ids": ids, "decoder_attention_mask": mask, "labels": labels}

    # ------------------------------------------------------------------ decoding
    def batch_decode(self, sequences, skip_special_tokens: bool = True, **kwargs) -> list[str]:
        """Decode generated ids (special tokens stripped by default) into clean caption strings."""
        texts = self.tokenizer.batch_decode(sequences, skip_special_tokens=skip_special_tokens, **kwargs)
        return [self._clean(text) for text in texts]

    def decode(self, sequence, skip_special_tokens: bool = True, **kwargs) -> str:
        """Decode one generated sequence into a caption string."""
        return self._clean(self.tokenizer.decode(sequence, skip_special_tokens=skip_special_tokens, **kwargs))

    def _clean(self, text: str) -> str:
        text, prefix = text.strip(), self.caption_prefix.strip()
        return text[len(prefix) :].strip() if prefix and text.startswith(prefix) else text

    def post_process_image_text_to_text(self, generated_outputs, skip_special_tokens: bool = True, **kwargs):
        """Used by the `image-text-to-text` / `image-to-text` pipelines."""
        return self.batch_decode(generated_outputs, skip_special_tokens=skip_special_tokens, **kwargs)


__all__ = ["ITuningProcessor"]
