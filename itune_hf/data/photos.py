"""A tiny real test set: the photographs shipped inside scikit-image, scikit-learn and matplotlib, with five
hand-written COCO-style reference captions each (`photos.json` in this package; `itune make-photos`).

The packages are located with `importlib.util.find_spec` (nothing is imported); photos whose package is not installed,
or that this version of the package does not ship, are skipped with a note.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from ..utils.files import atomic_write_json
from ._output import DATASET_FILE, write_dataset_dir

DATASET_KIND = "itune-photos"
PHOTOS_FILE = Path(__file__).with_name("photos.json")


@dataclass(frozen=True)
class Photo:
    """One photo of the set: where it lives inside its package, and its reference captions."""

    name: str
    package: str
    path: str
    captions: tuple[str, ...]


class PhotoSkippedWarning(UserWarning):
    """A photo of the set is not available here (its package is not installed or does not ship it)."""


def list_photos() -> list[Photo]:
    """Every photo of the set with its captions, as stored in `photos.json` (whether available or not)."""
    data = json.loads(PHOTOS_FILE.read_text(encoding="utf-8"))
    return [
        Photo(name=item["name"], package=item["package"], path=item["path"], captions=tuple(item["captions"]))
        for item in data["photos"]
    ]


def package_dir(package: str) -> Path | None:
    """The directory of an installed package, found without importing it; None when it is not installed."""
    try:
        spec = find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def locate_photos() -> tuple[list[tuple[Photo, Path]], list[tuple[Photo, str]]]:
    """`(available, skipped)`: photos with their file, and photos that are not available with the reason."""
    available, skipped = [], []
    for photo in list_photos():
        directory = package_dir(photo.package)
        if directory is None:
            skipped.append((photo, f"package {photo.package} is not installed"))
            continue
        path = directory / photo.path
        if not path.is_file():
            skipped.append((photo, f"{photo.package} does not ship {photo.path} ({path} not found)"))
            continue
        available.append((photo, path))
    return available, skipped


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def make_photos(output_dir: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Copy the available photos into `output_dir/images/` and write a Karpathy JSON; returns its path.

    Every image is in split `test`. Photos that are not available are skipped with a `PhotoSkippedWarning` each and
    listed under `skipped` in the JSON. The files are copied byte for byte (JPEG stays JPEG, PNG stays PNG).

    Args:
        output_dir: Directory to write (created). A non-empty directory is refused unless it is a previous
            `make-photos` output (replaced) or `overwrite` is set.
        overwrite: Write into a non-empty directory that is not a previous output (same-named files replaced).

    Raises:
        DataError: no photo is available at all, or the output directory is refused.
    """
    from ._common import DataError

    available, skipped = locate_photos()
    for photo, reason in skipped:
        warnings.warn(PhotoSkippedWarning(f"photo {photo.name!r} skipped: {reason}"), stacklevel=2)
    if not available:
        raise DataError(
            "no photo is available: install scikit-image, scikit-learn or matplotlib (skipped: "
            + "; ".join(reason for _, reason in skipped)
            + ")"
        )

    def build(directory: Path) -> None:
        (directory / "images").mkdir()
        entries: list[dict[str, Any]] = []
        sentence_id = 0
        for index, (photo, path) in enumerate(available):
            filename = photo.name + path.suffix.lower()
            shutil.copyfile(path, directory / "images" / filename)
            sentences = []
            for caption in photo.captions:
                sentences.append({"raw": caption, "tokens": _tokens(caption), "imgid": index, "sentid": sentence_id})
                sentence_id += 1
            entries.append(
                {
                    "filepath": "images",
                    "filename": filename,
                    "imgid": index,
                    "split": "test",
                    "sentids": [s["sentid"] for s in sentences],
                    "sentences": sentences,
                    "source": f"{photo.package}/{photo.path}",
                }
            )
        data = {
            "dataset": DATASET_KIND,
            "images": entries,
            "skipped": [{"name": photo.name, "reason": reason} for photo, reason in skipped],
        }
        atomic_write_json(directory / DATASET_FILE, data, indent=1)

    return write_dataset_dir(
        output_dir, kind=DATASET_KIND, command="itune make-photos", overwrite=overwrite, build=build
    )
