"""A cache of the frozen vision tower's last hidden states, so training never runs the vision tower.

Layout of a cache directory::

    fingerprint.json            what produced the states (vision model, its config and weights, image processor, dtype)
    shard-00000.safetensors     tensor "states" (n, tokens, width); metadata "image_ids" (JSON list), one per row
    shard-00001.safetensors     ...
    failed.json                 images that could not be read, with the reason (they are skipped)

Shards are written to a temporary name and renamed when complete, so an interrupted run leaves only whole shards
behind and `cache_features` resumes with the images that are not in any shard yet. A cache is used only when its
fingerprint matches the model and processor at hand; a mismatch is refused with the differing fields named.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ._io import atomic_write_json

FINGERPRINT_NAME = "fingerprint.json"
FAILED_NAME = "failed.json"
SHARD_PATTERN = "shard-{:05d}.safetensors"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class FeatureCacheMismatch(ValueError):
    """The cache was made with another vision tower, processor or dtype than the one in use."""


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
    processor = image_processor.to_dict()
    for saving_metadata in ("processor_class", "auto_map"):  # written by save_pretrained; no effect on pixels
        processor.pop(saving_metadata, None)
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
    failed: dict[str, str]  # image id -> reason, for images that could not be read


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
        fingerprint_path = self.directory / FINGERPRINT_NAME
        if not fingerprint_path.is_file():
            raise FileNotFoundError(
                f"{self.directory} is not a feature cache (no {FINGERPRINT_NAME}); create one "
                "with `itune cache-features`"
            )
        self.fingerprint = json.loads(fingerprint_path.read_text())
        if expected_fingerprint is not None:
            differences = _differences(self.fingerprint, expected_fingerprint)
            if differences:
                raise FeatureCacheMismatch(
                    f"The feature cache {self.directory} was made with another vision tower or preprocessing than "
                    f"this model uses ({'; '.join(differences)}). Delete it or pass another directory, then run "
                    "`itune cache-features` again."
                )
        self._index: dict[str, tuple[Path, int]] = {}
        for shard in sorted(self.directory.glob("shard-*.safetensors")):
            with safe_open(shard, framework="pt") as handle:
                ids = json.loads(handle.metadata()["image_ids"])
            for row, image_id in enumerate(ids):
                self._index[image_id] = (shard, row)
        self._handles: dict[Path, Any] = {}
        failed_path = self.directory / FAILED_NAME
        self.failed: dict[str, str] = json.loads(failed_path.read_text()) if failed_path.is_file() else {}

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
                reason = self.failed.get(image_id)
                detail = f" (it could not be read: {reason})" if reason else ""
                raise KeyError(f"image {image_id!r} is not in the feature cache {self.directory}{detail}")
            shard, row = self._index[image_id]
            rows.append(self._handle(shard).get_slice("states")[row : row + 1])
        return torch.cat(rows).to(dtype)

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

    Returns:
        A `CacheReport`.
    """
    from tqdm.auto import tqdm

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if on_error not in ("report", "error"):
        raise ValueError(f"on_error must be 'report' or 'error', got {on_error!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    done, failed = _open_cache(directory, vision_fingerprint(vision_model, image_processor, dtype))
    todo = _images_to_cache(rows, done)
    shards = _ShardWriter(directory, shard_size, failed)
    vision_model.eval()
    cached = 0
    bar = tqdm(total=len(todo), unit="image", disable=not progress, desc="caching vision states")
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        ids, images = _read_images(batch, on_error, failed)
        if images:
            shards.add(ids, _vision_states(vision_model, image_processor, images, DTYPES[dtype]))
            cached += len(ids)
        bar.update(len(batch))
    shards.flush(final=True)
    bar.close()
    atomic_write_json(directory / FAILED_NAME, failed)
    return CacheReport(directory=directory, cached=cached, already_cached=len(done), failed=failed)


def _open_cache(directory: Path, fingerprint: dict[str, Any]) -> tuple[set[str], dict[str, str]]:
    """Start a cache in `directory` or resume the one there; returns the ids already cached and the failures so far.

    Raises:
        FeatureCacheMismatch: the cache there was made with another fingerprint.
    """
    if (directory / FINGERPRINT_NAME).is_file():
        existing = FeatureCache(directory, expected_fingerprint=fingerprint)  # refuses a mismatched cache
        done, failed = set(existing.image_ids()), dict(existing.failed)
    else:
        atomic_write_json(directory / FINGERPRINT_NAME, fingerprint)
        done, failed = set(), {}
    for leftover in directory.glob("*.partial"):
        leftover.unlink()  # an interrupted shard: its images are cached again
    return done, failed


def _images_to_cache(rows: Iterable[dict[str, Any]], done: set[str]) -> list[tuple[str, str]]:
    """`(image_id, image_path)` of every image not in `done`, once each (the first row of an id), in row order."""
    todo, seen = [], set(done)
    for row in rows:
        if row["image_id"] not in seen:
            seen.add(row["image_id"])
            todo.append((row["image_id"], row["image_path"]))
    return todo


def _read_images(batch: list[tuple[str, str]], on_error: str, failed: dict[str, str]) -> tuple[list[str], list]:
    """The ids and images of `batch` that could be read; the others are added to `failed` (or raise, per
    `on_error`)."""
    from .models.ituning.images import ImageError, open_image

    ids, images = [], []
    for image_id, path in batch:
        try:
            images.append(open_image(path))
            ids.append(image_id)
        except ImageError as error:
            if on_error == "error":
                raise
            failed[image_id] = error.reason
    return ids, images


def _vision_states(vision_model: torch.nn.Module, image_processor: Any, images: list, dtype: torch.dtype):
    """The vision tower's last hidden states of `images`, on the CPU in the storage `dtype`."""
    parameter = next(vision_model.parameters())
    pixels = image_processor(images, return_tensors="pt")["pixel_values"].to(parameter.device)
    with torch.no_grad():
        output = vision_model(pixel_values=pixels.to(parameter.dtype))
    return output.last_hidden_state.to("cpu", dtype)


class _ShardWriter:
    """Collects states and writes them as shards of `shard_size` images, each atomically (written to a temporary
    name, then renamed), with `failed.json` brought up to date after each shard."""

    def __init__(self, directory: Path, shard_size: int, failed: dict[str, str]) -> None:
        self.directory, self.shard_size, self.failed = directory, shard_size, failed
        self.next_shard = len(list(directory.glob("shard-*.safetensors")))  # resuming: after the existing shards
        self.ids: list[str] = []
        self.states: list[torch.Tensor] = []

    def add(self, ids: list[str], states: torch.Tensor) -> None:
        """Queue the states of `ids` (one row each) and write every full shard."""
        self.states.append(states)
        self.ids.extend(ids)
        self.flush()

    def flush(self, final: bool = False) -> None:
        """Write full shards of `shard_size` images (and, when `final`, the rest)."""
        while self.ids and (len(self.ids) >= self.shard_size or final):
            stacked = torch.cat(self.states)
            count = min(self.shard_size, len(self.ids))
            path = self.directory / SHARD_PATTERN.format(self.next_shard)
            partial = path.with_suffix(".partial")
            metadata = {"image_ids": json.dumps(self.ids[:count])}
            save_file({"states": stacked[:count].contiguous()}, str(partial), metadata=metadata)
            os.replace(partial, path)
            atomic_write_json(self.directory / FAILED_NAME, self.failed)
            self.next_shard, self.ids, self.states = self.next_shard + 1, self.ids[count:], [stacked[count:]]
        if not self.ids:
            self.states = []


__all__ = ["CacheReport", "FeatureCache", "FeatureCacheMismatch", "cache_features", "vision_fingerprint"]
