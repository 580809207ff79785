"""What a captioner reads of each image, batch by batch: pixels, cached vision states, boxes or precomputed regions.

Training (`CaptionCollator`) and evaluation (`generate_captions`) both build their inputs with `VisualInputs`, so a
model is fed alike in both. What it reads follows its config's `visual_source` (XGPT; every other model reads images):

- `"grid"` (and I-Tuning): `pixel_values` of the images, or their vision-tower states from a feature cache;
- `"boxes"`: the same plus `region_boxes` / `region_mask` from each row's `boxes` (normalised `[x1, y1, x2, y2]`, the
  data's `boxes` column): an image with no boxes gets the whole-image box `[0, 0, 1, 1]` (`WHOLE_IMAGE_BOX`), so it
  still has one region. With a feature cache, the boxes are mapped into the processed frame from the image sizes
  (read from the files' headers), as the processor maps them when it opens the images;
- `"regions"`: `region_features`, `region_boxes` and `region_mask` of `RegionFeatures.get` (no images are opened).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VISUAL_SOURCES = ("grid", "boxes", "regions")
WHOLE_IMAGE = [0.0, 0.0, 1.0, 1.0]
_ROTATED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def visual_source_of(model_or_config: Any) -> str:
    """The visual source of a model (a PEFT model wrapping one, or a config): its config's `visual_source`, `"grid"`
    for models without one (I-Tuning reads images).

    Args:
        model_or_config: A captioning model, a `PeftModel` or a config.
    """
    base = getattr(model_or_config, "get_base_model", None)
    target = base() if callable(base) else model_or_config
    return getattr(getattr(target, "config", target), "visual_source", "grid")


def boxes_or_whole_image(boxes: Sequence[Sequence[float]] | None) -> list[list[float]]:
    """An image's boxes for a model that pools in boxes: the whole image `[0, 0, 1, 1]` when it has none.

    Args:
        boxes: The image's normalised `[x1, y1, x2, y2]` boxes (a row's `boxes`), possibly empty or None.
    """
    return [list(map(float, box)) for box in boxes or ()] or [list(WHOLE_IMAGE)]


def displayed_size(path: Any) -> tuple[int, int]:
    """`(width, height)` of an image as the processors open it (EXIF orientation applied), from its header.

    Args:
        path: The image file (or a binary file object holding it).
    """
    from PIL import Image

    with Image.open(path) as image:
        width, height = image.size
        orientation = image.getexif().get(0x0112)
    return (height, width) if orientation in _ROTATED else (width, height)


def _image_of(item: Mapping[str, Any]) -> Any:
    """What the processor opens of an item: its opened `image`, the dataset's image, or its file."""
    if item.get("image") is not None:
        return item["image"]
    if item.get("image_data") is not None:
        from ..data.verify import open_item_image

        return open_item_image(item)
    return item["image_path"]


def _header_of(item: Mapping[str, Any]) -> Any:
    """The item's image file, or its embedded bytes as a file object (to read the size from)."""
    import io

    from ..data.verify import image_bytes

    data = image_bytes(item)
    return item["image_path"] if data is None else io.BytesIO(data)


@dataclass(frozen=True)
class VisualInputs:
    """How a batch of items (`image_id`, `image_path` and, for `"boxes"`, `boxes`) becomes a model's visual inputs.

    Args:
        source: The model's visual source, one of `VISUAL_SOURCES` (see the module docstring).
        feature_cache: A `FeatureCache` of vision-tower states to read instead of opening the images, or None.
        vision_states_input: The model's keyword for cached vision states (its family's `vision_states_input`).
        regions: The `RegionFeatures` a `"regions"` model reads (required for it, refused for the others).
        prompts: Image id -> the text prompt its caption continues (retrieval augmentation: `vision.datastore`), or
            None; in training the prompt carries no loss.
        prompt_tokens: The most tokens a prompt takes: a training sequence's budget grows by this much.

    Raises:
        ValueError: an unknown source, or inputs the source cannot take (the message says which to drop or add).
    """

    source: str = "grid"
    feature_cache: Any = None
    vision_states_input: str = "encoder_outputs"
    regions: Any = None
    prompts: Any = None
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        if self.source not in VISUAL_SOURCES:
            raise ValueError(f"visual_source must be one of {VISUAL_SOURCES}, got {self.source!r}")
        if self.source == "regions":
            if self.regions is None:
                raise ValueError(
                    "The model reads precomputed regions (visual_source='regions'): pass --region-features PATH"
                )
            if self.feature_cache is not None:
                raise ValueError(
                    "--feature-cache holds vision-tower states, but the model reads precomputed regions and has no "
                    "vision tower: drop --feature-cache"
                )
        elif self.regions is not None:
            raise ValueError(
                f"--region-features {self.regions.path}: the model reads images (visual_source={self.source!r}), "
                "not precomputed regions; drop --region-features"
            )

    @classmethod
    def for_model(cls, model: Any, *, feature_cache: Any = None, regions: Any = None) -> VisualInputs:
        """The inputs `model` reads, checking that `regions` have the width it was built for.

        Args:
            model: A captioning model, a `PeftModel` wrapping one, or its config.
            feature_cache: A `FeatureCache`, or None.
            regions: A `RegionFeatures`, or None.
        """
        states_input = "encoder_outputs"
        if feature_cache is not None:
            from ..models import family_of

            states_input = family_of(model).vision_states_input
        inputs = cls(visual_source_of(model), feature_cache, states_input, regions)
        if regions is not None:
            base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
            width = getattr(getattr(base, "config", base), "region_feature_size", None)
            if width is not None and regions.feature_size != width:
                raise ValueError(
                    f"--region-features {regions.path}: {regions.feature_size}-d features, but the model reads "
                    f"{width}-d region features"
                )
        return inputs

    def check_rows(self, rows: Any, where: str) -> None:
        """Refuse rows without what this source reads: a `boxes` column, or region features for every image.

        Args:
            rows: Dataset rows (`image_id`, and `boxes` for `"boxes"`).
            where: The data they come from, for the message (e.g. `"data/dataset.json (train split)"`).

        Raises:
            ValueError: naming the data and what is missing, or the images a feature cache holds states of other
                image files for (`FeatureCacheMismatch`).
        """
        if self.feature_cache is not None:
            self.feature_cache.check_rows(rows, where)
        if self.source == "boxes" and "boxes" not in rows.column_names:
            raise ValueError(
                f"{where} has no object boxes (no 'boxes' column), which a model with visual_source='boxes' pools "
                "its regions in: use data with boxes (e.g. a synthetic world) or --visual-source grid"
            )
        if self.source == "regions":
            missing = [image_id for image_id in rows["image_id"] if image_id not in self.regions]
            if missing:
                raise ValueError(
                    f"--region-features {self.regions.path} has no features for {len(missing)} of the {len(rows)} "
                    f"images of {where} (e.g. image id {missing[0]!r})"
                )

    def items(self, rows: Any) -> list[dict[str, Any]]:
        """One batch item per row: `image_id`, `image_path`, and `boxes` where the source reads them.

        Args:
            rows: Dataset rows (`image_id`, `image_path`; `boxes` for `"boxes"`: see `check_rows`); a dataset that
                holds its images (an `image` column) gives each item its `image_data`, opened when the batch is made.
        """
        from ..data.verify import image_items

        items = image_items(rows)
        if self.source == "boxes":
            for item, boxes in zip(items, rows["boxes"]):
                item["boxes"] = boxes_or_whole_image(boxes)
        return items

    def __call__(self, processor: Any, items: Sequence[Mapping[str, Any]], **text: Any) -> dict[str, Any]:
        """The model inputs of `items`: the visual inputs plus what the processor makes of `text`.

        Args:
            processor: The model's processor.
            items: Batch items (`image_id`, `image_path`; `boxes` for `"boxes"`, the whole image when absent).
            **text: The processor's text arguments (`captions=` for training, `text=` for generation prompts).
        """
        ids = [item["image_id"] for item in items]
        if self.prompts is not None:
            text = self._with_prompts(processor, ids, text)
        if self.source == "regions":
            batch = dict(processor(**text))
            batch.update(self.regions.get(ids))
            return batch
        boxes = {}
        if self.source == "boxes":
            boxes["boxes"] = [boxes_or_whole_image(item.get("boxes")) for item in items]
        if self.feature_cache is None:
            # a streamed item, or one whose image was opened when fetched, carries it (`image`) instead of a file
            images = [_image_of(item) for item in items]
            return dict(processor(images=images, **text, **boxes))
        if boxes:
            boxes["image_sizes"] = [displayed_size(_header_of(item)) for item in items]
        batch = dict(processor(**text, **boxes))
        batch[self.vision_states_input] = self.feature_cache.get(ids)
        return batch

    def _with_prompts(self, processor: Any, ids: Sequence[str], text: dict[str, Any]) -> dict[str, Any]:
        """`text` with each image's prompt (`text=`), and a training sequence's budget grown by the prompt's."""
        missing = [image_id for image_id in ids if image_id not in self.prompts]
        if missing:
            raise KeyError(f"no retrieval prompt for image {missing[0]!r} (the prompts cover other images)")
        text = {**text, "text": [self.prompts[image_id] for image_id in ids]}
        if text.get("captions") is not None:
            text.update(truncation=True, max_length=processor.max_caption_length + self.prompt_tokens)
        return text

    @property
    def reads_images(self) -> bool:
        """Whether batches open the image files (no feature cache, no precomputed regions)."""
        return self.feature_cache is None and self.source != "regions"

    def open_items(self, processor: Any, items: Sequence[Mapping[str, Any]]) -> tuple[list[dict], list[dict]]:
        """Open each item's image (where this source reads images) so that one unreadable image can be skipped
        instead of failing its whole batch.

        Args:
            processor: The model's processor (its image processor's resize bounds the size, see `open_image`).
            items: Batch items (`image_id`, `image_path`, ...).

        Returns:
            `(kept, skipped)`: the readable items (with their opened `image`), and `{image_id, image_path, reason}`
            for each unreadable one, in order.
        """
        if not self.reads_images:
            return [dict(item) for item in items], []
        from ..data.verify import image_label, open_item_image
        from ..models._shared.images import ImageError, shortest_edge_of

        edge = shortest_edge_of(getattr(processor, "image_processor", None))
        kept, skipped = [], []
        for item in items:
            try:
                kept.append({**item, "image": open_item_image(item, shortest_edge=edge)})
            except ImageError as error:
                skipped.append({"image_id": item["image_id"], "image_path": image_label(item), "reason": error.reason})
        return kept, skipped

    def describe(self) -> str:
        """One line saying what the model read, for results files."""
        if self.source == "regions":
            return self.regions.describe()
        read = "images" if self.feature_cache is None else "cached vision-tower states"
        if self.source == "boxes":
            return f"{read}, regions pooled in each image's boxes (the data's boxes column; none: the whole image)"
        return read


__all__ = ["VISUAL_SOURCES", "VisualInputs", "boxes_or_whole_image", "displayed_size", "visual_source_of"]
