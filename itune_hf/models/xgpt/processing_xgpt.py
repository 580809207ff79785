"""Processor of the XGPT captioning model: the vision tower's image processor plus the GPT-2 BPE tokenizer.

Copied next to full checkpoints for remote code (imports only transformers, torch and its sibling files, generated
from `itune_hf/models/_shared/`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import BatchFeature, ProcessorMixin

from .caption_processing import CaptionProcessingMixin
from .images import ImageInput
from .text_inputs import TextInput, pop_text_kwargs

BoxesInput = Sequence[Sequence[Sequence[float]]] | None


def _size_field(size, key: str) -> int | None:
    if size is None:
        return None
    return size.get(key) if hasattr(size, "get") else getattr(size, key, None)


class XGPTProcessor(CaptionProcessingMixin, ProcessorMixin):
    r"""Turns images (with optional boxes) and captions or prompts into inputs of [`XGPTForCaptioning`], and
    generated ids into text.

    * Images may be paths, PIL images of any mode or numpy arrays; EXIF orientation is applied.
    * `boxes` (for models with `visual_source="boxes"`): per image, a list of normalised (x1, y1, x2, y2) boxes in the
      original image. They are mapped into the frame the image processor produces (CLIP's resize and centre crop),
      clipped to it, and padded into `region_boxes` with a `region_mask`. Without the images (the model reads cached
      vision states), `image_sizes` gives each original image's `(width, height)` for the same mapping.
    * `region_features` (for `visual_source="regions"`): per image, an `(N_i, D)` array of precomputed features;
      padded into `region_features` with `region_mask`, and `boxes` (normalised to the image the detector saw) are
      passed through unchanged as `region_boxes`.
    * Decoder inputs start with BOS (GPT-2's `<|endoftext|>`). For generation an optional prompt follows (left-padded
      in a batch); for training (`captions=`) the caption follows and `labels` hold the caption plus EOS (-100 on the
      prompt and on padding): `labels[t]` is the token after position `t`, as the model expects.

    Args:
        image_processor: The vision tower's image processor (e.g. `CLIPImageProcessorPil`); defaults to CLIP's
            preprocessing (models with `visual_source="regions"` never use it, but a processor needs one).
        tokenizer: The BPE tokenizer (GPT-2's; the paper's Wikipedia BPE is not available). Pads with EOS.
        max_caption_length: Token budget of prompt + caption, BOS and EOS included, for training inputs (the paper's
            maximum text length is 60, the model's `max_position_embeddings`).
    """

    def __init__(self, image_processor=None, tokenizer=None, max_caption_length: int = 60, **kwargs):
        self.max_caption_length = max_caption_length
        if image_processor is None:
            from transformers import CLIPImageProcessor

            image_processor = CLIPImageProcessor()
        super().__init__(image_processor, tokenizer, **kwargs)
        if self.tokenizer.pad_token is None and self.tokenizer.eos_token is not None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    @property
    def model_input_names(self) -> list[str]:
        return [
            "pixel_values",
            "region_features",
            "region_boxes",
            "region_mask",
            "decoder_input_ids",
            "decoder_attention_mask",
        ]

    # ------------------------------------------------------------------ encoding
    def __call__(
        self,
        images: ImageInput | Sequence[ImageInput] | None = None,
        text: TextInput = None,
        captions: TextInput = None,
        boxes: BoxesInput = None,
        region_features: Sequence | None = None,
        return_tensors: str | None = "pt",
        image_sizes: Sequence[tuple[int, int]] | None = None,
        **kwargs,
    ) -> BatchFeature:
        """Prepare a batch.

        Args:
            images: One image or a list of images (paths, PIL images, numpy arrays, torch tensors).
            text: Optional prompt, or one prompt per image, that the caption continues.
            captions: One reference caption per image, for training: adds `labels`.
            boxes: Per image, a list of normalised (x1, y1, x2, y2) boxes: `region_boxes` and `region_mask`.
            region_features: Per image, an `(N_i, D)` array of precomputed region features (needs `boxes`).
            return_tensors: `"pt"` (default) or `None` for Python lists.
            image_sizes: `boxes=` without `images` (the model reads cached vision states): the `(width, height)` of
                each original image, to map its boxes into the processed frame as the images would.
            **kwargs: `padding`, `truncation` and `max_length` shape the decoder sequences (as a tokenizer's
                would: see `pop_text_kwargs`); the rest go to the image processor (e.g. `do_center_crop=False`).

        Returns:
            `BatchFeature` with `pixel_values` (images given), `region_boxes`/`region_mask` (boxes given),
            `region_features` (features given), `decoder_input_ids`, `decoder_attention_mask` and, with `captions`,
            `labels`.
        """
        if images is None and region_features is None and text is None and captions is None:
            raise ValueError("Pass images (or region_features), and optionally a prompt (text=) or captions=.")
        data, sizes = {}, None
        self._refuse_other_modalities(kwargs)
        pad_to, limit = pop_text_kwargs(kwargs)
        if images is not None:
            opened = self._open_images(images)
            data.update(self.image_processor(opened, return_tensors="pt", **kwargs))
            sizes = [image.size for image in opened]
        if region_features is not None:
            if boxes is None:
                raise ValueError("region_features need their boxes: pass boxes= (normalised x1, y1, x2, y2 per region)")
            data.update(self._padded_features(region_features, boxes))
        elif boxes is not None:
            if sizes is None and image_sizes is None:
                raise ValueError(
                    "boxes= are pooled from the images: pass the images too (or image_sizes=, their (width, height), "
                    "with cached vision states)"
                )
            sizes = sizes if sizes is not None else [(int(w), int(h)) for w, h in image_sizes]
            data.update(self._padded_boxes(boxes, sizes, kwargs))
        count = self._batch_size(sizes, region_features, text, captions)
        data.update(self._text_inputs(text, captions, count, pad_to, limit))
        return self._batch_feature(data, return_tensors)

    @staticmethod
    def _batch_size(sizes, region_features, text: TextInput, captions: TextInput) -> int:
        if sizes is not None:
            return len(sizes)
        if region_features is not None:
            return len(region_features)
        if isinstance(captions, (list, tuple)):
            return len(captions)
        return len(text) if isinstance(text, (list, tuple)) else 1

    # ------------------------------------------------------------------ regions
    def frame_transform(self, width: int, height: int, **options) -> Callable[[torch.Tensor], torch.Tensor]:
        """How normalised boxes of a `width` x `height` image map into the frame the image processor outputs: a
        shortest-edge (or fixed-size) resize followed by a centre crop, as CLIP's processor does; the identity when
        the processor does not crop.

        Args:
            width: Width of the original image in pixels.
            height: Height of the original image in pixels.
            **options: The call's own image-processor options (`do_center_crop`, `crop_size`, `size`, `do_resize`),
                which win over the processor's, as they do for the pixels.
        """
        from transformers.image_processing_utils import get_size_dict

        processor = self.image_processor
        setting = {name: options.get(name, getattr(processor, name, None))
                   for name in ("do_center_crop", "crop_size", "size", "do_resize")}  # fmt: skip
        crop = setting["crop_size"]
        if not setting["do_center_crop"] or crop is None:
            return lambda boxes: boxes.clamp(0.0, 1.0)
        crop = get_size_dict(crop, param_name="crop_size") if isinstance(crop, int) else crop
        size = setting["size"]
        size = get_size_dict(size, default_to_square=False) if isinstance(size, int) else size
        shortest = _size_field(size, "shortest_edge")
        if setting["do_resize"] is False:
            resized = (width, height)
        elif shortest is not None:  # the short side becomes `shortest`, the long side keeps the aspect ratio
            short, long = min(width, height), max(width, height)
            resized_long = int(shortest * long / short)
            resized = (shortest, resized_long) if width <= height else (resized_long, shortest)
        elif _size_field(size, "height") is not None:
            resized = (_size_field(size, "width"), _size_field(size, "height"))
        else:
            resized = (width, height)
        crop_width, crop_height = _size_field(crop, "width"), _size_field(crop, "height")
        left, top = (resized[0] - crop_width) // 2, (resized[1] - crop_height) // 2
        scale = torch.tensor([resized[0] / crop_width, resized[1] / crop_height] * 2)
        offset = torch.tensor([left / crop_width, top / crop_height] * 2)
        return lambda boxes: (boxes * scale - offset).clamp(0.0, 1.0)

    @staticmethod
    def _box_rows(boxes: BoxesInput, count: int) -> list[torch.Tensor]:
        rows = [torch.as_tensor(b, dtype=torch.float32).reshape(-1, 4) for b in boxes]
        if len(rows) != count:
            raise ValueError(f"Got {count} images but boxes for {len(rows)}; pass one list of boxes per image")
        for index, row in enumerate(rows):
            if row.shape[0] == 0:
                raise ValueError(f"Image {index} has no boxes; every image needs at least one region")
            if bool(((row < 0) | (row > 1)).any()) or bool((row[:, 2:] < row[:, :2]).any()):
                raise ValueError(
                    f"Boxes of image {index} must be normalised x1, y1, x2, y2 in [0, 1] with x1 <= x2, y1 <= y2; "
                    f"got {row.tolist()[:3]}"
                )
        return rows

    def _padded_boxes(self, boxes: BoxesInput, sizes: list[tuple[int, int]], options: dict) -> dict[str, torch.Tensor]:
        rows = self._box_rows(boxes, len(sizes))
        rows = [self.frame_transform(*size, **options)(row) for row, size in zip(rows, sizes)]
        return self._pad(rows, {})

    def _padded_features(self, features: Sequence, boxes: BoxesInput) -> dict[str, torch.Tensor]:
        arrays = [torch.as_tensor(f, dtype=torch.float32) for f in features]
        rows = self._box_rows(boxes, len(arrays))
        for index, (array, row) in enumerate(zip(arrays, rows)):
            if array.dim() != 2 or array.shape[0] != row.shape[0]:
                raise ValueError(
                    f"Image {index}: region_features of shape {tuple(array.shape)} for {row.shape[0]} boxes; expected "
                    f"({row.shape[0]}, feature width)"
                )
        return self._pad(rows, {"region_features": arrays})

    @staticmethod
    def _pad(rows: list[torch.Tensor], extra: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Pad per-image boxes (and per-region tensors) to the largest count, with a `region_mask`."""
        count = max(row.shape[0] for row in rows)
        out = {"region_boxes": torch.zeros(len(rows), count, 4), "region_mask": torch.zeros(len(rows), count).long()}
        for name, tensors in extra.items():
            out[name] = torch.zeros(len(rows), count, tensors[0].shape[-1])
        for index, row in enumerate(rows):
            out["region_boxes"][index, : row.shape[0]] = row
            out["region_mask"][index, : row.shape[0]] = 1
            for name, tensors in extra.items():
                out[name][index, : row.shape[0]] = tensors[index]
        return out


__all__ = ["XGPTProcessor"]
