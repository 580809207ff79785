"""Visual Genome region descriptions (`region_descriptions.json`) to `datasets.Dataset`, for pre-training.

Format: a list of `{"id": <image id>, "regions": [{"region_id", "image_id", "phrase", "x", "y", "width",
"height"}, ...]}`. Images live in `VG_100K/` and `VG_100K_2/` under the image root; `image_data.json` (optional) maps
image ids to URLs whose last two path parts are that folder and the file name.

One row per image; its region phrases become `captions` after this cleanup (documented in `load_visual_genome`):
whitespace collapsed and trimmed, a trailing period dropped, empty phrases dropped, and duplicates (compared
case-insensitively) removed keeping the first occurrence, in file order.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
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
from .boxes import WHOLE_IMAGE_BOX, boxes_feature, four_numbers, image_size_of, normalise_xywh

logger = logging.getLogger(__name__)


class CocoOverlapWarning(UserWarning):
    """Visual Genome is loaded without the Karpathy split file, so its COCO val/test images are not dropped."""


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
    exclude_coco_split: str | os.PathLike | None = None,
    max_captions_per_image: int | None = None,
    on_missing: OnMissing = "report",
    check_counts: bool = True,
    allow_outside_root: bool = False,
    split: str | None = None,
):
    """Load Visual Genome region descriptions as one `Dataset` (split `train`; VG is used for pre-training).

    About 50k VG images are COCO images, some of them in the Karpathy val/test splits captioners are evaluated on;
    pre-training on those would show the model test images. They are dropped (`exclude_coco_split`, on by default
    when `dataset_coco.json` lies beside the regions file) and the count is logged and written into the dataset's
    `info.description`.

    Columns: `image_id`, `image_path`, `captions` (the cleaned, de-duplicated region phrases), `split` (`train`),
    `boxes` (the region each caption came from, aligned with `captions`, as every loader's boxes are: normalised
    `[x1, y1, x2, y2]` clipped to the image; the whole image for a region without coordinates). The image sizes come
    from `image_data.json` where given (its `width` / `height`), else from each image's header.

    Phrase cleanup: whitespace is collapsed and trimmed, one trailing period is dropped, empty phrases are dropped,
    and a phrase equal to an earlier one of the same image (ignoring case) is dropped; order follows the file.
    Images left with no phrase are dropped (they carry no caption to learn from).

    Args:
        region_descriptions_json: `region_descriptions.json`.
        image_root: Directory holding `VG_100K/` and `VG_100K_2/`; defaults to the JSON file's directory.
        image_data_json: Optional `image_data.json`; the last two parts of each image's `url` give its folder and
            file, its `coco_id` the COCO image, its `width` / `height` the size the boxes are normalised by. Without
            it, `VG_100K/<id>.jpg`, then `VG_100K_2/<id>.jpg`, then
            `<id>.jpg` are tried.
        exclude_coco_split: The Karpathy COCO split file (`dataset_coco.json`): VG images whose `coco_id` is one of
            its val or test images are dropped (needs `image_data_json`). None looks for `dataset_coco.json` beside
            the regions file and warns `CocoOverlapWarning` when there is none; `"none"` keeps them, knowingly.
        max_captions_per_image: Keep at most this many phrases per image (the first ones); None keeps all.
        on_missing: `"report"` drops rows whose image is missing or empty and warns `UnusableImagesWarning`;
            `"error"` raises `UnusableImagesError`. Both list the paths.
        check_counts: Warn `SplitSizeWarning` when the number of images differs from VG 1.2's 108,077.
        allow_outside_root: Read images the file places outside `image_root` (`..`, absolute paths, symlinks out
            of it; `--allow-outside-image-root`); by default such a file is refused with `DataError`, naming the entry.
        split: Only `train` (or None) is accepted: Visual Genome has no caption evaluation splits.

    Raises:
        FileNotFoundError: a JSON file does not exist.
        DataFormatError: a file is not in the Visual Genome format (names the entry index and field), e.g. a region
            whose box is not four finite numbers with a non-negative width and height.
        DataError: an image's size is not in `image_data.json` and its header cannot be read.
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
        exclude_coco_split=exclude_coco_split,
        max_captions_per_image=max_captions_per_image,
        on_missing=on_missing,
        check_counts=check_counts,
        allow_outside_root=allow_outside_root,
        split=split,
    )


def looks_like_visual_genome(data: Any) -> bool:
    """Whether parsed JSON `data` is a region descriptions list."""
    return isinstance(data, list) and bool(data) and isinstance(data[0], dict) and "regions" in data[0]


def _image_records(image_data: Any, source: str, root: Path) -> dict[str, tuple[str, tuple[int, int] | None]]:
    """Each image's path (from its `url`) and `(width, height)` (None where the record does not give both)."""
    if not isinstance(image_data, list):
        raise DataFormatError(f"{source}: expected a list of image records, got a {type(image_data).__name__}")
    records = {}
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
        size = record.get("width"), record.get("height")
        sized = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in size)
        records[image_id_text(image_id, where, "image_id")] = (str(root / folder / name), size if sized else None)
    return records


def karpathy_eval_coco_ids(karpathy_json: str | os.PathLike) -> frozenset[str]:
    """The COCO ids (`cocoid`) of the val and test images of a Karpathy split file (`dataset_coco.json`).

    Args:
        karpathy_json: The split file.

    Raises:
        DataFormatError: it is not a Karpathy split file with `cocoid`s.
    """
    data = read_json(karpathy_json, role="Karpathy split")
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list):
        raise DataFormatError(f"{karpathy_json}: not a Karpathy split file (no 'images' list): pass dataset_coco.json")
    ids = set()
    for index, image in enumerate(images):
        if not isinstance(image, dict) or "split" not in image:
            raise DataFormatError(f"{karpathy_json}: images[{index}] has no 'split'")
        if image["split"] in ("val", "test"):
            if image.get("cocoid") is None:
                raise DataFormatError(
                    f"{karpathy_json}: images[{index}] has no 'cocoid': pass the COCO split file, dataset_coco.json"
                )
            ids.add(str(image["cocoid"]))
    return frozenset(ids)


def _coco_ids(image_data: Any) -> dict[str, str]:
    """VG image id -> COCO id, for the images of `image_data.json` that are COCO images."""
    return {
        str(record.get("image_id", record.get("id"))): str(record["coco_id"])
        for record in image_data
        if isinstance(record, dict) and record.get("coco_id") is not None
    }


def _excluded_coco_ids(
    exclude_coco_split: Any, json_path: Path, image_data: Any
) -> tuple[frozenset[str] | None, str | None]:
    """The COCO ids to drop and the split file they come from; (None, None) when nothing is dropped, and
    (None, "") when nothing is dropped for want of a split file (to be warned about)."""
    if isinstance(exclude_coco_split, str) and exclude_coco_split.lower() == "none" or exclude_coco_split is False:
        return None, None
    if exclude_coco_split is None:
        beside = json_path.parent / "dataset_coco.json"
        if not beside.is_file():
            return None, ""
        exclude_coco_split = beside
    if not image_data:
        raise DataFormatError(
            f"{json_path}: dropping the COCO Karpathy val/test images ({exclude_coco_split}) needs VG's "
            f"image_data.json (its coco_id field): put it beside the regions file or pass image_data_json"
        )
    return karpathy_eval_coco_ids(exclude_coco_split), str(exclude_coco_split)


def _report_coco_overlap(dataset: Any, source: str, split_file: str | None, dropped: int) -> None:
    """Say what the COCO filter did: the count in the dataset's description and the log, or a warning."""
    if split_file == "":
        warnings.warn(
            CocoOverlapWarning(
                f"{source}: Visual Genome images that are also COCO Karpathy val/test images are kept (no "
                "dataset_coco.json beside it): pre-training on them shows the model evaluation images. Pass "
                "--exclude-coco-split path/to/dataset_coco.json to drop them (or 'none' to keep them knowingly)"
            ),
            stacklevel=4,
        )
    elif split_file is not None:
        dataset.info.description = (
            f"{source}: dropped {dropped:,} Visual Genome images that are COCO Karpathy val/test images ({split_file})"
        )
        logger.info(dataset.info.description)


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
    exclude_coco_split: Any = None,
    max_captions_per_image: int | None = None,
    on_missing: OnMissing = "report",
    check_counts: bool = True,
    allow_outside_root: bool = False,
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
    known = _image_records(image_data, image_data_source or "image_data.json", root) if image_data else None
    if not isinstance(data, list):
        raise DataFormatError(
            f"{source}: expected a list of {{'id', 'regions'}} objects (Visual Genome region descriptions), "
            f"got a {type(data).__name__}"
        )
    excluded_ids, split_file = _excluded_coco_ids(exclude_coco_split, Path(json_path), image_data)
    coco_of = _coco_ids(image_data) if excluded_ids is not None else {}
    rows, dropped = [], 0
    seen_ids: dict[str, int] = {}
    for index, entry in enumerate(data):
        where = f"{source}: [{index}]"
        image_id, captions, boxes = _entry_captions(entry, where, max_captions_per_image)
        if image_id in seen_ids:
            raise DataFormatError(f"{where}: image id {image_id!r} already used by [{seen_ids[image_id]}]")
        seen_ids[image_id] = index
        if not captions:
            continue
        if excluded_ids is not None and coco_of.get(image_id) in excluded_ids:
            dropped += 1
            continue
        if known is not None:
            if image_id not in known:
                raise DataFormatError(f"{where}: image id {image_id} is not in {image_data_source}")
            path, size = known[image_id]
        else:
            path, size = _find_image(root, image_id), None
        rows.append({"image_id": image_id, "image_path": path, "captions": captions, "split": "train",
                     "boxes": boxes, "_size": size, "_where": where})  # fmt: skip
    if check_counts:
        check_split_sizes(
            {"images": len(data)}, {"images": VISUAL_GENOME_IMAGES}, source=source, what="Visual Genome 1.2"
        )
    rows, _ = check_files(
        rows, on_missing=on_missing, source=source, image_root=str(root), allow_outside_root=allow_outside_root
    )
    _normalise_region_boxes(rows)
    dataset = rows_to_dataset(rows, {"boxes": boxes_feature()})
    _report_coco_overlap(dataset, source, split_file, dropped)
    return dataset


def _entry_captions(
    entry: Any, where: str, max_captions: int | None
) -> tuple[str, list[str], list[list[float] | None]]:
    """One region descriptions entry's image id, cleaned unique phrases and their pixel boxes `[x, y, width, height]`
    (None for a region without coordinates)."""
    if not isinstance(entry, dict):
        raise DataFormatError(f"{where}: expected an object, got a {type(entry).__name__}")
    regions = entry.get("regions")
    if not isinstance(regions, list):
        raise DataFormatError(f"{where}: field 'regions' is {'missing' if 'regions' not in entry else 'not a list'}")
    image_id = entry.get("id", entry.get("image_id"))
    if image_id is None and regions and isinstance(regions[0], dict):
        image_id = regions[0].get("image_id")
    if image_id is None:
        raise DataFormatError(f"{where}: field 'id' is missing (and no region names its image_id)")
    captions, boxes, seen = [], [], set()
    for number, region in enumerate(regions):
        if not isinstance(region, dict) or not isinstance(region.get("phrase"), str):
            raise DataFormatError(f"{where}: regions[{number}] has no 'phrase' string")
        phrase = clean_phrase(region["phrase"])
        key = phrase.lower()
        if not phrase or key in seen:
            continue
        seen.add(key)
        captions.append(phrase)
        boxes.append(_region_box(region, f"{where}: regions[{number}]"))
        if max_captions is not None and len(captions) >= max_captions:
            break
    return image_id_text(image_id, where), captions, boxes


_BOX_FIELDS: tuple[str, ...] = ("x", "y", "width", "height")


def _region_box(region: dict[str, Any], where: str) -> list[float] | None:
    """A region's pixel box `[x, y, width, height]`; None when it gives none of the four fields."""
    given = [name for name in _BOX_FIELDS if name in region]
    if not given:
        return None
    if len(given) < len(_BOX_FIELDS):
        missing = [name for name in _BOX_FIELDS if name not in region]
        raise DataFormatError(f"{where}: field{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing "
                              f"(a region's box is x, y, width, height)")  # fmt: skip
    try:
        box = list(four_numbers([region[name] for name in _BOX_FIELDS], "its x, y, width, height"))
    except ValueError as error:
        raise DataFormatError(f"{where}: {error}") from None
    if box[2] < 0 or box[3] < 0:
        raise DataFormatError(f"{where}: its box {box} has a negative width or height")
    return box


def _normalise_region_boxes(rows: list[dict[str, Any]]) -> None:
    """Replace each row's pixel region boxes by normalised corners, by the size `image_data.json` gave (`_size`) or
    its image header's."""
    for row in rows:
        pixels, size, where = row.pop("boxes"), row.pop("_size"), row.pop("_where")
        if any(box is not None for box in pixels) and size is None:
            size = image_size_of(row["image_path"])
        try:
            whole = [list(WHOLE_IMAGE_BOX)]
            row["boxes"] = [normalise_xywh([box], *size)[0] if box is not None else whole[0] for box in pixels]
        except ValueError as error:
            raise DataFormatError(f"{where} (image {row['image_id']}): {error}") from None
