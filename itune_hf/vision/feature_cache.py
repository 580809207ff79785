"""A cache of the frozen vision tower's last hidden states, so training never runs the vision tower.

Layout of a cache directory::

    fingerprint.json            what produced the states (vision model, its config and weights, image processor, dtype)
    shard-00000.safetensors     tensor "states" (n, tokens, width); metadata "image_ids" (JSON list), one per row,
                                and "image_files" (JSON list): each image's file path, size, mtime and SHA-256
    shard-00001.safetensors     ...
    failed.json                 images that could not be read: image id -> {"path", "reason"} (they are skipped)

Shards are written to a temporary name and renamed when complete, so an interrupted run leaves only whole shards
behind and `cache_features` resumes with the images that are not in any shard yet (a missing or damaged shard's
images are cached again, into a new shard). A cache is used only when its fingerprint matches the model and processor
at hand; a mismatch is refused with the differing fields named.

Every entry records which file it was computed from, so a cache never answers for another image of the same id
(another dataset, a regenerated world): the rows' image files are checked against the entries before use. The check
costs one `stat` per image when path, size and mtime are unchanged; a file that moved or was touched is hashed
(SHA-256 of its bytes) and accepted if its content is the same. `cache_features` computes mismatched entries again;
training and `itune eval` refuse them, naming the images.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import InputError, UnknownNameError, is_write_failure, write_failure_message
from ..models._shared.backbones import as_vision_tokens
from ..utils.files import atomic_write_json, read_json, sha256_of_file
from ..utils.numbers import check_finite
from ..utils.output_dirs import claim_output_dir

FINGERPRINT_NAME = "fingerprint.json"
FAILED_NAME = "failed.json"
SHARD_PATTERN = "shard-{:05d}.safetensors"
SAVING_METADATA = frozenset({"processor_class", "auto_map"})  # written by save_pretrained; no effect on pixels
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class FeatureCacheMismatch(ValueError):
    """The cache was made with another vision tower, processor or dtype, or from other image files, than in use."""


def file_identity(path: str | os.PathLike) -> dict[str, Any]:
    """What identifies an image file for the cache: absolute path, size, mtime (ns) and SHA-256 of its bytes.

    Args:
        path: The image file.
    """
    stat = os.stat(path)
    return {
        "path": os.path.abspath(path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": sha256_of_file(path),
    }


def item_identity(item: dict[str, Any]) -> dict[str, Any]:
    """What identifies a batch item's image for the cache: its file's `file_identity`, or, for an image the dataset
    holds (`image_data`), its name, size and SHA-256 of its bytes.

    Args:
        item: A batch item (`itune_hf.data.verify.image_items`).
    """
    from ..data.verify import image_bytes, image_label

    data = image_bytes(item)
    if data is None:
        return file_identity(item["image_path"])
    return {"path": image_label(item), "size": len(data), "sha256": _sha256(data)}


def identity_problem(entry: dict[str, Any] | None, path: str | os.PathLike, data: bytes | None = None) -> str | None:
    """Why the cached `entry` is not the image at `path` (None when it is): cheap when the file is unchanged.

    Args:
        entry: The entry's `file_identity` at caching time (None for caches without one).
        path: The image file the rows name now (or how they name an embedded image).
        data: The embedded image's bytes, for an image the dataset holds (then `path` is only its name).
    """
    if not isinstance(entry, dict):
        return "cached without its file's identity (by an older itune_hf)"
    if data is not None:
        if _sha256(data) != entry.get("sha256"):
            return f"cached from {entry.get('path')}, whose content differs from this image"
        return None
    try:
        stat = os.stat(path)
    except OSError as error:
        return f"its file cannot be read ({error.strerror or error})"
    if stat.st_size != entry.get("size"):
        return f"cached from {entry.get('path')} ({entry.get('size')} bytes), not this file ({stat.st_size} bytes)"
    if os.path.abspath(path) == entry.get("path") and stat.st_mtime_ns == entry.get("mtime_ns"):
        return None
    if sha256_of_file(path) != entry.get("sha256"):
        return f"cached from {entry.get('path')}, whose content differs from this file"
    return None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def vision_fingerprint(vision_model: torch.nn.Module, image_processor: Any, dtype: str) -> dict[str, Any]:
    """What determines the cached states: the vision tower (reference, config, weights), preprocessing, dtype.

    Args:
        vision_model: The frozen vision tower.
        image_processor: The image processor that prepares its inputs.
        dtype: Storage dtype name (`float16`, `bfloat16`, `float32`).
    """
    config = vision_model.config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "dtype", "architectures"):
        config.pop(volatile, None)
    weights = hashlib.sha256()
    for name, tensor in sorted(vision_model.state_dict().items()):
        weights.update(name.encode())
        weights.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    processor = {  # what shapes the pixels: not save_pretrained's metadata (auto_map, processor_class, _private keys)
        k: v for k, v in image_processor.to_dict().items() if k not in SAVING_METADATA and not k.startswith("_")
    }
    return {
        "vision_model": vision_model.config._name_or_path or "(unnamed)",
        "vision_config_sha256": _sha256(json.dumps(config, sort_keys=True, default=str).encode()),
        "vision_weights_sha256": weights.hexdigest(),
        "image_processor_sha256": _sha256(json.dumps(processor, sort_keys=True, default=str).encode()),
        "dtype": dtype,
    }


def _differences(found: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    keys = [k for k in expected if k != "vision_model"]
    return [
        f"{k}: cache has {found.get(k)!r}, model needs {expected[k]!r}" for k in keys if found.get(k) != expected[k]
    ]


@dataclass
class CacheReport:
    """What a `cache_features` run did."""

    directory: Path
    cached: int  # images cached by this run
    already_cached: int  # images found in the cache from an earlier run
    failed: dict[str, dict[str, str]]  # image id -> {"path", "reason"}, for images that could not be read
    recomputed: int = 0  # cached entries computed again: from other image files, or in a damaged or missing shard
    damaged: tuple[str, ...] = ()  # damaged shards found (moved aside as `*.damaged`, their images cached again)


def read_fingerprint(directory: str | os.PathLike) -> dict[str, Any]:
    """The `fingerprint.json` of a feature cache: a mapping with at least its storage `dtype`.

    Args:
        directory: The cache directory.

    Raises:
        FileNotFoundError: the directory holds no cache.
        InputError: the file is not valid JSON, not a mapping, or names no known dtype (damaged, or not a cache's).
    """
    path = Path(directory) / FINGERPRINT_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{directory} is not a feature cache (no {FINGERPRINT_NAME}); create one with `itune cache-features`"
        )
    fingerprint = read_json(path, "the feature cache's fingerprint")
    if not isinstance(fingerprint, dict) or fingerprint.get("dtype") not in DTYPES:
        raise InputError(
            f"{path}: not a feature cache fingerprint (expected a mapping with a dtype of {sorted(DTYPES)}, got "
            f"{json.dumps(fingerprint)[:80]}); build the cache again with itune cache-features into a new directory"
        )
    return fingerprint


class FeatureCache:
    """Read access to a feature cache directory.

    Args:
        directory: The cache directory.
        expected_fingerprint: If given, the cache must have been made with exactly this fingerprint.

    Raises:
        FileNotFoundError: if the directory holds no cache.
        FeatureCacheMismatch: if the fingerprint differs, naming every differing field.
    """

    def __init__(self, directory: str | os.PathLike, expected_fingerprint: dict[str, Any] | None = None) -> None:
        self.directory = Path(directory)
        self.fingerprint = read_fingerprint(self.directory)
        if expected_fingerprint is not None:
            differences = _differences(self.fingerprint, expected_fingerprint)
            if differences:
                raise FeatureCacheMismatch(
                    f"The feature cache {self.directory} was made with another vision tower or preprocessing than "
                    f"this model uses ({'; '.join(differences)}). Delete it or pass another directory, then run "
                    "`itune cache-features` again."
                )
        self._index: dict[str, tuple[Path, int]] = {}
        self._files: dict[str, dict[str, Any] | None] = {}
        self.damaged: dict[Path, str] = {}  # shards that cannot be read: their images count as not cached
        for shard in sorted(self.directory.glob("shard-*.safetensors")):
            try:
                ids, files = _read_shard_index(shard)
            except Exception as error:  # safetensors raises its own error types for damaged files
                self.damaged[shard] = f"{type(error).__name__}: {error}"
                continue
            for row, image_id in enumerate(ids):  # a later shard's entry supersedes an earlier one of that id
                self._index[image_id], self._files[image_id] = (shard, row), files[row]
        self._handles: dict[Path, Any] = {}
        self.failed: dict[str, dict[str, str]] = _read_failed(self.directory / FAILED_NAME)

    def mismatched(self, rows: Any) -> dict[str, str]:
        """Image id -> why, for the cached images whose entry was not computed from the rows' image file.

        Args:
            rows: Dataset rows (`image_id`, `image_path`).
        """
        from ..data.verify import image_items

        problems = {}
        for item in image_items(rows):
            image_id = item["image_id"]
            if image_id in self._index and image_id not in problems:
                problem = self.item_problem(item)
                if problem:
                    problems[image_id] = problem
        return problems

    def item_problem(self, item: dict[str, Any]) -> str | None:
        """Why the cached entry of a batch item's image id is not its image (None when it is).

        Args:
            item: A batch item (`image_id`, `image_path`, maybe `image_data`).
        """
        from ..data.verify import image_bytes, image_label

        problem = identity_problem(self._files.get(item["image_id"]), item["image_path"], image_bytes(item))
        return f"{image_label(item)}: {problem}" if problem else None

    def check_rows(self, rows: Any, where: str) -> None:
        """Refuse rows whose images the cache holds states of other image files for; warn of damaged shards.

        Args:
            rows: Dataset rows (`image_id`, `image_path`).
            where: The data they come from, for the message.

        Raises:
            FeatureCacheMismatch: naming the first images that differ.
        """
        for shard, reason in self.damaged.items():
            warnings.warn(f"feature cache shard {shard} is damaged ({reason}); its images are skipped. Run "
                          "`itune cache-features` again to compute them", stacklevel=2)  # fmt: skip
        problems = self.mismatched(rows)
        if problems:
            shown = "; ".join(list(problems.values())[:3])
            raise FeatureCacheMismatch(
                f"The feature cache {self.directory} holds states of other image files than {where} names for "
                f"{len(problems)} image(s) ({shown}). Run `itune cache-features` on this data into the cache again "
                "(it computes them anew), or use another --feature-cache."
            )

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._index

    def image_ids(self) -> list[str]:
        """Ids of every cached image."""
        return list(self._index)

    def _handle(self, shard: Path):
        if shard not in self._handles:
            self._handles[shard] = safe_open(shard, framework="pt")
        return self._handles[shard]

    def get(self, image_ids: Sequence[str], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The cached states of `image_ids`, stacked: `(len(image_ids), tokens, width)`.

        Raises:
            KeyError: naming the first id that is not cached.
        """
        rows = []
        for image_id in image_ids:
            if image_id not in self._index:
                reason = (self.failed.get(image_id) or {}).get("reason")
                detail = f" (it could not be read: {reason})" if reason else ""
                raise UnknownNameError(f"image {image_id!r} is not in the feature cache {self.directory}{detail}")
            shard, row = self._index[image_id]
            rows.append(self._handle(shard).get_slice("states")[row : row + 1])
        states = torch.cat(rows)
        check_finite({f"images {', '.join(map(str, image_ids[:3]))}": states}, f"feature cache {self.directory}",
                     "the cache is damaged: build it again with itune cache-features into a new directory")  # fmt: skip
        return states.to(dtype)

    def __getstate__(self) -> dict[str, Any]:  # picklable for DataLoader workers: reopen shards lazily
        return {**self.__dict__, "_handles": {}}


def cache_features(
    rows: Iterable[dict[str, Any]],
    directory: str | os.PathLike,
    *,
    vision_model: torch.nn.Module,
    image_processor: Any,
    dtype: str = "float16",
    batch_size: int = 64,
    shard_size: int = 4096,
    on_error: str = "report",
    progress: bool = True,
    overwrite: bool = False,
) -> CacheReport:
    """Run the frozen vision tower over images and store their last hidden states (resumable).

    Args:
        rows: Dataset rows with `image_id` and `image_path` (e.g. a `datasets.Dataset` from `itune_hf.data`).
        directory: Cache directory (created; an existing cache is resumed if its fingerprint matches).
        vision_model: The frozen vision tower.
        image_processor: Its image processor.
        dtype: Storage dtype: `float16` (default; half the disk), `bfloat16` or `float32`.
        batch_size: Images per vision-tower call.
        shard_size: Images per shard file (the unit of resumption).
        on_error: `"report"`: skip unreadable images and list them in `failed.json`; `"error"`: stop at the first.
        progress: Show a progress bar.
        overwrite: Remove what `directory` holds when it is not a feature cache (named on stderr); without it such a
            directory is refused.

    Returns:
        A `CacheReport`.

    Raises:
        FileExistsError: another command writes `directory` (two caches into one would overwrite each other's
            shards), or it holds files that are not a cache's (without `overwrite`).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if on_error not in ("report", "error"):
        raise ValueError(f"on_error must be 'report' or 'error', got {on_error!r}")
    directory = Path(directory)
    lock = claim_output_dir(
        directory, command="itune cache-features", overwrite=overwrite,
        is_previous_output=lambda path: (path / FINGERPRINT_NAME).is_file(),
    )  # fmt: skip
    try:
        return _cache_into(directory, rows, vision_model, image_processor, dtype, batch_size, shard_size, on_error,
                           progress)  # fmt: skip
    finally:
        lock.release()


def _cache_into(directory: Path, rows, vision_model, image_processor, dtype: str, batch_size: int, shard_size: int,
                on_error: str, progress: bool) -> CacheReport:  # fmt: skip
    """`cache_features` once the directory is locked."""
    from tqdm.auto import tqdm

    existing, damaged = _open_cache(directory, vision_fingerprint(vision_model, image_processor, dtype))
    todo, already, recompute = _images_to_cache(rows, existing)
    failed = dict(existing.failed) if existing is not None else {}
    shards = _ShardWriter(directory, shard_size, failed)
    vision_model.eval()
    cached = 0
    bar = tqdm(total=len(todo), unit="image", disable=not progress, desc="caching vision states")
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        ids, images, files = _read_images(batch, on_error, failed)
        if images:
            shards.add(ids, files, _vision_states(vision_model, image_processor, images, DTYPES[dtype]))
            cached += len(ids)
        bar.update(len(batch))
    shards.flush(final=True)
    bar.close()
    atomic_write_json(directory / FAILED_NAME, failed)
    return CacheReport(
        directory=directory, cached=cached, already_cached=already, failed=failed, recomputed=recompute,
        damaged=tuple(damaged),
    )  # fmt: skip


def _read_shard_index(shard: Path) -> tuple[list[str], list[dict[str, Any] | None]]:
    """The image ids of a shard's rows and their file identities (None each for shards written without them).

    Raises:
        ValueError: the shard's metadata does not describe its rows.
    """
    with safe_open(shard, framework="pt") as handle:
        metadata = handle.metadata() or {}
        rows = handle.get_slice("states").get_shape()[0]
    ids = json.loads(metadata["image_ids"])
    files = json.loads(metadata["image_files"]) if "image_files" in metadata else [None] * len(ids)
    if not isinstance(ids, list) or len(ids) != rows or len(files) != rows:
        raise ValueError(f"its metadata lists {len(ids)} images for {rows} rows of states")
    return ids, files


def _read_failed(path: Path) -> dict[str, dict[str, str]]:
    """`failed.json`: image id -> {"path", "reason"} (an older cache's plain reasons are read as reasons)."""
    if not path.is_file():
        return {}
    try:
        failed = json.loads(path.read_text())
    except ValueError:
        return {}  # only a record of skipped images: a damaged one is rebuilt by the next run
    if not isinstance(failed, dict):
        return {}
    return {k: v if isinstance(v, dict) else {"path": "", "reason": str(v)} for k, v in failed.items()}


def _open_cache(directory: Path, fingerprint: dict[str, Any]) -> tuple[FeatureCache | None, list[str]]:
    """Start a cache in `directory` or resume the one there; returns it (None when new) and the damaged shards,
    which are moved aside (`*.damaged`) so that their images are cached again.

    Raises:
        FeatureCacheMismatch: the cache there was made with another fingerprint.
    """
    for leftover in directory.glob("*.partial"):
        leftover.unlink()  # an interrupted shard: its images are cached again
    if not (directory / FINGERPRINT_NAME).is_file():
        atomic_write_json(directory / FINGERPRINT_NAME, fingerprint)
        return None, []
    existing = FeatureCache(directory, expected_fingerprint=fingerprint)  # refuses a mismatched cache
    for shard, reason in existing.damaged.items():
        print(f"feature cache shard {shard} is damaged ({reason}); moved aside, its images are cached again",
              file=sys.stderr)  # fmt: skip
        os.replace(shard, shard.with_suffix(".damaged"))
    return existing, [str(shard) for shard in existing.damaged]


def _images_to_cache(rows: Iterable[dict[str, Any]], existing: FeatureCache | None) -> tuple[list, int, int]:
    """The item of every image to compute (`image_items`), once each (the first row of an id), in row order: those
    not cached and those cached from another image; with how many were already cached and how many are recomputed."""
    from ..data.verify import image_items

    if hasattr(rows, "column_names"):
        items = image_items(rows)
    else:
        items = [{"image_id": row["image_id"], "image_path": row["image_path"]} for row in rows]
    todo, seen, already, recompute = [], set(), 0, 0
    for item in items:
        image_id = item["image_id"]
        if image_id in seen:
            continue
        seen.add(image_id)
        if existing is not None and image_id in existing:
            if existing.item_problem(item):
                recompute += 1
            else:
                already += 1
                continue
        todo.append(item)
    return todo, already, recompute


def _read_images(batch: list[dict[str, Any]], on_error: str, failed: dict[str, dict[str, str]]):
    """The ids, images and identities of `batch`'s items that could be read; the others are added to `failed` by
    path (or name) and reason (or raise, per `on_error`)."""
    from ..data.verify import image_label, open_item_image
    from ..models._shared.images import ImageError

    ids, images, files = [], [], []
    for item in batch:
        image_id = item["image_id"]
        try:
            image = open_item_image(item)
            files.append(item_identity(item))
        except (ImageError, OSError) as error:
            if on_error == "error":
                raise
            failed[image_id] = {"path": image_label(item), "reason": getattr(error, "reason", None) or str(error)}
            continue
        images.append(image)
        ids.append(image_id)
        failed.pop(image_id, None)
    return ids, images, files


def _vision_states(vision_model: torch.nn.Module, image_processor: Any, images: list, dtype: torch.dtype):
    """The vision tower's last hidden states of `images`, on the CPU in the storage `dtype`."""
    parameter = next(vision_model.parameters())
    pixels = image_processor(images, return_tensors="pt")["pixel_values"].to(parameter.device)
    with torch.no_grad():
        output = vision_model(pixel_values=pixels.to(parameter.dtype))
    return as_vision_tokens(output.last_hidden_state).to("cpu", dtype)


class _ShardWriter:
    """Collects states and writes them as shards of `shard_size` images, each atomically (written to a temporary
    name, then renamed), with `failed.json` brought up to date after each shard."""

    def __init__(self, directory: Path, shard_size: int, failed: dict[str, dict[str, str]]) -> None:
        self.directory, self.shard_size, self.failed = directory, shard_size, failed
        # resuming: after the highest shard number in use (not the count: a missing middle shard would make the
        # next shard overwrite the last one); damaged shards moved aside keep their numbers taken too
        numbers = [int(p.name[6:11]) for p in directory.glob("shard-*") if p.name[6:11].isdigit()]
        self.next_shard = max(numbers, default=-1) + 1
        self.ids: list[str] = []
        self.files: list[dict[str, Any]] = []
        self.states: list[torch.Tensor] = []

    def add(self, ids: list[str], files: list[dict[str, Any]], states: torch.Tensor) -> None:
        """Queue the states of `ids` (one row each, computed from `files`) and write every full shard."""
        self.states.append(states)
        self.ids.extend(ids)
        self.files.extend(files)
        self.flush()

    def flush(self, final: bool = False) -> None:
        """Write full shards of `shard_size` images (and, when `final`, the rest)."""
        while self.ids and (len(self.ids) >= self.shard_size or final):
            stacked = torch.cat(self.states)
            count = min(self.shard_size, len(self.ids))
            path = self.directory / SHARD_PATTERN.format(self.next_shard)
            partial = path.with_suffix(".partial")
            metadata = {"image_ids": json.dumps(self.ids[:count]), "image_files": json.dumps(self.files[:count])}
            check_finite({"states": stacked[:count]}, f"the vision states of {self.ids[0]} ...",
                         "the vision tower gives NaN or inf for these images: check the tower's weights")  # fmt: skip
            try:
                save_file({"states": stacked[:count].contiguous()}, str(partial), metadata=metadata)
            except Exception as error:
                if not is_write_failure(error):
                    raise
                partial.unlink(missing_ok=True)  # the complete shards stay: a rerun goes on from them
                raise InputError(write_failure_message(partial, error)) from error
            os.replace(partial, path)
            atomic_write_json(self.directory / FAILED_NAME, self.failed)
            self.next_shard, self.ids, self.states = self.next_shard + 1, self.ids[count:], [stacked[count:]]
            self.files = self.files[count:]
        if not self.ids:
            self.states = []


__all__ = [
    "CacheReport", "FeatureCache", "FeatureCacheMismatch", "cache_features", "file_identity", "identity_problem",
    "read_fingerprint", "vision_fingerprint",
]  # fmt: skip
