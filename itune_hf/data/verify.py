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
from typing import Any

from ..models._shared.images import ImageError, open_image
from ._common import OnMissing, check_on_missing, drop_unusable


def open_example_image(example: dict[str, Any]):
    """The RGB PIL image of one dataset row: its embedded `image` if present, else the file at `image_path`.

    Args:
        example: A row of a dataset from `itune_hf.data` (a dict with `image_path`, maybe `image`).

    Raises:
        ImageError: naming the file (or the row's image id) and the reason.
    """
    image = example.get("image")
    if image is not None:
        source = example.get("image_path") or f"image {example.get('image_id', '?')}"
        if isinstance(image, dict):  # undecoded datasets.Image storage
            if image.get("bytes") is not None:
                from PIL import Image

                try:
                    return open_image(Image.open(io.BytesIO(image["bytes"])), source)
                except ImageError:
                    raise
                except Exception as error:  # PIL raises several types for bad bytes
                    raise ImageError(source, f"embedded image bytes do not decode ({error})") from None
            return open_image(image["path"], source)
        return open_image(image, source)
    return open_image(example["image_path"])


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
