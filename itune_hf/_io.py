"""Atomic writes of the project's state files: a kill mid-write leaves the old file or the new one, never half.

Every JSON or text state file (`training_config.json`, `fingerprint.json`, `failed.json`, `progress.json`,
`manifest.json`, `dataset.json`, ...) goes through `atomic_write_text` / `atomic_write_json`: the content is written to
a temporary file in the same directory, flushed and fsynced, then renamed over the target with `os.replace` (atomic on
POSIX and Windows within one filesystem), and the directory is fsynced so the rename itself survives a power cut.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform or filesystem can open a directory
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (temporary file in the same directory, fsync, `os.replace`).

    Args:
        path: The file to (re)write; its directory must exist.
        data: The new content.
    """
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically.

    Args:
        path: The file to (re)write.
        text: The new content.
    """
    atomic_write_bytes(path, text.encode("utf-8"))


def without_nan(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, so that it serialises as standard JSON (`null`, which
    every JSON reader takes) instead of Python's `NaN` / `Infinity` (which jq, JavaScript and most others refuse).

    Args:
        value: A JSON-serialisable value (dicts, lists and tuples are walked).
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_nan(item) for item in value]
    return value


def atomic_write_json(path: str | os.PathLike, value: Any, *, indent: int | None = 2) -> None:
    """Write `value` as JSON to `path` atomically.

    Args:
        path: The file to (re)write.
        value: A JSON-serialisable value.
        indent: JSON indentation.
    """
    atomic_write_text(path, json.dumps(value, indent=indent) + "\n")


def sha256_of_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The SHA-256 of a file's bytes, read in chunks.

    Args:
        path: The file.
        chunk: Bytes read at a time.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


__all__ = ["atomic_write_bytes", "atomic_write_json", "atomic_write_text", "sha256_of_file"]
