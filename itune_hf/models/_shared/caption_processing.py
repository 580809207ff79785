"""What every captioning processor does with text and images alike: special tokens, the decoder sequences it lays
out (left-padded prompts for generation; right-padded captions with their labels for training), opening images and
decoding generated ids. A family's processor subclasses `CaptionProcessingMixin` before `ProcessorMixin` and adds
only what is its own (I-Tuning's caption prefix, XGPT's boxes and region features)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from PIL import Image
from transformers import BatchFeature

from .images import ImageInput, is_image_input, open_image, shortest_edge_of
from .text_inputs import TextInput

#: The chat template of a captioner without one of its own: a captioner follows no instructions, so a conversation's
#: user text becomes the prompt its caption continues (the images go in as images); every other turn is left out.
CAPTION_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{% endif %}{% endfor %}"
)


class CaptionProcessingMixin:
    """The text and image handling shared by the captioning processors (mixed in before `ProcessorMixin`, whose
    `tokenizer`, `image_processor` and `max_caption_length` it reads)."""

    # ------------------------------------------------------------------ special tokens
    @property
    def bos_token_id(self) -> int:
        """Token that starts every decoder sequence (the tokenizer's BOS, falling back to EOS)."""
        token = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.tokenizer.eos_token_id
        if token is None:
            raise ValueError(f"The tokenizer {type(self.tokenizer).__name__} has neither a BOS nor an EOS token")
        return token

    @property
    def eos_token_id(self) -> int:
        """Token that ends every caption."""
        token = self.tokenizer.eos_token_id
        if token is None:
            raise ValueError(f"The tokenizer {type(self.tokenizer).__name__} has no EOS token to end captions with")
        return token

    @property
    def pad_token_id(self) -> int:
        """Padding of the decoder sequences (the tokenizer's, falling back to EOS)."""
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_id

    # ------------------------------------------------------------------ images
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

    def _open_images(self, images: ImageInput | Sequence[ImageInput]) -> list[Image.Image]:
        """One image or a list of them, opened (sizes bounded before anything is resized); a list of one-image lists
        (what `apply_chat_template` gives, one list per conversation) counts as the list of those images."""
        edge = shortest_edge_of(self.image_processor)
        images = [images] if is_image_input(images) else list(images)
        if images and all(isinstance(item, (list, tuple)) for item in images):
            if any(len(item) != 1 for item in images):
                counts = [len(item) for item in images]
                raise ValueError(f"a caption is of one image: each conversation must hold one, got {counts}")
            images = [item[0] for item in images]
        opened = [open_image(image, shortest_edge=edge) for image in images]
        if not opened:
            raise ValueError("Got an empty list of images")
        return opened

    # ------------------------------------------------------------------ text
    def _prefix_ids(self) -> list[int]:
        """The start of every decoder sequence: BOS (a family may add a fixed prefix after it)."""
        return [self.bos_token_id]

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
            if name == "text":  # one prompt for every image
                return [value] * count
            value = [value]  # one caption: for one image only (several images need one caption each)
        values = list(value)
        if len(values) != count:
            raise ValueError(f"Got {count} images but {len(values)} {name}; pass one per image")
        return values

    def _text_inputs(
        self, text: TextInput, captions: TextInput, count: int, pad_to: int | None, limit: int | None
    ) -> dict[str, torch.Tensor]:
        """Generation prefixes for the prompts in `text`, or, with `captions`, training sequences and labels."""
        prompts = self._as_list(text, count, "text")
        if captions is not None:
            return self._training_sequences(prompts, self._as_list(captions, count, "captions"), pad_to, limit)
        return self._generation_prefixes(prompts, pad_to, limit)

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
        budget_name = "max_length" if limit else "max_caption_length"
        for prompt, caption in zip(prompts, captions):
            if not isinstance(caption, str):
                raise ValueError(f"Each caption must be a string, got {type(caption).__name__}: {caption!r}")
            prompt_ids = self._tokens(prompt, continuation=False) if prompt else []
            budget = max_length - len(start) - 1 - len(prompt_ids)  # BOS, prefix and EOS
            if budget <= 0:
                used = f"a prompt of {len(prompt_ids)} tokens and " if prompt_ids else ""
                raise ValueError(
                    f"{budget_name}={max_length} leaves no room for a caption after {used}the start and end tokens "
                    f"({len(start) + 1}); raise {budget_name}"
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

    def apply_chat_template(self, conversation, chat_template: str | None = None, **kwargs):
        """transformers' `apply_chat_template`, with `CAPTION_CHAT_TEMPLATE` where the processor has no template
        (chat-format input to the `image-text-to-text` pipeline: the user's text is the caption's prompt).

        Args:
            conversation: The messages (or a batch of them).
            chat_template: A template to use instead.
            **kwargs: As in `ProcessorMixin.apply_chat_template`.
        """
        if chat_template is None and self.chat_template is None:
            chat_template = CAPTION_CHAT_TEMPLATE
        return super().apply_chat_template(conversation, chat_template=chat_template, **kwargs)

    @staticmethod
    def _refuse_other_modalities(kwargs: dict) -> None:
        """Drop the `videos=None` / `audio=None` that `apply_chat_template` passes every processor; refuse others."""
        for name in ("videos", "audio"):
            if kwargs.pop(name, None) is not None:
                raise ValueError(f"a captioner reads images (and a text prompt), not {name}")

    @staticmethod
    def _batch_feature(data: dict, return_tensors: str | None) -> BatchFeature:
        """`data` (tensors) as a `BatchFeature` of `return_tensors` tensors, or of Python lists when it is None, as
        transformers' processors give."""
        if return_tensors is None:
            data = {key: value.tolist() if isinstance(value, torch.Tensor) else value for key, value in data.items()}
        return BatchFeature(data=data, tensor_type=return_tensors)

    # ------------------------------------------------------------------ decoding
    def _clean(self, text: str) -> str:
        """A decoded caption as users see it (a family may strip more, e.g. its caption prefix)."""
        return text.strip()

    def batch_decode(self, sequences, skip_special_tokens: bool = True, **kwargs) -> list[str]:
        """Decode generated ids (special tokens stripped by default) into clean caption strings.

        Args:
            sequences: Token ids, one row per caption.
            skip_special_tokens: Drop BOS/EOS/padding (default).
            **kwargs: Passed to the tokenizer's `batch_decode`.
        """
        texts = self.tokenizer.batch_decode(sequences, skip_special_tokens=skip_special_tokens, **kwargs)
        return [self._clean(text) for text in texts]

    def decode(self, sequence, skip_special_tokens: bool = True, **kwargs) -> str | list[str]:
        """Decode one generated sequence into a caption string (a batch of them, e.g. `generate`'s output, into a
        list, as the tokenizer's `decode` does).

        Args:
            sequence: Token ids of one caption (or one row per caption).
            skip_special_tokens: Drop BOS/EOS/padding (default).
            **kwargs: Passed to the tokenizer's `decode`.
        """
        decoded = self.tokenizer.decode(sequence, skip_special_tokens=skip_special_tokens, **kwargs)
        return [self._clean(text) for text in decoded] if isinstance(decoded, list) else self._clean(decoded)

    def post_process_image_text_to_text(self, generated_outputs, skip_special_tokens: bool = True, **kwargs):
        """Used by the `image-text-to-text` / `image-to-text` pipelines."""
        return self.batch_decode(generated_outputs, skip_special_tokens=skip_special_tokens, **kwargs)


__all__ = ["CaptionProcessingMixin"]
