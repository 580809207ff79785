"""Precomputed region features (bottom-up attention Faster R-CNN, as XGPT's paper uses) for `visual_source="regions"`.

`RegionFeatures(path)` reads either layout lazily and gives batches the XGPT model takes as they are:

```python
regions = RegionFeatures("features/", max_regions=100)  # a directory of <image_id>.npz, or a .tsv file
batch = regions.get(["391895", "522418"])  # region_features (B, N, D), region_boxes (B, N, 4), region_mask (B, N)
model.generate(**batch)  # an XGPTForCaptioning with visual_source="regions", region_feature_size=regions.feature_size
```

**A directory of `.npz` files**, one per image, named `<image_id>.npz`. Accepted keys (the first present wins):

- features `(N, D)` float: `features`, `feat`, `feats` or `x` (bottom-up-attention.pytorch writes `x`);
- boxes `(N, 4)` `x1, y1, x2, y2` in pixels: `boxes`, `bbox` or `bboxes`;
- image size: `image_w` / `image_h` (also `image_width`, `img_w`, `width` and their heights); not needed with
  `normalised_boxes=True` (boxes already in [0, 1]);
- optionally `num_boxes` / `num_bbox`: only the first that many rows are regions (arrays padded beyond it);
- optionally the detector's confidence of each region `(N,)`: `objects_conf`, `conf`, `confidence`, `confidences`
  or `scores` (see `max_regions` below).

**The `.tsv` layout of the bottom-up-attention repository**: one line per image, tab-separated, no header, columns
`image_id, image_w, image_h, num_boxes, boxes, features` (`TSV_FIELDS`); `boxes` and `features` are base64 of the
float32 arrays (`num_boxes x 4` pixel corners, `num_boxes x D`). LXMERT's column order (`LXMERT_TSV_FIELDS`) is read
with `tsv_fields=LXMERT_TSV_FIELDS`. `path` may be one `.tsv` file or a directory of them (`*.tsv`, `*.tsv.0`, ...).
The files are read once to index each line's byte offset; a line is decoded when its image is asked for. Lines are
split on tabs directly (no `csv` module, so no field size limit applies).

Image ids are strings; numeric ids match with or without leading zeros (`"000123"` is `123`), and a file named like
`COCO_val2014_000000391895` is also found as `391895` (the COCO id the Karpathy loader gives), unless two files
would share that short id. Boxes are normalised by the image size, checked to lie in the image (1 pixel of slack,
then clipped) and to have `x1 <= x2`, `y1 <= y2`.

An image with more than `max_regions` regions keeps its `max_regions` most confident ones when its file gives the
detector's confidences (XGPT section 3: "the top 100 objects with highest confidence scores are selected"; ties go
to the earlier region), in the file's order, so an image's regions come in the same order whatever `max_regions` is
(bottom-up-attention's extractor writes them most confident first anyway); without confidences it keeps its first
`max_regions`. The confidences are read only then.

Numpy is imported with this module; torch only by `get`.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UnknownNameError
from ._common import DataError, DataFormatError, absolute

__all__ = ["LXMERT_TSV_FIELDS", "NPZ_KEYS", "TSV_FIELDS", "RegionFeatures"]

#: Columns of the bottom-up-attention `.tsv` files (github.com/peteanderson80/bottom-up-attention).
TSV_FIELDS: tuple[str, ...] = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
#: Columns of LXMERT's / py-bottom-up-attention's `.tsv` files.
LXMERT_TSV_FIELDS: tuple[str, ...] = (
    "img_id",
    "img_h",
    "img_w",
    "objects_id",
    "objects_conf",
    "attrs_id",
    "attrs_conf",
    "num_boxes",
    "boxes",
    "features",
)
#: Accepted names of each field, in the order they are looked for (`.npz` keys and `.tsv` column names).
NPZ_KEYS: dict[str, tuple[str, ...]] = {
    "image_id": ("image_id", "img_id"),
    "features": ("features", "feat", "feats", "x"),
    "boxes": ("boxes", "bbox", "bboxes"),
    "image_w": ("image_w", "image_width", "img_w", "width"),
    "image_h": ("image_h", "image_height", "img_h", "height"),
    "num_boxes": ("num_boxes", "num_bbox"),
    "confidences": ("objects_conf", "conf", "confidence", "confidences", "scores"),
}
_TSV_NAME = re.compile(r"\.tsv(\.\d+)?$")
_NUMBERED = re.compile(r"_0*(\d+)$")
_SLACK = 1.0  # pixels a box may overhang its image (detector boxes are floats clipped to the image)


def _canonical(image_id: Any) -> str:
    """The lookup key of an image id: its string, numbers without leading zeros."""
    text = str(image_id).strip()
    return str(int(text)) if text.isdigit() else text


class RegionFeatures:
    """Bottom-up region features of many images, read lazily from `.npz` files or bottom-up-attention `.tsv` files.

    Args:
        path: A directory of `<image_id>.npz` files, a `.tsv` file, or a directory of `.tsv` files (see the module
            docstring for the keys and columns).
        max_regions: Regions kept per image (the paper: 100), its most confident ones when its file gives confidences
            (in the file's order), else its first ones; None keeps all.
        normalised_boxes: The files' boxes are already normalised `x1, y1, x2, y2` in [0, 1] (no image size needed).
        tsv_fields: Column names of the `.tsv` files (`TSV_FIELDS`, or `LXMERT_TSV_FIELDS`).

    Attributes:
        path: The absolute path given.
        kind: `"npz"` or `"tsv"`: which layout was found.
        max_regions: As given.

    Raises:
        FileNotFoundError: `path` does not exist.
        DataError: `path` holds no `.npz` or `.tsv` files, or both kinds.
        DataFormatError: two files (or lines) hold the same image id, or a `.tsv` line has no image id.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        max_regions: int | None = 100,
        *,
        normalised_boxes: bool = False,
        tsv_fields: Sequence[str] = TSV_FIELDS,
    ) -> None:
        if max_regions is not None and max_regions < 1:
            raise ValueError(f"max_regions must be at least 1 (or None for all); got {max_regions}")
        self.path = absolute(path)
        self.max_regions = max_regions
        self.normalised_boxes = normalised_boxes
        self.tsv_fields = tuple(tsv_fields)
        self._feature_size: int | None = None
        self._files, self.kind = self._find_files()
        self._ids: list[str] = []
        self._locations: list[tuple[int, int]] = []  # (file number, byte offset of the line; -1 for .npz)
        seen: dict[str, str] = {}  # canonical id -> where it was found
        if self.kind == "npz":
            for number, file in enumerate(self._files):
                self._add(file.stem, (number, -1), str(file), seen)
        else:
            id_column = self._tsv_column("image_id", str(self._files[0]))
            for number, file in enumerate(self._files):
                for line_number, offset, image_id in _tsv_ids(file, id_column):
                    self._add(image_id, (number, offset), f"{file} line {line_number}", seen)
        self._lookup = self._aliases()

    # ------------------------------------------------------------------ index
    def _find_files(self) -> tuple[list[Path], str]:
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no such region feature file or directory")
        if self.path.is_file():
            if not _TSV_NAME.search(self.path.name):
                raise DataError(f"{self.path}: expected a .tsv file of region features or a directory of .npz files")
            return [self.path], "tsv"
        npz = sorted(self.path.glob("*.npz"))
        tsv = sorted(file for file in self.path.iterdir() if _TSV_NAME.search(file.name) and file.is_file())
        if npz and tsv:
            raise DataError(f"{self.path}: holds both .npz and .tsv region features; point at one kind")
        if not npz and not tsv:
            raise DataError(f"{self.path}: no .npz or .tsv region feature files in this directory")
        return (npz, "npz") if npz else (tsv, "tsv")

    def _add(self, image_id: str, location: tuple[int, int], where: str, seen: dict[str, str]) -> None:
        key = _canonical(image_id)
        if key in seen:
            raise DataFormatError(f"{where}: image id {image_id!r} is already in {seen[key]}")
        seen[key] = where
        self._ids.append(image_id)
        self._locations.append(location)

    def _aliases(self) -> dict[str, int]:
        """Canonical id -> index, plus the unambiguous numeric tails of ids such as `COCO_val2014_000000391895`."""
        lookup = {_canonical(image_id): index for index, image_id in enumerate(self._ids)}
        tails: dict[str, list[int]] = {}
        for index, image_id in enumerate(self._ids):
            match = _NUMBERED.search(image_id)
            if match:
                tails.setdefault(str(int(match.group(1))), []).append(index)
        for key, indices in tails.items():
            if len(indices) == 1 and key not in lookup:
                lookup[key] = indices[0]
        return lookup

    def _tsv_column(self, field: str, where: str) -> int:
        for name in NPZ_KEYS[field]:
            if name in self.tsv_fields:
                return self.tsv_fields.index(name)
        raise DataError(f"{where}: tsv_fields {list(self.tsv_fields)} name no {field} column ({NPZ_KEYS[field]})")

    # ------------------------------------------------------------------ queries
    def image_ids(self) -> list[str]:
        """The image ids, as the files name them (`.npz`: sorted file names; `.tsv`: file and line order)."""
        return list(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, image_id: object) -> bool:
        return isinstance(image_id, (str, int)) and _canonical(image_id) in self._lookup

    def __iter__(self) -> Iterator[str]:
        return iter(self.image_ids())

    def __repr__(self) -> str:
        return f"RegionFeatures({str(self.path)!r}, max_regions={self.max_regions}, images={len(self):,})"

    @property
    def feature_size(self) -> int:
        """Width D of the region features (read from the first image the first time it is asked for)."""
        if self._feature_size is None:
            self.read(self._ids[0])
        return self._feature_size

    def describe(self) -> str:
        """One line saying where the regions come from, for model cards and results."""
        limit = f"up to {self.max_regions} regions" if self.max_regions is not None else "all regions"
        return (
            f"bottom-up region features from {self.path} ({self.feature_size}-d, {limit}, {len(self):,} images, "
            f".{self.kind})"
        )

    def read(self, image_id: str | int) -> tuple[np.ndarray, np.ndarray]:
        """One image's regions: `(features (N, D) float32, boxes (N, 4) float32 normalised x1, y1, x2, y2)`, at most
        `max_regions` of them (the most confident when the file gives confidences, else the first).

        Args:
            image_id: The image id (str or int; see the module docstring for how ids match).

        Raises:
            KeyError: no file holds this image (the message names the id and the path).
            DataFormatError: the image's entry is malformed (names the file, the image id and the field).
        """
        key = _canonical(image_id)
        if key not in self._lookup:
            examples = ", ".join(repr(name) for name in self._ids[:3])
            raise UnknownNameError(
                f"{self.path}: no region features for image id {image_id!r} (ids look like {examples})"
            )
        index = self._lookup[key]
        number, offset = self._locations[index]
        if self.kind == "npz":
            where = f"{self._files[number]} (image {self._ids[index]})"
            fields = _npz_fields(self._files[number], where)
        else:
            where = f"{self._files[number]} (image {self._ids[index]}, byte {offset})"
            fields = self._tsv_fields(number, offset, where)
        return self._checked(*fields, where)

    def get(self, image_ids: Sequence[str | int] | str | int) -> dict[str, Any]:
        """A batch of images' regions, padded to the image with the most (at most `max_regions`).

        Args:
            image_ids: The images (a single id gives a batch of one).

        Returns:
            `{"region_features": FloatTensor (B, N, D), "region_boxes": FloatTensor (B, N, 4) normalised x1, y1,
            x2, y2, "region_mask": BoolTensor (B, N)}` (True on real regions), the keyword arguments of
            `XGPTForCaptioning.forward` / `generate` for a model with `visual_source="regions"`.
        """
        import torch

        if isinstance(image_ids, (str, int)):
            image_ids = [image_ids]
        items = [self.read(image_id) for image_id in image_ids]
        if not items:
            raise ValueError("get() needs at least one image id")
        count = max(len(features) for features, _ in items)
        features = np.zeros((len(items), count, self.feature_size), dtype=np.float32)  # padded in numpy: one copy
        boxes = np.zeros((len(items), count, 4), dtype=np.float32)
        mask = np.zeros((len(items), count), dtype=bool)
        for row, (image_features, image_boxes) in enumerate(items):
            features[row, : len(image_features)] = image_features
            boxes[row, : len(image_boxes)] = image_boxes
            mask[row, : len(image_features)] = True
        return {
            "region_features": torch.from_numpy(features),
            "region_boxes": torch.from_numpy(boxes),
            "region_mask": torch.from_numpy(mask),
        }

    # ------------------------------------------------------------------ decoding
    def _tsv_fields(self, number: int, offset: int, where: str) -> tuple[Any, Any, Any, Any, Any, Any]:
        """`(features, boxes, width, height, count, confidences)` of the `.tsv` line at `offset` (confidences: the
        column's base64 text, decoded only when needed; None without the column)."""
        with self._files[number].open("rb") as handle:  # opened per read: safe in forked DataLoader workers
            handle.seek(offset)
            line = handle.readline()
        values = line.rstrip(b"\r\n").split(b"\t")
        if len(values) != len(self.tsv_fields):
            raise DataFormatError(
                f"{where}: {len(values)} tab-separated columns, expected {len(self.tsv_fields)} "
                f"({', '.join(self.tsv_fields)})"
            )
        column = {name: self._tsv_column(name, where) for name in ("image_w", "image_h", "num_boxes")}
        try:
            width, height = float(values[column["image_w"]]), float(values[column["image_h"]])
            count = int(values[column["num_boxes"]])
        except ValueError:
            raise DataFormatError(f"{where}: field 'image_w', 'image_h' or 'num_boxes' is not a number") from None
        features = _base64_array(values[self._tsv_column("features", where)], count, where, "features")
        boxes = _base64_array(values[self._tsv_column("boxes", where)], count, where, "boxes")
        names = [name for name in NPZ_KEYS["confidences"] if name in self.tsv_fields]
        confidences = values[self.tsv_fields.index(names[0])] if names else None
        return features, boxes, width, height, count, confidences

    def _checked(self, features: Any, boxes: Any, width: Any, height: Any, count: Any, confidences: Any, where: str):
        """Validate one image's arrays; its kept regions (`_kept`) with normalised, clipped boxes."""
        features, boxes = np.asarray(features), np.asarray(boxes)
        if features.ndim != 2 or not np.issubdtype(features.dtype, np.number):
            raise DataFormatError(f"{where}: field 'features' has shape {features.shape}; expected (regions, D)")
        if boxes.ndim != 2 or boxes.shape[1:] != (4,) or boxes.shape[0] != features.shape[0]:
            raise DataFormatError(
                f"{where}: field 'boxes' has shape {boxes.shape}; expected ({features.shape[0]}, 4) x1, y1, x2, y2"
            )
        if count is not None:
            if not 0 <= count <= len(features):
                raise DataFormatError(f"{where}: field 'num_boxes' is {count}, but there are {len(features)} rows")
            features, boxes = features[:count], boxes[:count]
        if len(features) == 0:
            raise DataFormatError(f"{where}: has no regions (the model needs at least one per image)")
        for field, values in (("features", features), ("boxes", boxes)):
            if not np.isfinite(values.astype(np.float64)).all():  # a NaN feature trains NaN weights, captions "!!!"
                raise DataFormatError(
                    f"{where}: field {field!r} holds NaN or infinite values; extract the region features again"
                )
        if self._feature_size is None:
            self._feature_size = features.shape[1]
        elif features.shape[1] != self._feature_size:
            raise DataFormatError(
                f"{where}: field 'features' is {features.shape[1]}-d, other images' are {self._feature_size}-d"
            )
        boxes = self._normalised(boxes.astype(np.float64), width, height, where)
        keep = self._kept(len(features), confidences, where)
        return features[keep].astype(np.float32), boxes[keep].astype(np.float32)

    def _kept(self, count: int, confidences: Any, where: str) -> slice | np.ndarray:
        """Which of an image's `count` regions it keeps: all up to `max_regions`; beyond, the `max_regions` most
        confident (stable: ties to the earlier), in the file's order, or the first ones without confidences."""
        if self.max_regions is None or count <= self.max_regions:
            return slice(None)
        if confidences is None:
            return slice(0, self.max_regions)
        if isinstance(confidences, bytes):
            confidences = _base64_array(confidences, count, where, "objects_conf")
        scores = np.asarray(confidences)
        if scores.ndim == 2 and scores.shape[1] == 1:
            scores = scores[:, 0]
        if scores.ndim != 1 or not np.issubdtype(scores.dtype, np.number) or len(scores) < count:
            raise DataFormatError(
                f"{where}: field 'confidences' has shape {scores.shape}; expected one number per region ({count})"
            )
        scores = scores[:count].astype(np.float64)
        if not np.isfinite(scores).all():
            raise DataFormatError(f"{where}: field 'confidences' holds a value that is not a finite number")
        best = np.argsort(-scores, kind="stable")[: self.max_regions]
        return np.sort(best)

    def _normalised(self, boxes: np.ndarray, width: Any, height: Any, where: str) -> np.ndarray:
        if self.normalised_boxes:
            width, height, slack = 1.0, 1.0, 1e-3
        elif width is None or height is None:
            raise DataFormatError(
                f"{where}: no image size (keys {NPZ_KEYS['image_w']} / {NPZ_KEYS['image_h']}) to normalise its pixel "
                "boxes by; pass normalised_boxes=True if they are already in [0, 1]"
            )
        else:
            width, height, slack = float(width), float(height), _SLACK
            if not width > 0 or not height > 0:
                raise DataFormatError(f"{where}: fields 'image_w' / 'image_h' are {width} x {height}, not positive")
        bad = ~np.isfinite(boxes).all(axis=1)
        bad |= (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
        bad |= (boxes[:, :2] < -slack).any(axis=1) | (boxes[:, 2] > width + slack) | (boxes[:, 3] > height + slack)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise DataFormatError(
                f"{where}: field 'boxes' row {first} {boxes[first].tolist()} is not x1 <= x2, y1 <= y2 inside the "
                f"{width:g} x {height:g} image ({int(bad.sum())} such boxes)"
            )
        return np.clip(boxes / np.array([width, height, width, height]), 0.0, 1.0)


def _tsv_ids(path: Path, id_column: int) -> Iterator[tuple[int, int, str]]:
    """`(line number, byte offset, image id)` of every non-empty line of a `.tsv` file, reading it once."""
    offset = 0
    with path.open("rb") as handle:
        for line_number, line in enumerate(handle, start=1):
            if line.strip():
                values = line.split(b"\t", id_column + 1)
                if len(values) <= id_column or not values[id_column].strip():
                    raise DataFormatError(f"{path} line {line_number}: no image id in column {id_column + 1}")
                yield line_number, offset, values[id_column].strip().decode("utf-8", "replace")
            offset += len(line)


def _base64_array(value: bytes, count: int, where: str, field: str) -> np.ndarray:
    """A float32 `(count, -1)` array from base64 text (also as written by Python 3 ports: `b'...'`)."""
    if value.startswith((b"b'", b'b"')):
        value = value[2:-1]
    try:
        flat = np.frombuffer(base64.b64decode(value, validate=True), dtype=np.float32)
    except (binascii.Error, ValueError):
        raise DataFormatError(f"{where}: field '{field}' is not base64 of float32 values") from None
    if count <= 0 or flat.size % count:
        raise DataFormatError(f"{where}: field '{field}' holds {flat.size} floats, not a multiple of num_boxes={count}")
    return flat.reshape(count, -1)


def _npz_fields(path: Path, where: str) -> tuple[Any, Any, Any, Any, Any, Any]:
    """`(features, boxes, width, height, count, confidences)` of one `.npz` file (size, count and confidences None
    when absent)."""
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise DataFormatError(f"{where}: cannot read the .npz file ({error})") from None
    with archive:
        names = set(archive.files)

        def pick(field: str, required: bool) -> Any:
            for key in NPZ_KEYS[field]:
                if key in names:
                    try:
                        return archive[key]
                    except ValueError as error:  # an object array (needs pickle)
                        raise DataFormatError(f"{where}: field '{key}' cannot be read ({error})") from None
            if required:
                raise DataFormatError(
                    f"{where}: no {field} array (keys {', '.join(NPZ_KEYS[field])}); the file has {sorted(names)}"
                )
            return None

        features, boxes = pick("features", True), pick("boxes", True)
        width, height, count = pick("image_w", False), pick("image_h", False), pick("num_boxes", False)
        confidences = pick("confidences", False)
    width, height, count = (_scalar(value, where) for value in (width, height, count))
    return features, boxes, width, height, None if count is None else int(count), confidences


def _scalar(value: Any, where: str) -> float | None:
    """A one-element array (or None) as a float."""
    if value is None:
        return None
    array = np.asarray(value)
    if array.size != 1 or not np.issubdtype(array.dtype, np.number):
        raise DataFormatError(f"{where}: field 'image_w', 'image_h' or 'num_boxes' is {array!r}, not one number")
    return float(array.reshape(-1)[0])
