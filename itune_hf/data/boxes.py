"""Object / region boxes of caption datasets, as the XGPT processor and model take them: normalised `[x1, y1, x2, y2]`.

Where boxes come from:

- The synthetic world (and any Karpathy-layout file whose entries list `objects` with a pixel `bbox`): `load_captions`
  adds a `boxes` column, already normalised (`karpathy.py`).
- COCO instance annotations (`instances_*.json`): `load_captions(..., instances=path)` on a Karpathy or COCO-style
  caption file adds the same `boxes` column from them (`read_instance_boxes`, `attach_instance_boxes`).
- Visual Genome: `load_captions` gives each caption's region (its pixel `[x, y, width, height]`, normalised by the
  image's size from `image_data.json` or its header), aligned with `captions` (`visual_genome.py`).

The `boxes` column of every loader is `List(List(float32))`: per image, its object boxes
`[x1, y1, x2, y2]` in [0, 1] (origin top left), possibly empty (an image without annotated objects). The processor
needs at least one box per image: use `[WHOLE_IMAGE_BOX]` for an empty list.

Standard library only (PIL is imported to read an image header when a size is unknown; `datasets` when building
the column type).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._common import DataError, DataFormatError, read_json

__all__ = [
    "WHOLE_IMAGE_BOX",
    "attach_instance_boxes",
    "boxes_feature",
    "image_size_of",
    "normalise_corners",
    "normalise_xywh",
    "read_instance_boxes",
]

#: The box of the whole image, for an image without boxes (the XGPT processor needs at least one per image).
WHOLE_IMAGE_BOX: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)

Box = list[float]


def boxes_feature():
    """The `datasets` type of the normalised `boxes` column: `List(List(Value("float32")))`."""
    from datasets import List, Value

    return List(List(Value("float32")))


def _clip(value: float) -> float:
    return min(1.0, max(0.0, value))


def normalise_xywh(boxes: Iterable[Sequence[float]], width: int, height: int) -> list[Box]:
    """`[x, y, width, height]` pixel boxes (COCO, Visual Genome) as normalised `[x1, y1, x2, y2]`, clipped to [0, 1].

    Args:
        boxes: The pixel boxes (top-left corner and size).
        width: Image width in pixels.
        height: Image height in pixels.

    Raises:
        ValueError: a size is not positive, or a box is not four finite numbers with non-negative width and height.
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive; got {width}x{height}")
    out = []
    for index, box in enumerate(boxes):
        x, y, w, h = four_numbers(box, f"box {index}")
        if w < 0 or h < 0:
            raise ValueError(f"box {index} {list(box)} has a negative width or height")
        out.append([_clip(x / width), _clip(y / height), _clip((x + w) / width), _clip((y + h) / height)])
    return out


def normalise_corners(
    boxes: Iterable[Sequence[float]], width: int, height: int, *, tolerance: float = 1.0
) -> list[Box]:
    """`[x1, y1, x2, y2]` pixel boxes as normalised corners; boxes must lie in the image (up to `tolerance` pixels
    outside, clipped).

    Args:
        boxes: The pixel boxes.
        width: Image width in pixels.
        height: Image height in pixels.
        tolerance: How far (pixels) a corner may lie outside the image before it is an error.

    Raises:
        ValueError: a size is not positive, or a box is not four finite numbers, has x2 < x1 or y2 < y1, or lies
            outside the image (the message names the box).
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive; got {width}x{height}")
    out = []
    for index, box in enumerate(boxes):
        x1, y1, x2, y2 = four_numbers(box, f"box {index}")
        if x2 < x1 or y2 < y1:
            raise ValueError(f"box {index} {list(box)} has x2 < x1 or y2 < y1 (expected x1, y1, x2, y2)")
        if min(x1, y1) < -tolerance or x2 > width + tolerance or y2 > height + tolerance:
            raise ValueError(f"box {index} {list(box)} lies outside the {width}x{height} image")
        out.append([_clip(x1 / width), _clip(y1 / height), _clip(x2 / width), _clip(y2 / height)])
    return out


def four_numbers(box: Any, what: str) -> tuple[float, float, float, float]:
    """`box` as four finite floats.

    Args:
        box: The box, any sequence of numbers.
        what: What it is, for the message (e.g. `"box 3"`).

    Raises:
        ValueError: naming `what`, when `box` is not four finite numbers.
    """
    try:
        values = [float(value) for value in box]
    except (TypeError, ValueError):
        raise ValueError(f"{what} is {box!r}, not four numbers") from None
    if len(values) != 4 or not all(map(math.isfinite, values)):
        raise ValueError(f"{what} is {box!r}, not four finite numbers")
    return values[0], values[1], values[2], values[3]


def image_size_of(path: str | os.PathLike) -> tuple[int, int]:
    """`(width, height)` of an image file, from its header (PIL reads no pixels); EXIF orientation is not applied,
    as annotation boxes refer to the stored pixels.

    Args:
        path: The image file.

    Raises:
        DataError: the file is missing or not an image PIL can identify.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, UnidentifiedImageError) as error:
        raise DataError(f"{path}: cannot read the image size ({error})") from None


def read_instance_boxes(instances: str | os.PathLike | Sequence[str | os.PathLike]) -> dict[str, list[Box]]:
    """Object boxes of COCO instance annotations (`instances_train2014.json`, ...), per image id (a string).

    Each annotation's `bbox` (`[x, y, width, height]` in pixels) is normalised by its image's `width` / `height`
    (from `images`) to `[x1, y1, x2, y2]` in [0, 1] (clipped: COCO boxes may overhang the image by a fraction of a
    pixel); boxes keep the file's annotation order, crowd annotations included. Images without annotations map to
    an empty list.

    Args:
        instances: One instances JSON file, or several (e.g. train2014 and val2014 for the Karpathy COCO split).

    Raises:
        FileNotFoundError: a file does not exist.
        DataFormatError: a file is not COCO instances JSON, or an entry is malformed (names the file, the entry
            index and the field), or two files hold the same image id.
    """
    paths = [instances] if isinstance(instances, (str, os.PathLike)) else list(instances)
    boxes: dict[str, list[Box]] = {}
    origin: dict[str, str] = {}
    for path in paths:
        for image_id, image_boxes in _instance_boxes_of(read_json(path, "instances"), str(path)).items():
            if image_id in boxes:
                raise DataFormatError(f"{path}: image id {image_id} is also in {origin[image_id]}")
            boxes[image_id], origin[image_id] = image_boxes, str(path)
    return boxes


def _instance_boxes_of(data: Any, source: str) -> dict[str, list[Box]]:
    """`read_instance_boxes` of one parsed file."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataFormatError(f"{source}: expected COCO instances JSON, an object with 'images' and 'annotations'")
    annotations = data.get("annotations", [])
    if not isinstance(annotations, list):
        raise DataFormatError(f"{source}: 'annotations' must be a list, got a {type(annotations).__name__}")
    sizes: dict[str, tuple[float, float]] = {}
    for index, image in enumerate(data["images"]):
        where = f"{source}: images[{index}]"
        if not isinstance(image, dict):
            raise DataFormatError(f"{where}: expected an object, got a {type(image).__name__}")
        for key in ("id", "width", "height"):
            if key not in image:
                raise DataFormatError(f"{where}: field '{key}' is missing")
        if not all(isinstance(image[key], (int, float)) and image[key] > 0 for key in ("width", "height")):
            raise DataFormatError(f"{where}: fields 'width' and 'height' must be positive numbers")
        sizes[str(image["id"])] = (image["width"], image["height"])
    boxes: dict[str, list[Box]] = {image_id: [] for image_id in sizes}
    for index, annotation in enumerate(annotations):
        where = f"{source}: annotations[{index}]"
        if not isinstance(annotation, dict) or "image_id" not in annotation or "bbox" not in annotation:
            raise DataFormatError(f"{where}: expected an object with 'image_id' and 'bbox'")
        image_id = str(annotation["image_id"])
        if image_id not in sizes:
            raise DataFormatError(f"{where}: image_id {annotation['image_id']!r} is not among the images")
        try:
            boxes[image_id] += normalise_xywh([annotation["bbox"]], *sizes[image_id])
        except ValueError as error:
            raise DataFormatError(f"{where} (image {image_id}): field 'bbox': {error}") from None
    return boxes


def attach_instance_boxes(
    rows: list[dict[str, Any]], instances: str | os.PathLike | Sequence[str | os.PathLike], source: str
) -> None:
    """Set `row["boxes"]` of every row from COCO instance annotations, matched on `image_id`.

    Args:
        rows: Loader rows (their `image_id` is the COCO image id).
        instances: The instances JSON file(s) (see `read_instance_boxes`).
        source: The caption file, named in the error.

    Raises:
        DataFormatError: some rows' images are not in the instances file(s) (names how many, the first ids and
            the files).
    """
    boxes = read_instance_boxes(instances)
    missing = [row["image_id"] for row in rows if row["image_id"] not in boxes]
    if missing:
        files = ", ".join(map(str, [instances] if isinstance(instances, (str, os.PathLike)) else instances))
        shown = ", ".join(missing[:5]) + (f", ... ({len(missing) - 5:,} more)" if len(missing) > 5 else "")
        raise DataFormatError(
            f"{source}: {len(missing):,} of {len(rows):,} images are not in the instances file(s) {files} "
            f"(image ids {shown}); pass the instances file of every image set the captions use (e.g. "
            "instances_train2014.json and instances_val2014.json for the Karpathy COCO split)"
        )
    for row in rows:
        row["boxes"] = boxes[row["image_id"]]


def object_boxes(entry: Mapping[str, Any], where: str) -> list[list[float]] | None:
    """The pixel `bbox` (`[x1, y1, x2, y2]`) of each of a Karpathy-layout entry's `objects`, or None when the entry
    lists no objects.

    Args:
        entry: One `images[i]` entry (e.g. of a `make_synthetic` `dataset.json`).
        where: The file and entry, named in errors.

    Raises:
        DataFormatError: `objects` is not a list of objects with a four-number `bbox`.
    """
    if "objects" not in entry:
        return None
    objects = entry["objects"]
    if not isinstance(objects, list):
        raise DataFormatError(f"{where}: field 'objects' is a {type(objects).__name__}, not a list")
    boxes = []
    for number, obj in enumerate(objects):
        bbox = obj.get("bbox") if isinstance(obj, dict) else None
        try:
            boxes.append(list(four_numbers(bbox, "bbox")))
        except ValueError as error:
            raise DataFormatError(f"{where}: objects[{number}] field 'bbox': {error}") from None
    return boxes


def entry_image_size(entry: Mapping[str, Any], data: Mapping[str, Any]) -> tuple[int, int] | None:
    """`(width, height)` of a Karpathy-layout entry when the file says it: the entry's `width` / `height`, else the
    `generator.image_size` of a `make_synthetic` file (square images); None otherwise.

    Args:
        entry: One `images[i]` entry.
        data: The whole parsed file.
    """
    if isinstance(entry.get("width"), (int, float)) and isinstance(entry.get("height"), (int, float)):
        return entry["width"], entry["height"]
    generator = data.get("generator")
    if isinstance(generator, dict) and isinstance(generator.get("image_size"), int):
        return generator["image_size"], generator["image_size"]
    return None


def normalise_object_boxes(rows: list[dict[str, Any]], source: str) -> None:
    """Replace the `_objects` (pixel boxes) and `_size` that `parse_karpathy` put in each row by a normalised
    `boxes` list (empty for an entry without objects); the size is read from the image header when the file does not
    give it.

    Args:
        rows: The rows, after unusable images were dropped.
        source: The annotation file, named in errors.

    Raises:
        DataFormatError: a box lies outside its image (names the file, the image id and the box).
    """
    for row in rows:
        pixels = row.pop("_objects", None) or []
        size = row.pop("_size", None)
        if pixels and size is None:
            size = image_size_of(Path(row["image_path"]))
        try:
            row["boxes"] = normalise_corners(pixels, *size, tolerance=0.0) if pixels else []
        except ValueError as error:
            raise DataFormatError(f"{source}: image {row['image_id']} field 'objects': {error}") from None
