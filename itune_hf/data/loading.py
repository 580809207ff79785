"""`load_captions`: the one entry point every command uses to turn `--data/--image-root/--split` into a dataset."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ._common import DataError, OnMissing, check_on_missing, read_json
from .formats import detect_format, find_format, find_path_format

__all__ = ["BUILTIN_DATASETS", "builtin_dataset", "data_cache_dir", "detect_format", "load_captions"]

#: Names accepted by `load_captions` for the datasets this package builds itself (cached on first use).
BUILTIN_DATASETS: tuple[str, ...] = ("synthetic", "photos")


def data_cache_dir() -> Path:
    """Where built-in datasets are materialised: `$ITUNE_DATA_CACHE`, else `$XDG_CACHE_HOME/itune_hf/data`, else
    `~/.cache/itune_hf/data`."""
    if os.environ.get("ITUNE_DATA_CACHE"):
        return Path(os.environ["ITUNE_DATA_CACHE"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "itune_hf" / "data"


def builtin_dataset(name: str) -> Path:
    """The `dataset.json` of built-in dataset `name` (`synthetic` or `photos`), written to the cache if needed.

    `synthetic` is `make_synthetic` with its defaults (2,000 images of 64x64, seed 0); `photos` is `make_photos`
    with the photos available in this environment (the cache key changes when that set changes).
    """
    from .photos import locate_photos, make_photos
    from .synthetic import DEFAULT_IMAGE_SIZE, DEFAULT_NUM_IMAGES, SYNTHETIC_VERSION, make_synthetic

    if name == "synthetic":
        directory = data_cache_dir() / (
            f"synthetic-v{SYNTHETIC_VERSION}-seed0-n{DEFAULT_NUM_IMAGES}-px{DEFAULT_IMAGE_SIZE}"
        )
        build = lambda: make_synthetic(directory)  # noqa: E731
    elif name == "photos":
        available, _ = locate_photos()
        key = hashlib.sha256(
            "\n".join(f"{photo.name}:{photo.captions}:{path}" for photo, path in available).encode()
        ).hexdigest()[:12]
        directory = data_cache_dir() / f"photos-{key}"
        build = lambda: make_photos(directory)  # noqa: E731
    else:
        raise DataError(f"unknown built-in dataset {name!r}; built-in datasets: {', '.join(BUILTIN_DATASETS)}")
    dataset_json = directory / "dataset.json"
    if dataset_json.is_file():
        return dataset_json
    try:
        return build()
    except (DataError, OSError):
        if dataset_json.is_file():  # another process built it at the same time
            return dataset_json
        raise


def load_captions(
    data: str | os.PathLike,
    image_root: str | os.PathLike | None = None,
    split: str | None = None,
    *,
    on_missing: OnMissing = "report",
    check_counts: bool = True,
    **options: Any,
):
    """Load any supported caption dataset; every CLI command takes data through this function.

    `data` may be:

    - a built-in name: `synthetic` (the embedded default, see `make_synthetic`) or `photos` (the tiny real set);
      materialised into `data_cache_dir()` on first use;
    - a Karpathy split JSON (`dataset_coco.json`, ..., or a `dataset.json` written by `itune make-synthetic` /
      `itune make-photos`), or a directory containing `dataset.json`;
    - a COCO-style caption annotation JSON (NoCaps val/test keep their `domain` column);
    - a Visual Genome `region_descriptions.json` (an `image_data.json` beside it is used to find the images, a
      `dataset_coco.json` beside it, or `exclude_coco_split=`, to drop the COCO Karpathy val/test images);
    - WebDataset tar shards in img2dataset's layout: `shards/{00000..00009}.tar`, a glob, a `.tar` or a directory
      of them, streamed as a `datasets.IterableDataset` (see `itune_hf.data.webdataset`);
    - a `save_to_disk` directory, a local data-files directory/file, or a Hub dataset id (needs the Hub).

    The format of a JSON file is detected from its content, not its name, by the formats registered in
    `itune_hf.data.formats` (`register_format` adds one).

    Args:
        data: What to load (see above).
        image_root: Directory the images are relative to; defaults to the directory of the JSON file (or of the
            dataset directory).
        split: `train`, `val` (aliases `validation`, `dev`) or `test` to get one `Dataset`; None gives a
            `DatasetDict` of every split present (single-split sources give a one-split `DatasetDict`).
        on_missing: `"report"` drops rows whose image is missing or empty and warns `UnusableImagesWarning`
            listing the paths; `"error"` raises `UnusableImagesError` listing them; `"keep"` keeps every row
            unchecked (for reading the captions alone, as `itune score` does).
        check_counts: Warn `SplitSizeWarning` when a known dataset's split size differs from the published one.
        **options: Passed to the specific loader (e.g. `domain=` for NoCaps, `max_captions_per_image=` for Visual
            Genome, `exclude_coco_split=` (a Karpathy `dataset_coco.json`, or "none") for Visual Genome,
            `instances=` (COCO `instances_*.json`, adds `boxes`) for Karpathy and COCO-style files,
            `image_column=` / `caption_column=` for Hugging Face datasets; `caption_column=` for a Karpathy file
            too: the entry field, a string or a list of strings, read as the captions in place of `sentences`,
            e.g. `alt_text` in `itune make-clipart`'s dataset.json).

    Raises:
        FileNotFoundError: `data` looks like a path but does not exist.
        DataFormatError: a JSON file of unrecognised or malformed format (names the file and field).
        DataError: a dataset that cannot be loaded (e.g. a Hub id while the Hub is unreachable).
        UnusableImagesError: with `on_missing="error"`, when images are missing or empty.
    """
    # over 80 lines for its docstring (every input it reads, every option): the dispatch below is 37
    check_on_missing(on_missing)
    options["on_missing"] = on_missing
    text = os.fspath(data)
    columns = {name: options.pop(name) for name in HF_COLUMN_OPTIONS if options.get(name) is not None}
    options.update(_hf_columns(columns, text))
    exclude_coco_split = options.pop("exclude_coco_split", None)
    path_format = find_path_format(text) if text not in BUILTIN_DATASETS else None
    if path_format is not None:
        return path_format.load(None, text, image_root, split, check_counts=check_counts, **options)
    if text in BUILTIN_DATASETS:
        return _karpathy(builtin_dataset(text), image_root, split, check_counts=check_counts, **options)
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "dataset.json").is_file():
            root = image_root if image_root is not None else path
            return _karpathy(path / "dataset.json", root, split, check_counts=check_counts, **options)
        return _hf(path, image_root, split, **options)
    if path.is_file() and path.suffix.lower() == ".json":
        parsed = read_json(path)  # the content, not the name, tells the format
        data_format = find_format(parsed, path)
        if "caption_field" in options and data_format.name != "karpathy":
            raise ValueError(
                f"--caption-column {options['caption_field']}: names a field of a Karpathy dataset.json's entries or a "
                f"column of a Hugging Face dataset; {path} is {data_format.title}: drop the option"
            )
        if data_format.name == "visual_genome":
            options["exclude_coco_split"] = exclude_coco_split
        elif exclude_coco_split not in (None, "none"):
            raise ValueError(
                f"exclude_coco_split={exclude_coco_split!r} (--exclude-coco-split) filters Visual Genome data; "
                f"{path} is {data_format.title}: drop the option"
            )
        return data_format.load(parsed, path, image_root, split, check_counts=check_counts, **options)
    if path.is_file():
        return _hf(path, image_root, split, **options)
    if text.endswith(".json") or os.sep in text and not _looks_like_hub_id(text):
        raise FileNotFoundError(f"{text}: no such file or directory")
    return _hf(text, image_root, split, **options)


#: The options only a Hugging Face dataset reads (which of its columns hold what).
HF_COLUMN_OPTIONS = ("image_column", "caption_column", "image_id_column")


def _hf_columns(columns: dict[str, str], text: str) -> dict[str, str]:
    """The column options, where `text` is read as a Hugging Face dataset; for a Karpathy file (a JSON file, a
    directory with `dataset.json`, a built-in name) `caption_column` alone, as the loader's `caption_field`; refused
    (naming them) for the other formats whose fields are fixed (shards, or `image_column` on a JSON file)."""
    if not columns:
        return {}
    path = Path(text).expanduser()
    karpathy_like = text in BUILTIN_DATASETS or (path / "dataset.json").is_file()
    karpathy_like = karpathy_like or (path.is_file() and path.suffix.lower() == ".json")
    if karpathy_like and find_path_format(text) is None and set(columns) == {"caption_column"}:
        return {"caption_field": columns["caption_column"]}
    fixed = text in BUILTIN_DATASETS or find_path_format(text) is not None or (path / "dataset.json").is_file()
    if fixed or (path.is_file() and path.suffix.lower() == ".json"):
        given = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in columns.items())
        raise ValueError(
            f"{given}: name columns of a Hugging Face dataset (a save_to_disk or data-files directory, a Hub id); "
            f"{text} is read by its own format, whose fields are fixed: drop the option"
        )
    return columns


def _looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) <= 2 and all(parts) and not text.startswith((".", "~"))


def _karpathy(dataset_json: Path, image_root, split, **kwargs):
    from .karpathy import load_karpathy

    return load_karpathy(dataset_json, image_root, split=split, **kwargs)


def _hf(name_or_path, image_root, split, **kwargs):
    from .hf import load_hf_captions

    return load_hf_captions(name_or_path, split, image_root=image_root, **kwargs)
