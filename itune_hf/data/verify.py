"""Decoding every image of a loaded dataset, for commands that want to know before training or evaluating.

Loading only checks that image files exist and are not empty (cheap); `verify_images` opens and decodes each one
with `open_image` (`itune_hf.models._shared.images`), so truncated files, non-images and decompression bombs are
found up front. The commands offer it as `--verify-images` (`itune train`, `itune eval`, `itune cache-features`);
without it, an image that does not decode is reported and skipped where it is read (`generate_captions`, the
training pairs' `read_images`), so one bad file never stops a run.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from ..models._shared.images import ImageError, open_image
from ._common import OnMissing, check_on_missing, drop_unusable


def open_example_image(example: dict[str, Any], *, shortest_edge: int | None = None):
    """The RGB PIL image of one dataset row: its embedded `image` if present, else the file at `image_path`.

    Args:
        example: A row of a dataset from `itune_hf.data` (a dict with `image_path`, maybe `image`).
        shortest_edge: The processor's shortest-edge resize target, bounding the resized size (see `open_image`).

    Raises:
        ImageError: naming the file (or the row's image id) and the reason.
    """
    image = example.get("image")
    if image is not None:
        source = example.get("image_path") or f"image {example.get('image_id', '?')} (embedded in the dataset)"
        if isinstance(image, dict):  # undecoded datasets.Image storage
            if image.get("bytes") is not None:
                from PIL import Image

                try:
                    opened = Image.open(io.BytesIO(image["bytes"]))
                except Exception as error:  # PIL raises several types for bad bytes
                    raise ImageError(source, f"embedded image bytes do not decode ({error})") from None
                return open_image(opened, source, shortest_edge=shortest_edge)
            return open_image(image["path"], source, shortest_edge=shortest_edge)
        return open_image(image, source, shortest_edge=shortest_edge)
    return open_image(example["image_path"], shortest_edge=shortest_edge)


class EmbeddedImage(NamedTuple):
    """One row's image held in the dataset (bytes, as `save_to_disk` stores them), read only when it is opened.

    Args:
        images: The dataset's undecoded image column (`embedded_images`).
        row: The row.
    """

    images: Any
    row: int

    def cell(self) -> dict[str, Any]:
        """The row's undecoded `{"bytes", "path"}`."""
        return self.images[self.row]["image"]


def embedded_images(rows: Any) -> Any:
    """The rows' images held in the dataset (an `image` column, as a `save_to_disk` dataset of `load_captions` has),
    undecoded, or None when the rows name image files (`image_path`).

    Args:
        rows: Dataset rows from an `itune_hf.data` loader (a `datasets.Dataset`; anything else has no embedded images).
    """
    from datasets import Image

    features = getattr(rows, "features", None)
    if (
        not features
        or not isinstance(features.get("image"), Image)
        or not callable(getattr(rows, "select_columns", None))
    ):
        return None
    return rows.select_columns(["image"]).cast_column("image", Image(decode=False))


def image_items(rows: Any) -> list[dict[str, Any]]:
    """One item per row, `image_id` and `image_path`, plus `image_data` (an `EmbeddedImage`) where the dataset holds
    the image; `open_item_image` opens either.

    Args:
        rows: Dataset rows (`image_id`, `image_path`; an `image` column where the images are embedded).
    """
    items = [{"image_id": i, "image_path": p} for i, p in zip(rows["image_id"], rows["image_path"])]
    embedded = embedded_images(rows)
    if embedded is not None:
        for row, item in enumerate(items):
            item["image_data"] = EmbeddedImage(embedded, row)
    return items


def image_label(item: dict[str, Any]) -> str:
    """How messages name an item's image: its file, or its id when the dataset holds it.

    Args:
        item: A batch item (`image_id`, `image_path`, maybe `image_data`).
    """
    if item.get("image_data") is not None or not item.get("image_path"):
        return item.get("image_path") or f"image {item.get('image_id', '?')} (embedded in the dataset)"
    return item["image_path"]


def open_item_image(item: dict[str, Any], *, shortest_edge: int | None = None):
    """The RGB PIL image of a batch item: the dataset's embedded image (`image_data`), else the file at `image_path`.

    Args:
        item: A batch item from `image_items`.
        shortest_edge: The processor's shortest-edge resize target (see `open_image`).

    Raises:
        ImageError: naming the image (`image_label`) and the reason.
    """
    data = item.get("image_data")
    if data is None:
        return open_image(item["image_path"], shortest_edge=shortest_edge)
    example = {"image": data.cell(), "image_path": image_label(item), "image_id": item.get("image_id")}
    return open_example_image(example, shortest_edge=shortest_edge)


def image_bytes(item: dict[str, Any]) -> bytes | None:
    """The embedded image's bytes of a batch item (None when its image is a file).

    Args:
        item: A batch item from `image_items`.
    """
    data = item.get("image_data")
    if data is None:
        return None
    cell = data.cell()
    if cell.get("bytes") is not None:
        return cell["bytes"]
    with open(cell["path"], "rb") as file:
        return file.read()


def _problem(example: dict[str, Any]) -> str | None:
    try:
        open_example_image(example)
    except ImageError as error:
        return error.reason
    return None


def _find_problems(dataset, num_threads: int | None) -> tuple[list[dict[str, str]], list[tuple[int, str]]]:
    """Decode every image of one `Dataset`: `(rows naming each image, [(row index, reason), ...])`."""
    columns = [name for name in ("image_id", "image_path", "image") if name in dataset.column_names]
    view = dataset.select_columns(columns)
    if "image" in columns:
        from datasets import Image

        view = view.cast_column("image", Image(decode=False))
    workers = max(1, num_threads or os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        reasons = list(pool.map(_problem, view))
    names = view.select_columns([name for name in columns if name != "image"])
    rows = [
        {"image_path": example.get("image_path") or f"<embedded image {example.get('image_id', index)}>"}
        for index, example in enumerate(names)
    ]
    return rows, [(index, reason) for index, reason in enumerate(reasons) if reason is not None]


def verify_images(
    dataset,
    *,
    on_error: OnMissing = "report",
    num_threads: int | None = None,
    source: str = "verify_images",
):
    """Decode every image of `dataset`; drop (and report) or stop at those that fail.

    Args:
        dataset: A `Dataset` or `DatasetDict` from an `itune_hf.data` loader.
        on_error: `"report"` drops the rows whose image does not decode and warns `UnusableImagesWarning`
            listing the paths and reasons; `"error"` raises `UnusableImagesError` listing them (all splits are
            checked first, so the error lists every bad image).
        num_threads: Threads decoding in parallel (image decoding releases the GIL); default: the CPU count.
        source: How to name the dataset in the report and messages.

    Returns:
        `(dataset, report)`: the dataset (same type) without unusable rows, and an `ImageReport` of them.

    Raises:
        UnusableImagesError: with `on_error="error"`, when an image does not decode.
    """
    from datasets import DatasetDict

    check_on_missing(on_error, "on_error")
    parts = dict(dataset.items()) if isinstance(dataset, DatasetDict) else {None: dataset}
    all_rows: list[dict[str, str]] = []
    all_problems: list[tuple[int, str]] = []
    bad_by_part: dict[str | None, set[int]] = {}
    for name, part in parts.items():
        rows, problems = _find_problems(part, num_threads)
        all_problems += [(len(all_rows) + index, reason) for index, reason in problems]
        all_rows += rows
        bad_by_part[name] = {index for index, _ in problems}
    _, report = drop_unusable(all_rows, all_problems, on_missing=on_error, source=source, image_root=None, stacklevel=3)
    kept = {
        name: part.select([i for i in range(len(part)) if i not in bad_by_part[name]]) if bad_by_part[name] else part
        for name, part in parts.items()
    }
    return (DatasetDict(kept) if isinstance(dataset, DatasetDict) else kept[None]), report
