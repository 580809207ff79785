"""The annotation JSON formats `load_captions` reads, as data: one `DataFormat` entry each, in detection order.

`load_captions` parses a JSON file once, asks each registered format in turn whether it `detect`s the content (the
first that does wins; the file name plays no part) and hands the parsed JSON to that format's `load`. Adding a format
is one `register_format` call:

```python
from itune_hf.data import load_captions
from itune_hf.data.formats import DataFormat, register_format

is_mine = lambda data: isinstance(data, dict) and "my_images" in data
register_format(DataFormat("mine", detect=is_mine, load=load_mine, title="My captions", shape="{'my_images': [...]}"))
load_captions("my_captions.json", split="test")  # -> load_mine(parsed, path, image_root, "test", ...)
```

This module imports only the standard library and the loaders' light modules (`datasets` is imported when loading).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._common import DataFormatError, normalise_split, read_json
from .coco_style import looks_like_coco_style, looks_like_nocaps
from .karpathy import looks_like_karpathy
from .visual_genome import looks_like_visual_genome
from .webdataset import looks_like_shards

__all__ = [
    "DataFormat",
    "detect_format",
    "find_format",
    "find_path_format",
    "list_formats",
    "register_format",
    "unregister_format",
]


@dataclass(frozen=True)
class DataFormat:
    """One annotation JSON format `load_captions` understands.

    Args:
        name: Short name (`detect_format` returns it), e.g. "karpathy".
        detect: Whether parsed JSON is in this format (called in registration order; the first True wins).
        load: `load(parsed, path, image_root, split, *, on_missing, check_counts, **options)` -> one
            `datasets.Dataset` when `split` is given, else a `DatasetDict` of the splits (as `load_captions` returns).
            `path` is the JSON file's `Path`; `options` are the loader-specific keywords of `load_captions`.
        title: What the format is, for messages (e.g. "Karpathy split JSON").
        shape: The JSON shape it expects, for the message about a file no format detects.
        match_path: For a format that is not one JSON file (e.g. WebDataset tar shards): whether `--data` (the text
            as given) names data in this format; checked before any JSON is parsed, and `load` then gets
            `parsed=None` and `path` as that text. Such a format's `detect` may always be False.
    """

    name: str
    detect: Callable[[Any], bool]
    load: Callable[..., Any]
    title: str
    shape: str
    match_path: Callable[[str], bool] | None = None


_FORMATS: dict[str, DataFormat] = {}  # name -> format, in detection order


def register_format(data_format: DataFormat, *, before: str | None = None) -> DataFormat:
    """Add a format; it is tried after the ones registered before it, or before `before`.

    Args:
        data_format: The entry.
        before: Name of a registered format to detect it before (for a format whose files the other would also
            claim); None appends it.

    Raises:
        ValueError: The name is taken, or `before` is not a registered format.
    """
    if data_format.name in _FORMATS:
        raise ValueError(f"A data format named {data_format.name!r} is already registered")
    if before is not None and before not in _FORMATS:
        raise ValueError(f"before={before!r} is not a registered data format; registered: {', '.join(_FORMATS)}")
    entries = list(_FORMATS.values())
    entries.insert(entries.index(_FORMATS[before]) if before is not None else len(entries), data_format)
    _FORMATS.clear()
    _FORMATS.update((entry.name, entry) for entry in entries)
    return data_format


def unregister_format(name: str) -> DataFormat:
    """Remove a registered format and return its entry.

    Args:
        name: Its name.
    """
    if name not in _FORMATS:
        raise ValueError(f"{name!r} is not a registered data format; registered: {', '.join(_FORMATS)}")
    return _FORMATS.pop(name)


def list_formats() -> tuple[DataFormat, ...]:
    """The registered formats, in detection order."""
    return tuple(_FORMATS.values())


def detect_format(data: Any) -> str:
    """The name of the first registered format that detects parsed JSON `data` (e.g. `karpathy`, `nocaps`, `coco`,
    `visual_genome`), else `unknown`.

    Args:
        data: Parsed annotation JSON.
    """
    for data_format in _FORMATS.values():
        if data_format.detect(data):
            return data_format.name
    return "unknown"


def find_path_format(data: str | os.PathLike) -> DataFormat | None:
    """The first registered format whose `match_path` claims `data` (the `--data` text), else None.

    Args:
        data: What `load_captions` was given.
    """
    text = os.fspath(data)
    return next((f for f in _FORMATS.values() if f.match_path is not None and f.match_path(text)), None)


def find_format(data: Any, path: str | os.PathLike) -> DataFormat:
    """The format of parsed JSON `data` read from `path`.

    Args:
        data: Parsed annotation JSON.
        path: The file it came from (named in the error).

    Raises:
        DataFormatError: No registered format detects it; the message lists each format's expected shape.
    """
    name = detect_format(data)
    if name == "unknown":
        expected = "; ".join(f"{f.title} {f.shape}" for f in _FORMATS.values() if f.match_path is None)
        raise DataFormatError(f"{path}: cannot tell the annotation format; expected one of: {expected}")
    return _FORMATS[name]


# ------------------------------------------------------------------------------------------------- the built-ins


def _one_split(dataset: Any, split: str | None, split_name: str) -> Any:
    """A single-split loader's `Dataset` as `load_captions` returns it: itself, or a one-split `DatasetDict`."""
    from datasets import DatasetDict

    return dataset if split is not None else DatasetDict({split_name: dataset})


def _load_karpathy(parsed: Any, path: Path, image_root: Any, split: str | None, **options: Any) -> Any:
    from .karpathy import karpathy_from_data

    return karpathy_from_data(parsed, path, image_root, split=split, **options)


def _coco_style_loader(*, nocaps: bool) -> Callable[..., Any]:
    def load(parsed: Any, path: Path, image_root: Any, split: str | None, **options: Any) -> Any:
        from .coco_style import coco_style_from_data, default_split

        split_name = normalise_split(split, str(path)) if split else default_split(path, nocaps=nocaps)
        dataset = coco_style_from_data(parsed, path, image_root, split=split_name, nocaps=nocaps, **options)
        return _one_split(dataset, split, split_name)

    return load


def _load_webdataset(parsed: Any, path: Any, image_root: Any, split: str | None, **options: Any) -> Any:
    from .webdataset import load_webdataset

    options.pop("check_counts", None)  # shards have no published size
    options.pop("allow_outside_root", None)  # nor paths: their images are members
    return load_webdataset(path, split, **options)


def _load_visual_genome(
    parsed: Any, path: Path, image_root: Any, split: str | None, *, image_data_json: Any = None, **options: Any
) -> Any:
    from .visual_genome import visual_genome_from_data

    if image_data_json is None and (path.parent / "image_data.json").is_file():  # VG ships it beside the regions
        image_data_json = path.parent / "image_data.json"
    dataset = visual_genome_from_data(
        parsed,
        path,
        image_root,
        image_data=read_json(image_data_json) if image_data_json is not None else None,
        image_data_source=str(image_data_json) if image_data_json is not None else None,
        split=split,
        **options,
    )
    return _one_split(dataset, split, "train")


for _format in (  # detection order: a Karpathy file may carry COCO-style fields, NoCaps is COCO-style with domains
    DataFormat(
        "webdataset",
        detect=lambda data: False,  # not a JSON file: claimed by its path
        load=_load_webdataset,
        title="WebDataset tar shards (img2dataset layout)",
        shape="shards/{00000..00009}.tar, shards/*.tar or a directory of .tar: <key>.jpg + <key>.txt/.json",
        match_path=looks_like_shards,
    ),
    DataFormat(
        "visual_genome",
        detect=looks_like_visual_genome,
        load=_load_visual_genome,
        title="Visual Genome region descriptions",
        shape="[{'id', 'regions': [{'phrase', ...}]}]",
    ),
    DataFormat(
        "karpathy",
        detect=looks_like_karpathy,
        load=_load_karpathy,
        title="Karpathy split JSON",
        shape="{'images': [{'filename', 'sentences', 'split', ...}]}",
    ),
    DataFormat(
        "nocaps",
        detect=lambda data: looks_like_coco_style(data) and looks_like_nocaps(data),
        load=_coco_style_loader(nocaps=True),
        title="NoCaps",
        shape="{'images': [{'id', 'file_name', 'domain'}], 'annotations': [{'image_id', 'caption'}]}",
    ),
    DataFormat(
        "coco",
        detect=looks_like_coco_style,
        load=_coco_style_loader(nocaps=False),
        title="COCO-style captions",
        shape="{'images': [{'id', 'file_name'}], 'annotations': [{'image_id', 'caption'}]}",
    ),
):
    register_format(_format)
del _format
