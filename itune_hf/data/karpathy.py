"""Karpathy split JSON (`dataset_coco.json`, `dataset_flickr30k.json`, `dataset_flickr8k.json`, and the files
`itune make-synthetic` / `itune make-photos` write) to `datasets.Dataset`.

Format: `{"dataset": "coco", "images": [{"filepath": "val2014", "filename": "...jpg", "split": "train" | "restval" |
"val" | "test", "sentences": [{"raw": "...", "tokens": [...]}, ...], "cocoid": 123, ...}, ...]}`. The image of an
entry is `<image_root>/<filepath>/<filename>` (Flickr entries have no `filepath`).

Entries may list `objects` with a pixel `bbox` `[x1, y1, x2, y2]` each (the synthetic world does); their images'
size is the entry's `width`/`height`, else the file's `generator.image_size`, else read from the image header.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import (
    SPLIT_ALIASES,
    SPLITS,
    DataFormatError,
    OnMissing,
    UnreadableTextWarning,
    absolute,
    check_files,
    check_on_missing,
    check_split_sizes,
    drop_empty_captions,
    image_id_text,
    normalise_split,
    read_json,
    split_rows,
    unique_ids,
)
from .boxes import attach_instance_boxes, boxes_feature, entry_image_size, normalise_object_boxes, object_boxes

#: Published Karpathy split sizes (images per split; `restval` counted as train: COCO 82,783 + 30,504).
KARPATHY_SPLIT_SIZES: dict[str, dict[str, int]] = {
    "coco": {"train": 113_287, "val": 5_000, "test": 5_000},
    "flickr30k": {"train": 29_000, "val": 1_014, "test": 1_000},
    "flickr8k": {"train": 6_000, "val": 1_000, "test": 1_000},
}
_DISPLAY = {"coco": "COCO", "flickr30k": "Flickr30k", "flickr8k": "Flickr8k"}


def looks_like_karpathy(data: Any) -> bool:
    """Whether parsed JSON `data` is a Karpathy split file: its first image has `sentences` or `filename` (an empty
    `images` list counts when there is a `dataset` field and no COCO `annotations`)."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        return False
    if not data["images"]:
        return "dataset" in data and "annotations" not in data
    first = data["images"][0]
    return isinstance(first, dict) and ("sentences" in first or "filename" in first)


def detect_karpathy_kind(data: dict[str, Any], json_path: str | os.PathLike | None = None) -> str | None:
    """`coco`, `flickr30k` or `flickr8k` from the JSON's `dataset` field (or, where it has none, the file name:
    `dataset_coco.json`), else None. A `dataset` field naming another dataset is never overruled by the file name
    (`cocoa_recipes.json` with `"dataset": "mytest"` is not COCO)."""
    name = str(data.get("dataset", "")).strip().lower().replace("-", "").replace("_", "")
    if name in KARPATHY_SPLIT_SIZES:
        return name
    if json_path is not None and not name:
        match = re.search(r"(?<![a-z])(coco|flickr30k|flickr8k)(?![a-z])", Path(json_path).name.lower())
        if match:
            return match.group(1)
    return None


def load_karpathy(
    json_path: str | os.PathLike,
    image_root: str | os.PathLike | None = None,
    *,
    split: str | None = None,
    on_missing: OnMissing = "report",
    check_counts: bool = True,
    allow_outside_root: bool = False,
    instances: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    caption_field: str | None = None,
):
    """Load a Karpathy split JSON as a `DatasetDict` (train/val/test) or, with `split`, one `Dataset`.

    Columns: `image_id` (the COCO id, else the file name without extension), `image_path` (absolute),
    `captions` (the raw sentences), `split` (`train`, `val` or `test`; `restval` is train), and `boxes` when the
    file's entries list `objects` (as the synthetic world's do) or `instances` is given: per image, its object
    boxes as normalised `[x1, y1, x2, y2]` floats in [0, 1] (`List(List(float32))`; an empty list for an image
    without objects). Every split of a file has the same columns.

    Args:
        json_path: The Karpathy JSON file.
        image_root: Directory the entries' `filepath/filename` are relative to (for COCO, the folder holding
            `train2014/` and `val2014/`). Defaults to the JSON file's directory (where `itune make-synthetic` and
            `itune make-photos` put their images).
        split: `train`, `val` or `test` (aliases: `validation`, `dev`, `restval`); None loads every split.
        on_missing: What to do with images that do not exist or are empty files (a cheap check, no decoding; see
            `verify_images` for that): `"report"` drops their rows and warns `UnusableImagesWarning` listing the
            paths; `"error"` raises `UnusableImagesError` listing them.
        check_counts: Warn `SplitSizeWarning` when a split of COCO / Flickr30k / Flickr8k (detected from the
            `dataset` field or the file name) does not have its published Karpathy size.
        allow_outside_root: Read images the file places outside `image_root` (`..`, absolute paths, symlinks out
            of it; `--allow-outside-image-root`); by default such a file is refused with `DataError`, naming the entry.
        instances: COCO instance annotations (`instances_train2014.json`, ..., or a list of them): the `boxes`
            column comes from their `bbox`es, matched on the COCO id (`cocoid`), instead of the entries' `objects`.
            Every loaded image must be in one of the files (see `read_instance_boxes`).
        caption_field: The entry field holding the captions (a string or a list of strings) in place of
            `sentences`, e.g. `alt_text` in `itune make-clipart`'s dataset.json (`--caption-column`).

    Raises:
        FileNotFoundError: `json_path` (or an `instances` file) does not exist.
        DataFormatError: the file is not JSON or not in the Karpathy format (names the entry index and field), an
            entry lacks `caption_field` or holds something else in it, an object box lies outside its image, or an
            image is not in the `instances` files.
        UnusableImagesError: with `on_missing="error"`, when images are missing or empty.
    """
    json_path = Path(json_path)
    return karpathy_from_data(
        read_json(json_path),
        json_path,
        image_root,
        split=split,
        on_missing=on_missing,
        check_counts=check_counts,
        allow_outside_root=allow_outside_root,
        instances=instances,
        caption_field=caption_field,
    )


def karpathy_from_data(
    data: Any,
    json_path: str | os.PathLike,
    image_root: str | os.PathLike | None = None,
    *,
    split: str | None = None,
    on_missing: OnMissing = "report",
    check_counts: bool = True,
    allow_outside_root: bool = False,
    instances: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    caption_field: str | None = None,
):
    """`load_karpathy` on already-parsed JSON `data` (read from `json_path`, named in messages)."""
    check_on_missing(on_missing)
    source = str(json_path)
    wanted = normalise_split(split, source) if split is not None else None
    root = absolute(image_root if image_root is not None else Path(json_path).parent)
    rows = parse_karpathy(data, source, root, caption_field=caption_field)
    drop_empty_captions(rows, source, stacklevel=4)
    unique_ids(rows, source)
    found: dict[str, int] = {}
    for row in rows:
        found[row["split"]] = found.get(row["split"], 0) + 1
    if check_counts:
        kind = detect_karpathy_kind(data, json_path)
        if kind is not None:
            expected = KARPATHY_SPLIT_SIZES[kind]
            if wanted is not None:
                expected = {wanted: expected[wanted]}
            for name in expected:
                found.setdefault(name, 0)
            check_split_sizes(
                found,
                expected,
                source=source,
                what=f"the Karpathy {_DISPLAY[kind]} split (restval counted as train)",
                stacklevel=4,
            )
    if wanted is not None:
        rows = [row for row in rows if row["split"] == wanted]
    rows, _ = check_files(
        rows, on_missing=on_missing, source=source, image_root=str(root), allow_outside_root=allow_outside_root
    )
    extra = None
    if instances is not None:
        attach_instance_boxes(rows, instances, source)
        extra = {"boxes": boxes_feature()}
    elif any("objects" in entry for entry in data["images"] if isinstance(entry, dict)):  # the file decides
        normalise_object_boxes(rows, source)
        extra = {"boxes": boxes_feature()}
    in_file = [name for name in SPLITS if found.get(name)] + sorted(set(found) - set(SPLITS))
    return split_rows(rows, wanted, extra, splits=in_file)


def read_groups(json_path: str | os.PathLike) -> dict[str, str]:
    """Image id -> near-duplicate group of a Karpathy-format file whose entries name one (`group`, as
    `itune make-clipart` writes); empty for any other file (each image is then its own group).

    Args:
        json_path: The data file (anything else, e.g. a built-in name or a Hugging Face dataset, gives `{}`).
    """
    path = Path(json_path)
    if not path.is_file() or path.suffix != ".json":
        return {}
    data = read_json(path)
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list):
        return {}
    return {
        entry_image_id(entry, f"{path}: images[{index}]"): str(entry["group"])
        for index, entry in enumerate(images)
        if isinstance(entry, dict) and entry.get("group") and "filename" in entry
    }


def entry_image_id(entry: dict[str, Any], where: str) -> str:
    """The `image_id` of a Karpathy entry: its `cocoid`, else its `image_id`, else its file name without extension.

    Args:
        entry: One item of the file's `images` list (with a `filename`).
        where: The entry, for messages (`"dataset.json: images[3]"`).
    """
    if "cocoid" in entry:
        return image_id_text(entry["cocoid"], where, "cocoid")
    if "image_id" in entry:
        return image_id_text(entry["image_id"], where, "image_id")
    return os.path.splitext(os.path.basename(entry["filename"]))[0]


def parse_karpathy(
    data: Any, source: str, image_root: str | os.PathLike, *, caption_field: str | None = None
) -> list[dict[str, Any]]:
    """Validate Karpathy-format `data` and return one row dict per entry (all splits, file order); `caption_field`
    (a string or a list of strings per entry) gives the captions in place of `sentences`."""
    if not isinstance(data, dict):
        raise DataFormatError(
            f"{source}: expected a JSON object with an 'images' list (Karpathy format), got a {type(data).__name__}"
        )
    if "images" not in data:
        raise DataFormatError(f"{source}: no 'images' list (Karpathy format); top-level keys: {sorted(data)[:10]}")
    images = data["images"]
    if not isinstance(images, list):
        raise DataFormatError(f"{source}: 'images' must be a list, got a {type(images).__name__}")
    root = os.fspath(image_root)
    rows, unreadable = [], []
    for index, entry in enumerate(images):
        where = f"{source}: images[{index}]"
        if not isinstance(entry, dict):
            raise DataFormatError(f"{where}: expected an object, got a {type(entry).__name__}")
        filename = entry.get("filename")
        if not isinstance(filename, str) or not filename:
            problem = "missing" if "filename" not in entry else "not a non-empty string"
            raise DataFormatError(f"{where}: field 'filename' is {problem}")
        filepath = entry.get("filepath") or ""
        if not isinstance(filepath, str):
            raise DataFormatError(f"{where}: field 'filepath' is not a string")
        raw_split = entry.get("split")
        if not isinstance(raw_split, str) or raw_split.lower() not in SPLIT_ALIASES:
            problem = "missing" if "split" not in entry else f"{raw_split!r}, not one of train, restval, val, test"
            raise DataFormatError(f"{where}: field 'split' is {problem}")
        if caption_field in (None, "sentences"):
            captions = _sentences(entry, where)
        else:
            captions = _field_captions(entry, caption_field, where)
        if not all(_is_unicode(text) for text in (filename, filepath, *captions)):
            unreadable.append(where)
            continue
        row = {
            "image_id": entry_image_id(entry, where),
            "image_path": os.path.join(root, filepath, filename),
            "captions": captions,
            "split": SPLIT_ALIASES[raw_split.lower()],
        }
        objects = object_boxes(entry, where)
        if objects is not None:  # pixel boxes, normalised once unusable images are dropped
            row.update(_objects=objects, _size=entry_image_size(entry, data))
        rows.append(row)
    _report_unreadable(unreadable, len(images), source)
    return rows


def _is_unicode(text: str) -> bool:
    """Whether `text` is valid Unicode (no lone surrogate, which JSON allows and UTF-8 cannot hold)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _report_unreadable(unreadable: list[str], total: int, source: str) -> None:
    """Warn `UnreadableTextWarning` naming the skipped entries; refuse a file none of whose entries is readable."""
    if not unreadable:
        return
    shown = "; ".join(unreadable[:5]) + ("; ..." if len(unreadable) > 5 else "")
    message = (
        f"{len(unreadable)} of {total} entries skipped: their caption or file name is not valid Unicode (a lone "
        f"surrogate such as \\ud800): {shown}"
    )
    if len(unreadable) == total:
        raise DataFormatError(f"{source}: every entry's text is unreadable; {message}")
    warnings.warn(UnreadableTextWarning(message), stacklevel=3)


def _sentences(entry: dict[str, Any], where: str) -> list[str]:
    """The raw captions of an entry's `sentences`."""
    sentences = entry.get("sentences")
    if not isinstance(sentences, list):
        problem = "missing" if "sentences" not in entry else f"a {type(sentences).__name__}, not a list"
        raise DataFormatError(f"{where}: field 'sentences' is {problem}")
    captions = []
    for number, sentence in enumerate(sentences):
        raw = sentence.get("raw") if isinstance(sentence, dict) else None
        if not isinstance(raw, str):
            raise DataFormatError(f"{where}: sentences[{number}] has no 'raw' string")
        captions.append(raw.strip())
    return captions


def _field_captions(entry: dict[str, Any], field: str, where: str) -> list[str]:
    """The captions an entry holds in `field` (`--caption-column`): a string, or a list of strings."""
    if field not in entry:
        fields = ", ".join(sorted(name for name, value in entry.items() if isinstance(value, (str, list))))
        raise DataFormatError(
            f"{where}: no field {field!r} (--caption-column {field}); its text fields: {fields or 'none'}"
        )
    value = entry[field]
    captions = [value] if isinstance(value, str) else value
    if not isinstance(captions, list) or not all(isinstance(caption, str) for caption in captions):
        raise DataFormatError(
            f"{where}: field {field!r} (--caption-column {field}) must be a string or a list of strings, "
            f"got {type(value).__name__}"
        )
    return [caption.strip() for caption in captions]
