"""COCO captions as coco-caption scores them: results files (predictions) and caption annotations (references).

A results file is what `itune eval` writes and the COCO evaluation server takes: `[{"image_id": 1, "caption": "..."},
...]`, one caption per image. Caption annotations are `{"annotations": [{"image_id": 1, "caption": "..."}, ...],
"images": [{"id": 1, ...}, ...]}` (`captions_val2014.json`); unlike `load_coco_captions` these readers need no image
files, keep image ids as the JSON numbers or strings they are, and keep captions as written.

Errors are `DataFormatError`s of one line naming the file, the entry and the field.
"""

from __future__ import annotations

import os
from typing import Any

from ._common import DataFormatError, read_json

__all__ = ["ImageId", "read_coco_references", "read_coco_results"]

#: An image id as JSON gives it: a number (1 and 1.0 are the same id) or a string.
ImageId = int | float | str


def read_coco_results(path: str | os.PathLike, role: str = "predictions") -> dict[ImageId, str]:
    """Image id -> caption from a COCO results file, in file order.

    Args:
        path: JSON file: a list of {"image_id": ..., "caption": ...} objects, one per image.
        role: What the file is, for the message when it is missing.

    Raises:
        FileNotFoundError: No such file.
        DataFormatError: Not JSON, not a list of such objects, a field missing or of the wrong type, an image with
            two captions, or no entry at all (names the entry and field).
    """
    data = read_json(path, role)
    if isinstance(data, dict) and "annotations" in data:
        raise DataFormatError(
            f'{path}: expected COCO results (a list of {{"image_id", "caption"}} objects), got an object with '
            '"annotations": COCO caption annotations (references), not results; were the two files swapped?'
        )
    if not isinstance(data, list):
        raise DataFormatError(
            f'{path}: expected COCO results, a list of {{"image_id", "caption"}} objects; got {_describe(data)}'
        )
    predictions: dict[ImageId, str] = {}
    first_entry: dict[ImageId, int] = {}
    for index, entry in enumerate(data):
        key, caption = _id_and_caption(path, f"entry {index}", entry, 'an object {"image_id", "caption"}')
        if key in predictions:
            raise DataFormatError(
                f"{path}: duplicate prediction for image_id {entry['image_id']!r} (entries {first_entry[key]} and "
                f"{index}); give one caption per image"
            )
        predictions[key] = caption
        first_entry[key] = index
    if not predictions:
        raise DataFormatError(f"{path}: no predictions (the list is empty)")
    return predictions


def read_coco_references(path: str | os.PathLike, role: str = "references") -> dict[ImageId, list[str]]:
    """Image id -> reference captions from COCO caption annotations, in the order of its "images" list.

    Images listed in "images" without a caption are left out; captioned images not in "images" come last, in
    annotation order (coco-caption's order only matters at the tokeniser's caption boundaries).

    Args:
        path: JSON file: {"annotations": [{"image_id": ..., "caption": ...}, ...], "images": [{"id": ...}, ...]}
            ("images" is optional).
        role: What the file is, for the message when it is missing.

    Raises:
        FileNotFoundError: No such file.
        DataFormatError: Not JSON, no "annotations" list, a field missing or of the wrong type, or no caption at
            all (names the entry and field).
    """
    data = read_json(path, role)
    if isinstance(data, list):
        raise DataFormatError(
            f'{path}: expected COCO caption annotations, an object with an "annotations" list; got a list (a COCO '
            "results file? were the two files swapped?)"
        )
    if not isinstance(data, dict):
        raise DataFormatError(
            f'{path}: expected COCO caption annotations, an object with "annotations"; got {_describe(data)}'
        )
    if "annotations" not in data:
        raise DataFormatError(f'{path}: no "annotations" field (COCO caption annotations format)')
    annotations = data["annotations"]
    if not isinstance(annotations, list):
        raise DataFormatError(f'{path}: "annotations" must be a list, got {_describe(annotations)}')
    references: dict[ImageId, list[str]] = {}
    for index, entry in enumerate(annotations):
        key, caption = _id_and_caption(path, f"annotations[{index}]", entry, "an object")
        references.setdefault(key, []).append(caption)
    if not references:
        raise DataFormatError(f'{path}: no captions ("annotations" is empty)')
    images = data.get("images")
    if isinstance(images, list):
        ids = [image.get("id") for image in images if isinstance(image, dict)]
        order = [_id_key(value) for value in ids if _is_id(value)]
        ordered = {key: references[key] for key in dict.fromkeys(order) if key in references}
        ordered.update((key, refs) for key, refs in references.items() if key not in ordered)
        references = ordered
    return references


def _id_and_caption(path: str | os.PathLike, where: str, entry: Any, expected: str) -> tuple[ImageId, str]:
    """The image id and caption of one entry, validated; `where` ("entry 3") and `expected` go into messages."""
    if not isinstance(entry, dict):
        raise DataFormatError(f"{path}: {where} must be {expected}, got {_describe(entry)}")
    for name in ("image_id", "caption"):
        if name not in entry:
            raise DataFormatError(f'{path}: {where} has no "{name}" field')
    if not _is_id(entry["image_id"]):
        raise DataFormatError(
            f'{path}: {where}: "image_id" must be a number or a string, got {_describe(entry["image_id"])}'
        )
    caption = entry["caption"]
    if not isinstance(caption, str):
        raise DataFormatError(f'{path}: {where}: "caption" must be a string, got {_describe(caption)}')
    return _id_key(entry["image_id"]), caption


def _is_id(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _id_key(value: ImageId) -> ImageId:
    """Image ids as dictionary keys: JSON numbers and strings as they are (1 and 1.0 are the same id)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _describe(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", type(None): "null"}
    return names.get(type(value), type(value).__name__)
