"""Hugging Face datasets (a Hub id when the Hub is reachable, a `save_to_disk` directory, or a local data-files
directory such as an `imagefolder` with `metadata.jsonl`) normalised to the common caption columns.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._common import (
    OUTSIDE_ROOT_FLAG,
    DataError,
    OnMissing,
    absolute,
    caption_features,
    check_on_missing,
    check_under_root,
    drop_empty_captions,
    drop_unusable,
    file_problem,
    image_id_text,
    split_named,
)

#: Column names tried, in order, when `image_column` / `caption_column` / `image_id_column` are not given.
IMAGE_COLUMN_CANDIDATES: tuple[str, ...] = ("image", "img", "image_path", "filepath", "file_name", "filename", "path")
CAPTION_COLUMN_CANDIDATES: tuple[str, ...] = ("captions", "caption", "sentences", "text", "raw", "sentences_raw")
ID_COLUMN_CANDIDATES: tuple[str, ...] = ("image_id", "img_id", "cocoid", "imgid", "id")


def is_saved_dataset(path: str | os.PathLike) -> bool:
    """Whether `path` is a directory written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`."""
    path = Path(path)
    return path.is_dir() and any((path / name).is_file() for name in ("dataset_dict.json", "state.json"))


def _load(name_or_path: str, config_name: str | None, revision: str | None, cache_dir: str | None):
    import datasets

    local = Path(name_or_path).expanduser()
    try:
        if is_saved_dataset(local):
            return datasets.load_from_disk(str(local))
        return datasets.load_dataset(
            str(local) if local.exists() else name_or_path, config_name, revision=revision, cache_dir=cache_dir
        )
    except Exception as error:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError, ...)
        offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE")
        hint = ""
        if not local.exists():
            hint = " (not a local path; as a Hub id it needs the Hub, " + (
                "and HF_HUB_OFFLINE is set)" if offline else "which may be unreachable)"
            )
        raise DataError(
            f"{name_or_path}: could not load as a Hugging Face dataset{hint}: {type(error).__name__}: {error}"
        ) from error


def _pick_column(dataset, explicit: str | None, candidates: tuple[str, ...], what: str, source: str) -> str | None:
    if explicit is not None:
        if explicit not in dataset.column_names:
            raise DataError(f"{source}: no {what} column {explicit!r}; columns: {', '.join(dataset.column_names)}")
        return explicit
    for name in candidates:
        if name in dataset.column_names:
            return name
    return None


def _captions(value: Any, source: str, index: int) -> list[str]:
    """Normalise one caption cell: a string, a list of strings, Karpathy sentences, or a `{"raw": [...]}` dict."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value.strip()]
    if isinstance(value, dict) and "raw" in value:
        return _captions(value["raw"], source, index)
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            if isinstance(item, str):
                out.append(item.strip())
            elif isinstance(item, dict) and isinstance(item.get("raw"), str):
                out.append(item["raw"].strip())
            else:
                raise DataError(f"{source}: row {index}: caption item {item!r} is neither a string nor {{'raw': ...}}")
        return out
    raise DataError(f"{source}: row {index}: caption value of type {type(value).__name__} is not text")


def load_hf_captions(
    name_or_path: str | os.PathLike,
    split: str | None = None,
    *,
    image_column: str | None = None,
    caption_column: str | None = None,
    image_id_column: str | None = None,
    image_root: str | os.PathLike | None = None,
    on_missing: OnMissing = "report",
    allow_outside_root: bool = False,
    config_name: str | None = None,
    revision: str | None = None,
    cache_dir: str | None = None,
):
    """Load a Hugging Face dataset and normalise it to the common caption columns.

    Columns: `image_id`, `image_path` (absolute path of the image file, or "" when the image is embedded),
    `captions`, `split`, and `image` (a `datasets.Image` column) when the images are embedded bytes (as after
    `save_to_disk`). Use `open_example_image(example)` to get the PIL image of a row either way.

    Rows whose captions are single strings are grouped by image (one row per caption, as in COCO-style datasets,
    becomes one row per image): by the id column where there is one (rows of one id naming different image files
    are refused), else by the image file; embedded images without a file name stay one row each.
    Split names `validation`/`dev` are reported as `val` and `restval` rows join `train`; rows with a `split` column
    (e.g. one Flickr30k table with a `split` field) are split on it, row by row.

    Args:
        name_or_path: A Hub dataset id (needs the Hub), a `save_to_disk` directory, or a local data-files directory
            or file that `datasets.load_dataset` reads (e.g. an `imagefolder` with `metadata.jsonl`).
        split: The split to return as one `Dataset` (`train`, `val`/`validation`, `test`, or any split name of the
            dataset); None returns a `DatasetDict` of every split.
        image_column: Column with the image (a `datasets.Image` or a path string); default: the first of
            `IMAGE_COLUMN_CANDIDATES` present.
        caption_column: Column with the caption(s); default: the first of `CAPTION_COLUMN_CANDIDATES` present.
        image_id_column: Column with the image id; default: the first of `ID_COLUMN_CANDIDATES` present, else the
            image file name, else the row number.
        image_root: Directory relative image paths are resolved against; defaults to the dataset directory (local)
            or the current directory.
        on_missing: For images given as paths: `"report"` drops rows whose file is missing or empty and warns
            `UnusableImagesWarning`; `"error"` raises `UnusableImagesError`. Both list the paths.
        allow_outside_root: Read relative image paths that lead out of the image root (`..`, a symlink out of
            it; `--allow-outside-image-root`); by default they are refused with `DataError`, naming the row.
            Absolute paths (as `datasets` stores them) are read where they are.
        config_name: The dataset configuration (`datasets.load_dataset`'s `name`).
        revision: The Hub revision.
        cache_dir: The `datasets` cache directory for `load_dataset`.

    Raises:
        DataError: the dataset cannot be loaded (e.g. a Hub id while offline), has no such split, or no image /
            caption column can be found (the message lists the columns).
    """
    from datasets import DatasetDict

    check_on_missing(on_missing)
    source = str(name_or_path)
    loaded = _by_split(_as_dataset_dict(_load(source, config_name, revision, cache_dir), source), source)
    local = Path(source).expanduser()
    root = absolute(image_root) if image_root is not None else (absolute(local) if local.is_dir() else absolute("."))
    options = dict(
        image_column=image_column,
        caption_column=caption_column,
        image_id_column=image_id_column,
        root=root,
        on_missing=on_missing,
        allow_outside_root=allow_outside_root,
    )
    if split is None:
        return DatasetDict({name: _normalise(dataset, source, name, **options) for name, dataset in loaded.items()})
    wanted = split_named(split)
    if wanted not in loaded:
        raise DataError(f"{source}: no split {split!r}; splits: {', '.join(loaded)}")
    return _normalise(loaded[wanted], source, wanted, **options)


def _as_dataset_dict(loaded, source: str):
    """`loaded` as a `DatasetDict` (a lone `Dataset` becomes its `train` split)."""
    from datasets import Dataset, DatasetDict

    if isinstance(loaded, Dataset):
        loaded = DatasetDict({"train": loaded})
    if not isinstance(loaded, DatasetDict):
        raise DataError(f"{source}: expected a Dataset or DatasetDict, got {type(loaded).__name__}")
    return loaded


def _by_split(loaded, source: str):
    """The dataset's splits under their own names (`split_named`: `validation` is `val`): a table with a `split`
    column is split row by row on it (a lone table holding train, val and test was all `train`), and `restval` joins
    `train` (Karpathy's convention). Two splits that mean the same (`val` and `validation`) are refused.

    Raises:
        DataError: naming the two splits.
    """
    from datasets import DatasetDict, concatenate_datasets

    parts: dict[str, list] = {}
    named: dict[str, list[str]] = {}
    for name, dataset in loaded.items():
        for split, rows in _rows_by_split(dataset, split_named(name)):
            parts.setdefault(split, []).append(rows)
            named.setdefault(split, []).append(name)
    for split, names in named.items():
        clashing = sorted({name for name in names if str(name).lower() != "restval"})
        if len(clashing) > 1:
            raise DataError(
                f"{source}: the splits {' and '.join(map(repr, clashing))} both mean {split!r}: keep one, or "
                "rename the other"
            )
    return DatasetDict(
        {split: rows[0] if len(rows) == 1 else concatenate_datasets(rows) for split, rows in parts.items()}
    )


def _rows_by_split(dataset, split: str) -> list[tuple[str, Any]]:
    """`dataset` (the split `split` of its source) as `(split, rows)` by its `split` column, where it has one (rows
    without a value stay in `split`)."""
    if "split" not in dataset.column_names:
        return [(split, dataset)]
    groups: dict[str, list[int]] = {}
    for index, value in enumerate(dataset["split"]):
        groups.setdefault(split if value is None else split_named(value), []).append(index)
    if list(groups) == [split]:
        return [(split, dataset)]
    return [(name, dataset.select(indices)) for name, indices in groups.items()]


def _normalise(
    dataset,
    source: str,
    split: str,
    *,
    image_column: str | None,
    caption_column: str | None,
    image_id_column: str | None,
    root: Path,
    on_missing: OnMissing,
    allow_outside_root: bool,
):
    """One split as the common caption columns (see `load_hf_captions`), unusable image files dropped or raised."""
    where = f"{source} [{split}]"
    image_col, caption_col, id_col = _pick_columns(dataset, where, image_column, caption_column, image_id_column)
    image_cells = _image_cells(dataset, image_col)
    caption_cells = dataset[caption_col]
    ids = dataset[id_col] if id_col is not None else None

    rows: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    embedded = False
    for index, (cell, caption_cell) in enumerate(zip(image_cells, caption_cells)):
        captions = _captions(caption_cell, where, index)
        path, has_bytes = _image_path(cell, root, where, index, image_col)
        embedded = embedded or has_bytes
        if ids is not None:
            image_id = image_id_text(ids[index], f"{where}: row {index}", id_col)  # 1.0 is "1", as in JSON files
        elif path:
            image_id = os.path.splitext(os.path.basename(path))[0]
        else:
            image_id = str(index)
        grouped = (ids is not None or path) and isinstance(caption_cell, str)  # one row per caption: by image
        if grouped and image_id in by_id:
            first = by_id[image_id]
            if ids is not None and path and first["image_path"] and path != first["image_path"]:
                raise DataError(
                    f"{where}: rows {first['_index']} and {index} have the same image id {image_id!r} ({id_col}) "
                    f"but different images ({first['image_path']}, {path}); give each image its own id"
                )
            first["captions"].extend(captions)
            continue
        row = {"image_id": image_id, "image_path": path, "captions": captions, "split": split, "_index": index}
        rows.append(row)
        by_id.setdefault(image_id, row)

    drop_empty_captions(rows, where, stacklevel=5)
    if not allow_outside_root:  # a relative path is resolved against the root, so it must stay under it
        relative = [row for row in rows if _relative(image_cells[row["_index"]])]
        check_under_root(
            relative, source=where, image_root=root, option=f"{OUTSIDE_ROOT_FLAG} (allow_outside_root=True)"
        )
    problems = _file_problems(rows, image_cells, embedded)
    rows, _ = drop_unusable(rows, problems, on_missing=on_missing, source=where, image_root=str(root), stacklevel=5)
    return _to_dataset(dataset, rows, image_col, embedded)


def _pick_columns(
    dataset, where: str, image_column: str | None, caption_column: str | None, image_id_column: str | None
) -> tuple[str, str, str | None]:
    """The image, caption and (optional) image id columns: the ones given, else the first known name present."""
    image_col = _pick_column(dataset, image_column, IMAGE_COLUMN_CANDIDATES, "image", where)
    caption_col = _pick_column(dataset, caption_column, CAPTION_COLUMN_CANDIDATES, "caption", where)
    if image_col is None or caption_col is None:
        missing = "image" if image_col is None else "caption"
        raise DataError(
            f"{where}: cannot tell which column holds the {missing}; columns: {', '.join(dataset.column_names)} "
            f"(pass --{missing}-column NAME, or {missing}_column= to load_captions)"
        )
    return image_col, caption_col, _pick_column(dataset, image_id_column, ID_COLUMN_CANDIDATES, "image id", where)


def _image_cells(dataset, image_col: str) -> list:
    """The image column's cells: path strings, or `{"path", "bytes"}` for a `datasets.Image` column (`bytes` only
    flagged, never read: True where present, else None)."""
    from datasets import Image

    if not isinstance(dataset.features[image_col], Image):
        return dataset[image_col]
    # Read the storage struct {"bytes", "path"} as Arrow: paths as Python strings, bytes only as null flags.
    column = dataset.with_format("arrow")[image_col]
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    return [
        {"path": path, "bytes": True if flag else None}
        for path, flag in zip(column.field("path").to_pylist(), column.field("bytes").is_valid().to_pylist())
    ]


def _relative(cell: Any) -> bool:
    """Whether an image cell names a relative path (a path string, or the `path` of `datasets.Image` storage)."""
    path = (cell.get("path") if isinstance(cell, dict) else cell) or ""
    return isinstance(path, str) and bool(path) and not Path(path).expanduser().is_absolute()


def _image_path(cell: Any, root: Path, where: str, index: int, image_col: str) -> tuple[str, bool]:
    """`(absolute path or "", whether the image is embedded bytes)` of one image cell; relative paths are under
    `root`. An embedded image keeps its path only where that file exists."""
    if isinstance(cell, dict):  # datasets.Image storage: {"bytes", "path"}
        has_bytes = cell.get("bytes") is not None
        if cell.get("path"):
            candidate = Path(cell["path"]).expanduser()
            candidate = candidate if candidate.is_absolute() else root / candidate
            if not has_bytes or candidate.is_file():
                return str(candidate), has_bytes
        return "", has_bytes
    if isinstance(cell, str) and cell:
        candidate = Path(cell).expanduser()
        return str(candidate if candidate.is_absolute() else root / candidate), False
    raise DataError(f"{where}: row {index}: image column {image_col!r} holds {type(cell).__name__}")


def _file_problems(rows: list[dict[str, Any]], image_cells: list, embedded: bool) -> list[tuple[int, str]]:
    """`(row position, reason)` for each row whose image is a file that is missing or empty (not embedded bytes)."""
    problems = []
    for position, row in enumerate(rows):
        if row["image_path"] and not (embedded and image_cells[row["_index"]].get("bytes") is not None):
            reason = file_problem(row["image_path"])
            if reason is not None:
                problems.append((position, reason))
    return problems


def _to_dataset(dataset, rows: list[dict[str, Any]], image_col: str, embedded: bool):
    """The rows as a `Dataset` of the caption columns, plus the embedded images as an `image` column."""
    from datasets import Dataset, concatenate_datasets

    features = caption_features()
    base = Dataset.from_dict({name: [row[name] for row in rows] for name in features}, features=features)
    if not embedded:
        return base
    image_part = dataset.select([row["_index"] for row in rows]).select_columns([image_col])
    if image_col != "image":
        image_part = image_part.rename_column(image_col, "image")
    return concatenate_datasets([base, image_part], axis=1)
