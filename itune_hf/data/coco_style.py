"""COCO-style caption annotation JSON (NoCaps val/test, COCO `captions_*2014.json`) to `datasets.Dataset`.

Format: `{"images": [{"id": 0, "file_name": "...jpg", "domain": "in-domain" | "near-domain" | "out-domain", ...}],
"annotations": [{"image_id": 0, "caption": "...", "id": 0}, ...]}`. NoCaps images carry the `domain` tag, kept as a
column; the NoCaps test file has no captions (its `annotations` are absent), so every `captions` list is empty.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import (
    DataFormatError,
    OnMissing,
    absolute,
    check_files,
    check_on_missing,
    check_split_sizes,
    drop_empty_captions,
    image_id_text,
    normalise_split,
    read_json,
    rows_to_dataset,
    unique_ids,
)
from .boxes import attach_instance_boxes, boxes_feature

#: NoCaps v0.1 (nocaps.org): val 4,500 images (648 in / 2,938 near / 914 out-domain), test 10,600 (1,311 / 7,406 /
#: 1,883); 10 captions per image.
NOCAPS_SIZES: dict[str, dict[str, int]] = {
    "val": {"total": 4_500, "in-domain": 648, "near-domain": 2_938, "out-domain": 914},
    "test": {"total": 10_600, "in-domain": 1_311, "near-domain": 7_406, "out-domain": 1_883},
}
NOCAPS_DOMAINS: tuple[str, ...] = ("in-domain", "near-domain", "out-domain")
#: COCO 2014 caption files: `captions_train2014.json` and `captions_val2014.json`.
COCO2014_SIZES: dict[str, int] = {"train": 82_783, "val": 40_504}


def load_nocaps(
    annotations_json: str | os.PathLike,
    image_root: str | os.PathLike | None = None,
    *,
    split: str | None = None,
    domain: str | None = None,
    on_missing: OnMissing = "report",
    check_counts: bool = True,
    allow_outside_root: bool = False,
):
    """Load NoCaps (`nocaps_val_4500_captions.json`, or the test image info) as one `Dataset`.

    Columns: `image_id`, `image_path` (`<image_root>/<file_name>`), `captions` (the 10 references, in annotation
    order; empty for the test split), `split`, `domain` (`in-domain`, `near-domain` or `out-domain`).

    Args:
        annotations_json: The NoCaps annotation (or image info) file.
        image_root: Directory holding the images named by `file_name`; defaults to the JSON file's directory.
        split: `val` or `test`; None infers it from the file name (`test` in the name means test, else val).
            Only used for the size check and the `split` column: one NoCaps file is one split.
        domain: Keep only images of this domain (`in-domain`, `near-domain`, `out-domain`); None keeps all.
        on_missing: `"report"` drops rows whose image is missing or empty and warns `UnusableImagesWarning`;
            `"error"` raises `UnusableImagesError`. Both list the paths.
        check_counts: Warn `SplitSizeWarning` when the image count or a domain count differs from NoCaps v0.1.
        allow_outside_root: Read images the file places outside `image_root` (`..`, absolute paths, symlinks out
            of it; `--allow-outside-image-root`); by default such a file is refused with `DataError`, naming the entry.

    Raises:
        FileNotFoundError: `annotations_json` does not exist.
        DataFormatError: the file is not COCO-style JSON, or an image has no `domain` (names the entry).
        UnusableImagesError: with `on_missing="error"`, when images are missing or empty.
    """
    annotations_json = Path(annotations_json)
    return coco_style_from_data(
        read_json(annotations_json),
        annotations_json,
        image_root,
        split=split,
        domain=domain,
        on_missing=on_missing,
        check_counts=check_counts,
        allow_outside_root=allow_outside_root,
        nocaps=True,
    )


def load_coco_captions(
    annotations_json: str | os.PathLike,
    image_root: str | os.PathLike | None = None,
    *,
    split: str | None = None,
    on_missing: OnMissing = "report",
    check_counts: bool = True,
    allow_outside_root: bool = False,
    instances: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
):
    """Load any COCO-style caption annotation file (e.g. `captions_val2014.json`) as one `Dataset`.

    Same columns as `load_nocaps`; `domain` is kept when the images have one. Image ids without captions keep an
    empty `captions` list; captions whose `image_id` is not among the images raise `DataFormatError`. With
    `instances`, a `boxes` column holds each image's object boxes, normalised `[x1, y1, x2, y2]` floats in [0, 1].

    Args:
        annotations_json: The annotation file.
        image_root: Directory holding the images named by `file_name`; defaults to the JSON file's directory.
        split: The split name written into the `split` column (and used for the size check); None infers it from
            the file name (`train`, `val`/`valid`/`dev` or `test` in the name), else `test`.
        on_missing: `"report"` (drop and warn, listing paths) or `"error"` (raise, listing paths).
        check_counts: Warn when a COCO 2014 file (`captions_{train,val}2014.json`) has an unexpected size.
        allow_outside_root: Read images the file places outside `image_root` (`..`, absolute paths, symlinks out
            of it; `--allow-outside-image-root`); by default such a file is refused with `DataError`, naming the entry.
        instances: COCO instance annotations (`instances_val2014.json`, or a list of files) giving the `boxes`
            column, matched on the image id; every loaded image must be in them (see `read_instance_boxes`).
    """
    annotations_json = Path(annotations_json)
    return coco_style_from_data(
        read_json(annotations_json),
        annotations_json,
        image_root,
        split=split,
        on_missing=on_missing,
        check_counts=check_counts,
        allow_outside_root=allow_outside_root,
        nocaps=False,
        instances=instances,
    )


def default_split(path: str | os.PathLike, *, nocaps: bool) -> str:
    """The split a COCO-style file holds, from its name (`test`, `val`/`valid`/`dev`, `train`); else NoCaps files
    are `val` and others `test`."""
    return _split_from_name(Path(path), "val" if nocaps else "test")


def _split_from_name(path: Path, default: str) -> str:
    name = path.name.lower()
    for pattern, split in (("test", "test"), ("val|valid|dev", "val"), ("train", "train")):
        if re.search(rf"(^|[^a-z])({pattern})", name):
            return split
    return default


def looks_like_coco_style(data: Any) -> bool:
    """Whether parsed JSON `data` is COCO-style caption annotations: an `images` list whose first image has a
    `file_name`, or an `annotations` field (NoCaps is COCO-style too; a Karpathy file is detected before)."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        return False
    first = data["images"][0] if data["images"] else {}
    return isinstance(first, dict) and "file_name" in first or "annotations" in data


def looks_like_nocaps(data: Any, path: str | os.PathLike | None = None) -> bool:
    """Whether parsed COCO-style `data` is NoCaps (an image carries a `domain`, or the file name says nocaps)."""
    images = data.get("images") if isinstance(data, dict) else None
    if isinstance(images, list) and any(isinstance(image, dict) and "domain" in image for image in images):
        return True
    return path is not None and "nocaps" in Path(path).name.lower()


def coco_style_from_data(
    data: Any,
    json_path: str | os.PathLike,
    image_root: str | os.PathLike | None = None,
    *,
    split: str | None = None,
    domain: str | None = None,
    on_missing: OnMissing = "report",
    check_counts: bool = True,
    allow_outside_root: bool = False,
    nocaps: bool = False,
    instances: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
):
    """`load_nocaps` (`nocaps=True`) / `load_coco_captions` on already-parsed JSON `data` read from `json_path`
    (`instances`: see `load_coco_captions`)."""
    check_on_missing(on_missing)
    json_path = Path(json_path)
    source = str(json_path)
    if split is None:
        split = _split_from_name(json_path, "val" if nocaps else "test")
    split = normalise_split(split, source)
    if domain is not None and domain not in NOCAPS_DOMAINS:
        raise ValueError(f"domain must be one of {', '.join(NOCAPS_DOMAINS)}; got {domain!r}")
    root = absolute(image_root if image_root is not None else json_path.parent)
    rows, has_domain = parse_coco_style(data, source, root, split, require_domain=nocaps)
    drop_empty_captions(rows, source, stacklevel=4)
    unique_ids(rows, source)
    if check_counts:
        if nocaps and split in NOCAPS_SIZES:
            expected = NOCAPS_SIZES[split]
            found = Counter(row["domain"] for row in rows)
            found["total"] = len(rows)
            check_split_sizes(dict(found), expected, source=source, what=f"NoCaps {split}", stacklevel=4)
        else:
            match = re.search(r"captions_(train|val)2014", json_path.name)
            if match:
                key = match.group(1)
                check_split_sizes(
                    {key: len(rows)}, {key: COCO2014_SIZES[key]}, source=source, what="COCO 2014", stacklevel=4
                )
    if domain is not None:
        rows = [row for row in rows if row["domain"] == domain]
    rows, _ = check_files(
        rows, on_missing=on_missing, source=source, image_root=str(root), allow_outside_root=allow_outside_root
    )
    extra = {}
    if has_domain:
        from datasets import Value

        extra["domain"] = Value("string")
    else:
        for row in rows:
            row.pop("domain", None)
    if instances is not None:
        attach_instance_boxes(rows, instances, source)
        extra["boxes"] = boxes_feature()
    return rows_to_dataset(rows, extra)


def parse_coco_style(
    data: Any, source: str, image_root: Path, split: str, *, require_domain: bool
) -> tuple[list[dict[str, Any]], bool]:
    """Validate COCO-style `data`; return one row per image (file order) and whether images carry `domain`."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        got = type(data).__name__ if not isinstance(data, dict) else "an object without an 'images' list"
        raise DataFormatError(
            f"{source}: expected a COCO-style object with 'images' (and 'annotations') lists, got {got}"
        )
    rows = []
    by_id: dict[Any, dict[str, Any]] = {}
    has_domain = False
    for index, image in enumerate(data["images"]):
        where = f"{source}: images[{index}]"
        if not isinstance(image, dict):
            raise DataFormatError(f"{where}: expected an object, got a {type(image).__name__}")
        for key in ("id", "file_name"):
            if key not in image:
                raise DataFormatError(f"{where}: field '{key}' is missing")
        if not isinstance(image["file_name"], str) or not image["file_name"]:
            raise DataFormatError(f"{where}: field 'file_name' is not a non-empty string")
        image_domain = image.get("domain")
        if image_domain is not None:
            has_domain = True
            if image_domain not in NOCAPS_DOMAINS:
                raise DataFormatError(
                    f"{where}: field 'domain' is {image_domain!r}, not one of {', '.join(NOCAPS_DOMAINS)}"
                )
        elif require_domain:
            raise DataFormatError(f"{where}: field 'domain' is missing (NoCaps images are in/near/out-domain)")
        row = {
            "image_id": image_id_text(image["id"], where),
            "image_path": str(image_root / image["file_name"]),
            "captions": [],
            "split": split,
            "domain": image_domain or "",
        }
        rows.append(row)
        by_id.setdefault(row["image_id"], row)
    annotations = data.get("annotations", [])
    if not isinstance(annotations, list):
        raise DataFormatError(f"{source}: 'annotations' must be a list, got a {type(annotations).__name__}")
    annotation_ids: dict[Any, int] = {}
    for index, annotation in enumerate(annotations):
        where = f"{source}: annotations[{index}]"
        if not isinstance(annotation, dict):
            raise DataFormatError(f"{where}: expected an object, got a {type(annotation).__name__}")
        if annotation.get("id") is not None:  # a repeated one would count its caption twice (training, references)
            first = annotation_ids.setdefault(json.dumps(annotation["id"]), index)
            if first != index:
                raise DataFormatError(f"{where}: annotation id {annotation['id']!r} is already annotations[{first}]'s")
        for key in ("image_id", "caption"):
            if key not in annotation:
                raise DataFormatError(f"{where}: field '{key}' is missing")
        if not isinstance(annotation["caption"], str):
            raise DataFormatError(f"{where}: field 'caption' is not a string")
        row = by_id.get(image_id_text(annotation["image_id"], where, "image_id"))
        if row is None:
            raise DataFormatError(f"{where}: image_id {annotation['image_id']!r} is not among the images")
        row["captions"].append(annotation["caption"].strip())
    untagged = [index for index, row in enumerate(rows) if not row["domain"]]
    if has_domain and untagged:  # some images tagged, some not (a NoCaps file is read as such wherever a tag is)
        tagged = next(index for index, row in enumerate(rows) if row["domain"])
        raise DataFormatError(
            f"{source}: images[{untagged[0]}]: field 'domain' is missing, while images[{tagged}] has one (NoCaps "
            "images are each in-, near- or out-domain)"
        )
    return rows, has_domain or require_domain
