"""WebDataset tar shards in img2dataset's layout, streamed through `datasets` (Conceptual Captions and its peers).

A shard is a tar file whose members are grouped by key: `<key>.jpg` (or png, webp, ...) with `<key>.txt` (the
caption) and/or `<key>.json` (its `caption` field); img2dataset writes `00000.tar`, `00001.tar`, ... this way.
`--data` names the shards as a brace pattern (`shards/{00000..00331}.tar`), a glob (`shards/*.tar`), one `.tar` file,
or a directory of them.

`load_webdataset` returns a streaming `datasets.IterableDataset` (one row per sample: the common columns, `image`
holding the image file's bytes and `shard`): nothing is downloaded or decoded whole; a shard is opened when a reader
reaches it and its members are read in order. Each shard is one of the dataset's `n_shards`, so
`IterableDataset.shard(num_processes, rank, contiguous=False)` gives a process its own shards and DataLoader workers
split those again (one reader per shard). Images are checked only by their header here (`PIL.Image.open`); the
pixels are decoded when a batch is built (`decode_image`).

Bad input is reported (a `BadShardWarning` naming the shard and the key) and skipped: a truncated or corrupt tar (the
rest of that shard), a sample without a caption or without an image, an image that does not identify. With
`on_missing="error"` the same problems raise `DataError` instead.
"""

from __future__ import annotations

import glob
import io
import json
import os
import re
import tarfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._common import DataError, OnMissing, check_on_missing, normalise_split

#: File extensions of a sample's image member, in order of preference.
IMAGE_EXTENSIONS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
#: The most bytes one member of a shard may hold: an image, and any other member (a caption, its JSON). A member
#: over its bound is reported naming the shard and member, and its sample skipped: a compressed shard can hold a
#: member that inflates to gigabytes (a 4.3 MB .tar.gz, 4 GiB of caption), which would otherwise be read whole.
#: `read_shard` takes others.
MAX_IMAGE_MEMBER_BYTES = 64 << 20
MAX_TEXT_MEMBER_BYTES = 1 << 20
#: Shard file names a directory is searched for.
SHARD_SUFFIXES: tuple[str, ...] = (".tar", ".tar.gz", ".tgz")
#: Written by `write_shards` before its first shard and removed after its last: a directory holding it is an unfinished
#: shard set (a kill midway); reading it is refused, and the same `itune make-shards` resumes it.
UNFINISHED_NAME = ".itune-shards-unfinished.json"
_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")


class BadShardWarning(UserWarning):
    """A sample or the rest of a shard was skipped; the message names the shard, the key and why."""


def expand_braces(pattern: str) -> list[str]:
    """Expand `{00000..00009}` ranges (zero padding kept) and `{a,b}` choices, as bash and webdataset do.

    Args:
        pattern: e.g. `shards/{00000..00009}.tar`.
    """
    match = _RANGE.search(pattern) or _CHOICE.search(pattern)
    if match is None:
        return [pattern]
    if match.re is _RANGE:
        first, last = match.group(1), match.group(2)
        width = len(first) if first.startswith("0") or len(first) == len(last) else 0
        step = 1 if int(last) >= int(first) else -1
        choices = [str(n).zfill(width) for n in range(int(first), int(last) + step, step)]
    else:
        choices = match.group(1).split(",")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [expanded for choice in choices for expanded in expand_braces(head + choice + tail)]


def looks_like_shards(data: str | os.PathLike) -> bool:
    """Whether `--data` names WebDataset shards: a `.tar` path or pattern, or a directory holding `.tar` files (and
    no `dataset.json`)."""
    text = os.fspath(data)
    if text.endswith(SHARD_SUFFIXES):
        return True
    path = Path(text).expanduser()
    return path.is_dir() and not (path / "dataset.json").is_file() and bool(_shards_in(path))


def _shards_in(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(SHARD_SUFFIXES))


def find_shards(data: str | os.PathLike) -> list[Path]:
    """The shard files `data` names, in order (a pattern's order; a directory's or a glob's sorted); a shard named
    twice (through a symbolic link to its directory, or two patterns) is read once, with a warning.

    Args:
        data: A brace pattern, a glob, a `.tar` file, or a directory of shards.

    Raises:
        FileNotFoundError: a named shard does not exist, or a pattern or directory matches none.
        DataError: a shard lies in an unfinished `make-shards` output (interrupted before its last shard).
    """
    shards, seen, twice = [], set(), []
    for shard in _named_shards(data):
        real = os.path.realpath(shard)
        if real in seen:
            twice.append(str(shard))
            continue
        seen.add(real)
        shards.append(shard)
    if twice:
        warnings.warn(f"--data {os.fspath(data)}: {len(twice)} shard(s) named twice (e.g. {twice[0]}, the same file "
                      "as one named before, through a link or another pattern): each is read once", BadShardWarning,
                      stacklevel=2)  # fmt: skip
    for directory in sorted({shard.parent for shard in shards}):
        marker = directory / UNFINISHED_NAME
        if marker.is_file():
            raise DataError(
                f"{directory}: an unfinished itune make-shards output (interrupted before its last shard; "
                f"{marker.name} is still there): run the same itune make-shards command again to finish it"
            )
    return shards


def _named_shards(data: str | os.PathLike) -> list[Path]:
    text = os.path.expanduser(os.fspath(data))
    if Path(text).is_dir():
        shards = _shards_in(Path(text))
        if not shards:
            raise FileNotFoundError(f"{text}: no {'/'.join(SHARD_SUFFIXES)} shards in this directory")
        return shards
    shards: list[Path] = []
    for pattern in expand_braces(text):
        if glob.has_magic(pattern):
            matched = sorted(glob.glob(pattern))
            if not matched:
                raise FileNotFoundError(f"{pattern}: matches no shard (from --data {text})")
            shards += [Path(p) for p in matched]
        elif Path(pattern).is_file():
            shards.append(Path(pattern))
        else:
            raise FileNotFoundError(f"{pattern}: no such shard (from --data {text}); check the pattern's range")
    return shards


#: Why a sample whose members are apart in its tar is not read (`read_shard` reads a shard as a stream).
UNGROUPED = (
    "a WebDataset shard holds each sample's members one after another, and the parts read apart are skipped; "
    "write the tar with its files sorted by name (tar --sort=name), or with itune make-shards"
)


def _split_name(member_name: str) -> tuple[str, str]:
    """`dir/0001.jpg` -> (`dir/0001`, `jpg`): the key is everything before the first dot of the file name."""
    directory, _, name = member_name.rpartition("/")
    stem, _, extension = name.partition(".")
    return (f"{directory}/{stem}" if directory else stem), extension.lower()


class _NotUtf8(ValueError):
    """A sample's .txt caption is not UTF-8 text (replacement characters would be trained on)."""


def _caption(members: dict[str, bytes]) -> str | None:
    if "txt" in members:
        try:
            text = members["txt"].decode("utf-8").strip()
        except UnicodeDecodeError as error:
            raise _NotUtf8(f"its .txt caption is not UTF-8 text ({error.reason} at byte {error.start})") from None
        if text:
            return text
    if "json" in members:
        try:
            caption = json.loads(members["json"]).get("caption")
        except (ValueError, AttributeError):
            return None
        if isinstance(caption, str) and caption.strip():
            return caption.strip()
    return None


def _report(shard: str, key: str | None, reason: str, on_missing: OnMissing) -> None:
    message = f"{shard}: {f'key {key!r}: ' if key is not None else ''}{reason}"
    if on_missing == "error":
        raise DataError(message + " (pass --on-missing report to skip it and go on)")
    warnings.warn(BadShardWarning(message + "; skipped"), stacklevel=3)


def _sample(shard: str, key: str, members: dict[str, bytes], on_missing: OnMissing) -> dict[str, Any] | None:
    """The row of one sample's members, or None (reported) when it has no image, no caption or an unknown image."""
    from PIL import Image, UnidentifiedImageError

    extension = next((e for e in IMAGE_EXTENSIONS if e in members), None)
    if extension is None:
        _report(shard, key, f"no image member (.{', .'.join(IMAGE_EXTENSIONS)}) among {sorted(members)}", on_missing)
        return None
    try:
        caption = _caption(members)
    except _NotUtf8 as error:
        _report(shard, key, str(error), on_missing)
        return None
    if caption is None:
        _report(shard, key, "no caption (an empty or missing .txt, and no .json 'caption')", on_missing)
        return None
    try:
        with Image.open(io.BytesIO(members[extension])):  # the header only: pixels are decoded when used
            pass
    except (UnidentifiedImageError, OSError, ValueError) as error:
        _report(shard, key, f"the .{extension} member is not a readable image ({error})", on_missing)
        return None
    return {
        "image_id": key,
        "image_path": "",
        "captions": [caption],
        "split": "train",
        "image": members[extension],
        "shard": shard,
    }


#: The first bytes of the compressed tars `tarfile` reads (gzip, bzip2, xz): their lengths say nothing of the tar's
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


def _cut_short(shard: str, end: int) -> bool:
    """Whether an uncompressed tar whose members end at byte `end` lacks its end-of-archive blocks (two of 512 zero
    bytes): the stream reader ends quietly where a truncation cuts a member header."""
    with open(shard, "rb") as handle:
        if handle.read(6).startswith(_COMPRESSED):
            return False
    return os.path.getsize(shard) - end < 2 * tarfile.BLOCKSIZE


def read_shard(
    shard: str | os.PathLike,
    on_missing: OnMissing = "report",
    *,
    max_image_bytes: int = MAX_IMAGE_MEMBER_BYTES,
    max_text_bytes: int = MAX_TEXT_MEMBER_BYTES,
) -> Iterator[dict[str, Any]]:
    """The samples of one shard, in member order, each a row (see the module docstring); bad ones reported.

    Args:
        shard: The tar file.
        on_missing: `"report"` warns `BadShardWarning` and skips; `"error"` raises `DataError`.
        max_image_bytes: The most bytes an image member may hold (its sample is reported and skipped beyond).
        max_text_bytes: The most bytes any other member may hold.
    """
    shard = os.fspath(shard)
    key, members, seen = None, {}, set()
    try:
        with tarfile.open(shard, mode="r|*") as tar:  # a stream: members in order, nothing seeked or held
            for member in tar:
                if not member.isfile() or member.name.rpartition("/")[2].startswith("."):
                    continue  # directories, links, and hidden files (macOS's ._ resource forks): no sample's
                member_key, extension = _split_name(member.name)
                if member_key != key:
                    row = _sample(shard, key, members, on_missing) if key is not None and members is not None else None
                    if row is not None:
                        yield row
                    if member_key in seen:
                        _report(shard, member_key, f"more of its members follow key {key!r}: {UNGROUPED}", on_missing)
                    key, members = member_key, {}
                    seen.add(key)
                if members is None:  # a member of this sample was over its bound: the sample is skipped
                    continue
                bound = max_image_bytes if extension in IMAGE_EXTENSIONS else max_text_bytes
                if member.size > bound:  # the header's size: nothing is inflated to find it out
                    _report(shard, key, f"member {member.name} holds {member.size:,} bytes, over the bound of "
                            f"{bound:,} for a .{extension} member", on_missing)  # fmt: skip
                    members = None
                    continue
                members[extension] = tar.extractfile(member).read(bound + 1)
        if _cut_short(shard, tar.offset):
            raise tarfile.ReadError(f"the file ends {os.path.getsize(shard) - tar.offset} bytes after the last member")
    except (tarfile.TarError, OSError, EOFError) as error:
        after = f"after key {key!r}" if key is not None else "at its start"
        _report(shard, None, f"truncated or corrupt tar {after} ({error}); the rest of the shard", on_missing)
        return
    if key is not None and members is not None:
        row = _sample(shard, key, members, on_missing)
        if row is not None:
            yield row


def _read_shards(shards: list[str], on_missing: OnMissing) -> Iterator[dict[str, Any]]:
    """The generator behind the `IterableDataset`: `datasets` hands each reader its own part of `shards`."""
    for shard in shards:
        yield from read_shard(shard, on_missing)


def count_samples(shard: str | os.PathLike, on_missing: OnMissing = "report") -> int:
    """Samples of a shard with an image and a caption member, from its member headers alone (no data is read from
    an uncompressed shard: the reader seeks over it), as `read_shard` reads them: a sample is a run of consecutive
    members with one key. A truncated shard counts what precedes the damage.

    Args:
        shard: The tar file.
        on_missing: A sample whose members are apart in the tar is reported (`"report"`: `BadShardWarning`, once per
            shard) or refused (`"error"`: `DataError`).
    """
    runs: list[tuple[str, set[str]]] = []
    try:
        with tarfile.open(os.fspath(shard), mode="r:*") as tar:
            for member in tar:
                if member.isfile() and not member.name.rpartition("/")[2].startswith("."):
                    key, extension = _split_name(member.name)
                    if not runs or runs[-1][0] != key:
                        runs.append((key, set()))
                    runs[-1][1].add(extension)
    except (tarfile.TarError, OSError, EOFError):
        pass  # reported, with the key, when the shard is read
    _report_apart(os.fspath(shard), [key for key, _ in runs], on_missing)
    images = set(IMAGE_EXTENSIONS)
    return sum(1 for _, found in runs if found & images and found & {"txt", "json"})


def _report_apart(shard: str, keys: list[str], on_missing: OnMissing) -> None:
    """Report the first key of a shard's member runs `keys` that comes again after another, and how many do."""
    seen, apart = set(), []
    for previous, key in zip([None, *keys], keys):
        if key in seen:
            apart.append((key, previous))
        seen.add(key)
    if apart:
        key, previous = apart[0]
        more = f" (and {len(apart) - 1} more such runs)" if len(apart) > 1 else ""
        _report(shard, key, f"more of its members follow key {previous!r}{more}: {UNGROUPED}", on_missing)


def stream_features():
    """The `datasets.Features` of a streamed shard row."""
    from datasets import Value

    from ._common import caption_features

    return caption_features({"image": Value("binary"), "shard": Value("string")})


def load_webdataset(
    data: str | os.PathLike,
    split: str | None = None,
    *,
    on_missing: OnMissing = "report",
    count: bool = True,
):
    """Stream WebDataset shards (img2dataset layout) as a `datasets.IterableDataset`, one row per sample.

    Columns: `image_id` (the key), `image_path` (empty: the image is in `image`), `captions` (the one caption),
    `split` (`train`), `image` (the image file's bytes, not decoded) and `shard` (the tar it came from). The dataset
    has one `datasets` shard per tar file (`n_shards`). With `count`, the samples are counted once from the tar
    headers and recorded as `info.splits["train"].num_examples` (an epoch's length for training), per shard as its
    `shard_lengths`.

    Args:
        data: A brace pattern (`shards/{00000..00009}.tar`), a glob, a `.tar` file or a directory of shards.
        split: `train` or None (None gives an `IterableDatasetDict` with a `train` split): shards have no other.
        on_missing: `"report"` skips bad samples and shards with a `BadShardWarning`; `"error"` raises `DataError`.
        count: Count the samples (headers only; seconds per thousand shards when they are uncompressed).

    Raises:
        FileNotFoundError: a named shard does not exist, or a pattern matches none.
        ValueError: a split other than `train`.
    """
    from datasets import IterableDataset, IterableDatasetDict, SplitDict, SplitInfo

    check_on_missing(on_missing)
    if split is not None and normalise_split(split, os.fspath(data)) != "train":
        raise ValueError(f"{data}: WebDataset shards are one training split; got split={split!r}")
    shards = [str(path) for path in find_shards(data)]
    dataset = IterableDataset.from_generator(
        _read_shards, features=stream_features(), gen_kwargs={"shards": shards, "on_missing": on_missing}
    )
    if count:
        started = time.perf_counter()
        counts = [count_samples(shard, on_missing) for shard in shards]
        samples = sum(counts)
        dataset.info.splits = SplitDict({"train": SplitInfo("train", num_examples=samples, shard_lengths=counts)})
        dataset.info.description = (
            f"{os.fspath(data)}: {samples:,} samples in {len(shards):,} WebDataset shards "
            f"(counted from the tar headers in {time.perf_counter() - started:.1f}s)"
        )
    return dataset if split is not None else IterableDatasetDict({"train": dataset})


def decode_image(row: dict[str, Any]):
    """The RGB `PIL.Image` of a streamed row's `image` bytes (decoded now).

    Args:
        row: A row or batch item with `image` (bytes), `shard` and `image_id`.

    Raises:
        ImageError: naming the shard and key, when the bytes do not decode.
    """
    from PIL import Image

    from ..models._shared.images import ImageError, open_image

    source = f"{row.get('shard', '?')}: key {row.get('image_id')!r}"
    try:
        opened = Image.open(io.BytesIO(row["image"]))
    except OSError as error:
        raise ImageError(source, f"not a readable image ({error})") from None
    return open_image(opened, source)


def write_shards(
    rows: Any,
    output_dir: str | os.PathLike,
    *,
    shard_size: int = 1000,
    caption_index: int = 0,
    identity: dict[str, Any] | None = None,
) -> list[Path]:
    """Write caption rows as img2dataset-style shards `00000.tar`, `00001.tar`, ...: per image `<key>.<ext>` (the
    file's bytes, not re-encoded), `<key>.txt` (one caption) and `<key>.json` (`key`, `caption`, `image_id`).

    Args:
        rows: Rows with `image_path` and `captions` (e.g. a split from `load_captions`).
        output_dir: Directory to write (created).
        shard_size: Samples per shard.
        caption_index: Which of each image's captions to write (the last one when it has fewer).
        identity: What else makes the set (the data, the split), recorded with the settings in the unfinished marker
            (`UNFINISHED_NAME`) so that a rerun resumes only the same set.

    Each shard is written under a temporary name and moved into place whole; the marker, written first and removed
    last, makes an interrupted set unreadable (`find_shards` refuses it) until a rerun with the same settings writes
    the shards that are missing.

    Returns:
        The shard paths.
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be at least 1; got {shard_size}")
    if caption_index < 0:
        raise ValueError(f"caption_index must be at least 0; got {caption_index}")
    from ..utils.files import atomic_path, atomic_write_json

    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    identity = {"rows": len(rows), "shard_size": shard_size, "caption_index": caption_index, **(identity or {})}
    atomic_write_json(output / UNFINISHED_NAME, identity)  # before the first shard; removed after the last
    written: list[Path] = []
    for first in range(0, len(rows), shard_size):
        written.append(output / f"{len(written):05d}.tar")
        if written[-1].is_file():  # complete (each shard is moved into place whole): written by the run resumed
            continue
        with atomic_path(written[-1]) as temporary, tarfile.open(temporary, mode="w") as tar:
            for index in range(first, min(first + shard_size, len(rows))):
                _add_sample(tar, index, rows[index], caption_index)
    (output / UNFINISHED_NAME).unlink()
    return written


def unfinished_shards(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    """What an unfinished `write_shards` into `output_dir` was writing (its settings), or None if there is none.

    Args:
        output_dir: A shard directory.
    """
    try:
        return json.loads((Path(output_dir) / UNFINISHED_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # cut short while written: nothing of the set to trust


def _add_sample(tar: tarfile.TarFile, index: int, row: dict[str, Any], caption_index: int) -> None:
    key = f"{index:09d}"
    image = Path(row["image_path"])
    caption = row["captions"][min(caption_index, len(row["captions"]) - 1)]
    meta = {"key": key, "caption": caption, "image_id": str(row["image_id"])}
    extension = image.suffix.lstrip(".").lower() or "jpg"
    for name, payload in (
        (f"{key}.{extension}", image.read_bytes()),
        (f"{key}.txt", caption.encode()),
        (f"{key}.json", json.dumps(meta).encode()),
    ):
        _add_member(tar, name, payload)


def _add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(payload), 0, 0o644  # reproducible shards
    tar.addfile(info, io.BytesIO(payload))


__all__ = [
    "BadShardWarning", "IMAGE_EXTENSIONS", "count_samples", "decode_image", "expand_braces", "find_shards",
    "load_webdataset", "looks_like_shards", "read_shard", "stream_features", "write_shards",
]  # fmt: skip
