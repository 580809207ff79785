"""Visual Genome region descriptions (`region_descriptions.json`) to `datasets.Dataset`, for pre-training.

Format: a list of `{"id": <image id>, "regions": [{"region_id", "image_id", "phrase", "x", "y", "width",
"height"}, ...]}`. Images live in `VG_100K/` and `VG_100K_2/` under the image root; `image_data.json` (optional) maps
image ids to URLs whose last two path parts are that folder and the file name.

One row per image; its region phrases become `captions` after this cleanup (documented in `load_visual_genome`):
whitespace collapsed and trimmed, a trailing period dropped, empty phrases dropped, and duplicates (compared
case-insensitively) removed keeping the first occurrence, in file order.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ._common import (
    DataFormatError,
    OnMissing,
    absolute,
    check_files,
    check_on_missing,
    check_split_sizes,
    image_id_text,
    normalise_split,
    read_json,
    rows_to_dataset,
)

#: Visual Genome 1.2 / 1.4: 108,077 images (the paper pre-trains on VG's ~110k images).
VISUAL_GENOME_IMAGES = 108_077
VG_FOLDERS: tuple[str, ...] = ("VG_100K", "VG_100K_2")
_SPACES = re.compile(r"\s+")


def clean_phrase(phrase: str) -> str:
    """Collapse whitespace, trim, drop one trailing period: `"a man  riding a horse ."` -> "a man riding a horse"."""
    phrase = _SPACES.sub(" ", phrase).strip()
    if phrase.endswith("."):
        phrase = phrase[:-1].rstrip()
    return phrase


def load_visual_genome(
    region_descriptions_json: str | os.PathLike,
    image_root: str | os.PathLike | None = None,
    *,
    image_data_json: str | os.PathLike | None = None,
    max_captions_per_image: int | None = None,
    on_missing: OnMissing = "report",
    check_counts: bool = True,
    split: str | None = None,
):
    """Load Visual Genome region descriptions as one `Dataset` (split `train`; VG is used for pre-training).

    Columns: `image_id`, `image_path`, `captions` (the cleaned, de-duplicated region phrases), `split` (`train`),
    `boxes` (`[x, y, width, height]` of the region each caption came from, aligned with `captions`).

    Phrase cleanup: whitespace is collapsed and trimmed, one trailing period is dropped, empty phrases are dropped,
    and a phrase equal to an earlier one of the same image (ignoring case) is dropped; order follows the file.
    Images left with no phrase are dropped (they carry no caption to learn from).

    Args:
        region_descriptions_json: `region_descriptions.json`.
        image_root: Directory holding `VG_100K/` and `VG_100K_2/`; defaults to the JSON file's directory.
        image_data_json: Optional `image_data.json`; the last two parts of each image's `url` give its folder and
            file. Without it, `VG_100K/<id>.jpg`, then `VG_100K_2/<id>.jpg`, then `<id>.jpg` are tried.
        max_captions_per_image: Keep at most this many phrases per image (the first ones); None keeps all.
        on_missing: `"report"` drops rows whose image is missing or empty and warns `UnusableImagesWarning`;
            `"error"` raises `UnusableImagesError`. Both list the paths.
        check_counts: Warn `SplitSizeWarning` when the number of images differs from VG 1.2's 108,077.
        split: Only `train` (or None) is accepted: Visual Genome has no caption evaluation splits.

    Raises:
        FileNotFoundError: a JSON file does not exist.
        DataFormatError: a file is not in the Visual Genome format (names the entry index and field).
        UnusableImagesError: with `on_missing="error"`, when images are missing or empty.
    """
    region_descriptions_json = Path(region_descriptions_json)
    image_data = read_json(image_data_json) if image_data_json is not None else None
    return visual_genome_from_data(
        read_json(region_descriptions_json),
        region_descriptions_json,
        image_root,
        image_data=image_data,
        image_data_source=str(image_data_json) if image_data_json is not None else None,
        max_captions_per_image=max_captions_per_image,
        on_missing=on_missing,
        check_counts=check_counts,
        split=split,
    )


def looks_like_visual_genome(data: Any) -> bool:
    """Whether parsed JSON `data` is a region descriptions list."""
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "regions" in data[0]


def _image_paths(image_data: Any, source: str, root: Path) -> dict[str, str]:
    if not isinstance(image_data, list):
        raise DataFormatError(f"{source}: expected a list of image records, got a {type(image_data).__name__}")
    paths = {}
    for index, record in enumerate(image_data):
        where = f"{source}: [{index}]"
        if not isinstance(record, dict):
            raise DataFormatError(f"{where}: expected an object, got a {type(record).__name__}")
        image_id = record.get("image_id", record.get("id"))
        if image_id is None:
            raise DataFormatError(f"{where}: field 'image_id' is missing")
        url = record.get("url")
        if not isinstance(url, str) or "/" not in url:
            raise DataFormatError(f"{where}: field 'url' is missing or has no folder/file parts")
        folder, name = url.rstrip("/").split("/")[-2:]
        paths[image_id_text(image_id, where, "image_id")] = str(root / folder / name)
    return paths


def _find_image(root: Path, image_id: str) -> str:
    candidates = [root / folder / f"{image_id}.jpg" for folder in VG_FOLDERS] + [root / f"{image_id}.jpg"]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    return str(candidates[0])


def visual_genome_from_data(
    data: Any,
    json_path: str | os.PathLike,
    image_root: str | os.PathLike | None = None,
    *,
    image_data: Any = None,
    image_data_source: str | None = None,
    max_captions_per_image: int | None = None,
    on_missing: OnMissing = "report",
    check_counts: bool = True,
    split: str | None = None,
):
    """`load_visual_genome` on already-parsed JSON (`data` read from `json_path`, `image_data` if any)."""
    check_on_missing(on_missing)
    source = str(json_path)
    if split is not None and normalise_split(split, source) != "train":
        raise ValueError(f"{source}: Visual Genome region descriptions only have a train split; got split={split!r}")
    if max_captions_per_image is not None and max_captions_per_image < 1:
        raise ValueError(f"max_captions_per_image must be at least 1; got {max_captions_per_image}")
    root = absolute(image_root if image_root is not None else Path(json_path).parent)
    known_paths = _image_paths(image_data, image_data_source or "image_data.json", root) if image_data else None
    if not isinstance(data, list):
        raise DataFormatError(
            f"{source}: expected a list of {{'id', 'regions'}} objects (Visual Genome region descriptions), "
            f"got a {type(data).__name__}"
        )
    rows = []
    seen_ids: dict[str, int] = {}
    for index, entry in enumerate(data):
        where = f"{source}: [{index}]"
        if not isinstance(entry, dict):
            raise DataFormatError(f"{where}: expected an object, got a {type(entry).__name__}")
        regions = entry.get("regions")
        if not isinstance(regions, list):
            raise DataFormatError(
                f"{where}: field 'regions' is {'missing' if 'regions' not in entry else 'not a list'}"
            )
        image_id = entry.get("id", entry.get("image_id"))
        if image_id is None and regions and isinstance(regions[0], dict):
            image_id = regions[0].get("image_id")
        if image_id is None:
            raise DataFormatError(f"{where}: field 'id' is missing (and no region names its image_id)")
        image_id = image_id_text(image_id, where)
        if image_id in seen_ids:
            raise DataFormatError(f"{where}: image id {image_id!r} already used by [{seen_ids[image_id]}]")
        seen_ids[image_id] = index
        captions, boxes, seen = [], [], set()
        for number, region in enumerate(regions):
            if not isinstance(region, dict) or not isinstance(region.get("phrase"), str):
                raise DataFormatError(f"{where}: regions[{number}] has no 'phrase' string")
            phrase = clean_phrase(region["phrase"])
            key = phrase.lower()
            if not phrase or key in seen:
                continue
            seen.add(key)
            try:
                box = [int(region.get(name, 0)) for name in ("x", "y", "width", "height")]
            except (TypeError, ValueError):
                raise DataFormatError(f"{where}: regions[{number}] has a non-numeric x/y/width/height") from None
            captions.append(phrase)
            boxes.append(box)
            if max_captions_per_image is not None and len(captions) >= max_captions_per_image:
                break
        if not captions:
            continue
        if known_paths is not None:
            if image_id not in known_paths:
                raise DataFormatError(f"{where}: image id {image_id} is not in {image_data_source}")
            path = known_paths[image_id]
        else:
            path = _find_image(root, image_id)
        rows.append({"image_id": image_id, "image_path": path, "captions": captions, "split": "train", "boxes": boxes})
    if check_counts:
        check_split_sizes(
            {"images": len(data)}, {"images": VISUAL_GENOME_IMAGES}, source=source, what="Visual Genome 1.2"
        )
    rows, _ = check_files(rows, on_missing=on_missing, source=source, image_root=str(root))
    from datasets import List, Value

    return rows_to_dataset(rows, {"boxes": List(List(Value("int32")))})
