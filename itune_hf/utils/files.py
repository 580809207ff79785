"""Reading the user's files so that a damaged one names itself, and atomic writes of the project's state files.

`reading(path, what)` turns a failure to read a file into one `InputError` naming it and what to do; `read_json` reads
JSON so. Writes: a kill mid-write leaves the old file or the new one, never half.

Every JSON or text state file (`training_config.json`, `fingerprint.json`, `failed.json`, `progress.json`,
`manifest.json`, `dataset.json`, ...) goes through `atomic_write_text` / `atomic_write_json`: the content is written to
a temporary file in the same directory, flushed and fsynced, then renamed over the target with `os.replace` (atomic on
POSIX and Windows within one filesystem), and the directory is fsynced so the rename itself survives a power cut.
Files written by a library that takes a path (weights, tar shards, a saved model folder) go through `atomic_path`,
the same temporary-name-then-rename under a context manager, and a saved model folder (weights, config, processor,
card) through `staged_directory`: written into a temporary folder, each file then moved over its namesake.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError, describe_error, is_damaged_file_error


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform or filesystem can open a directory
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def current_umask() -> int:
    """The process's file-creation mask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_default_permissions(path: str | os.PathLike) -> None:
    """Give `path` (a file, or a directory and everything in it) the permissions `open()` and `mkdir()` would have:
    0666 / 0777 less the umask. The temporary files and folders of the atomic writers (`mkstemp`, `mkdtemp`: 0600,
    0700) and safetensors' files (0600) otherwise keep a model or a dataset from every other user and container uid.

    Args:
        path: A file or directory this process wrote.
    """
    mask = current_umask()
    path = Path(path)
    for item in [path, *path.rglob("*")] if path.is_dir() and not path.is_symlink() else [path]:
        if item.is_symlink():
            continue
        os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~mask)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (temporary file in the same directory, fsync, `os.replace`).

    Args:
        path: The file to (re)write; its directory must exist.
        data: The new content.
    """
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(descriptor, 0o666 & ~current_umask())  # mkstemp's 0600 would keep it from other users
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


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary name beside `path` for a writer that takes a path (safetensors' `save_file`, `tarfile`,
    `save_pretrained`): what it writes there is fsynced and moved over `path` when the block ends, and removed if the
    block raises (a kill, an error), so `path` holds the old content or the new, never half.

    Args:
        path: The file to (re)write, or a directory that does not exist yet; its parent must exist.

    Yields:
        The temporary path (`.<name>.<random>.tmp` in the same directory; nothing exists there yet).
    """
    path = Path(path)
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    os.unlink(name)
    temporary = Path(name)
    try:
        yield temporary
        for written in [temporary, *temporary.rglob("*")] if temporary.is_dir() else [temporary]:
            if written.is_file():
                with open(written, "rb") as handle:
                    os.fsync(handle.fileno())
        give_default_permissions(temporary)  # safetensors writes 0600
        os.replace(temporary, path)
    except BaseException:
        if temporary.is_dir():
            shutil.rmtree(temporary, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                temporary.unlink()
        raise
    _fsync_directory(path.parent)


@contextlib.contextmanager
def staged_directory(directory: str | os.PathLike, superseded: Sequence[str] = ()) -> Iterator[Path]:
    """A temporary folder inside `directory` for a writer that fills a folder (`save_pretrained`): when the block
    ends, each file it wrote is fsynced and moved over its namesake in `directory` (`os.replace`: every file whole,
    old or new), and the folder removed; if the block raises, nothing in `directory` changed. A folder left by a
    kill (`.staging-*`) is removed by the next one.

    Args:
        directory: The directory to (re)write (created).
        superseded: Glob patterns of what an earlier writer's files in `directory` that this one replaces look like
            (`"model-*-of-*.safetensors"`, `"backbones"`): those it did not rewrite are removed after the new files
            are in (else a loader would read old weights beside new ones, as transformers removes old shards).

    Yields:
        The temporary folder.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(".staging-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(dir=directory, prefix=".staging-"))
    try:
        yield staging
        written = sorted(p.relative_to(staging) for p in staging.rglob("*") if p.is_file())
        for relative in written:
            target = directory / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(staging / relative, "rb") as handle:
                os.fsync(handle.fileno())
            give_default_permissions(staging / relative)  # safetensors writes 0600
            os.replace(staging / relative, target)
        _remove_superseded(directory, superseded, set(written))
        _fsync_directory(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_superseded(directory: Path, patterns: Sequence[str], written: set[Path]) -> None:
    """Remove the files under `directory` that match `patterns` (files, or folders and everything in them) and are
    not in `written` (paths relative to `directory`), then the folders that this leaves empty."""
    for match in sorted({m for pattern in patterns for m in directory.glob(pattern)}):
        files = [p for p in match.rglob("*") if p.is_file()] if match.is_dir() else [match]
        for path in files:
            if path.relative_to(directory) not in written:
                path.unlink()
        if match.is_dir():
            for folder in sorted((p for p in [match, *match.rglob("*")] if p.is_dir()), reverse=True):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty


@contextlib.contextmanager
def exclusive_lock(lock_file: Path) -> Iterator[bool]:
    """Hold an exclusive lock on `lock_file` (waiting for it); yields whether it is held (not without `fcntl`, on
    Windows: there a concurrent build is wasted work, the rename keeping one).

    Args:
        lock_file: The lock's file (created, with its folder).
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield False
        return
    try:
        handle = open(lock_file, "a")  # noqa: SIM115 (closed below)
        give_default_permissions(lock_file)  # a cache shared by several users: each may need to lock it
    except PermissionError:  # another user's lock file: flock works on a read-only descriptor too
        handle = open(lock_file)  # noqa: SIM115
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield True


def cache_dir() -> Path:
    """Where the project keeps what it derives from installed packages (converted backbones, METEOR's index):
    `$ITUNE_CACHE`, else `~/.cache/itune_hf`."""
    return Path(os.environ.get("ITUNE_CACHE", Path.home() / ".cache" / "itune_hf"))


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


# what reading a damaged, truncated, refused or unreadable file raises
READ_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, RecursionError, pickle.UnpicklingError, EOFError)


@contextlib.contextmanager
def reading(path: str | os.PathLike, what: str, hint: str = "") -> Iterator[None]:
    """Turn a failure to read `path` into an `InputError` naming the file, what it is and what to do.

    `InputError`s raised inside pass through unchanged; errors of a damaged file (safetensors, JSON, YAML, pickle,
    torch's zip reader, input nested too deeply) become `"<path>: cannot read <what> (<reason>); <hint>"`.

    Args:
        path: The file (or directory) being read.
        what: What it is, e.g. `"the adapter weights"`.
        hint: What the user can do, e.g. `"train again or restore the file"`.
    """
    try:
        yield
    except InputError:
        raise
    except Exception as error:
        if not (isinstance(error, READ_ERRORS) or is_damaged_file_error(error) or _is_torch_read_error(error)):
            raise
        message = f"{path}: cannot read {what} ({describe_error(error)})"
        raise InputError(message + (f"; {hint}" if hint else "")) from error


def _is_torch_read_error(error: BaseException) -> bool:
    """torch's loader on a damaged file: `RuntimeError: PytorchStreamReader failed reading zip archive ...`."""
    return isinstance(error, RuntimeError) and any(
        text in str(error) for text in ("PytorchStreamReader", "zip archive", "Weights only load failed")
    )


def read_json(path: str | os.PathLike, what: str = "JSON") -> Any:
    """The parsed JSON of file `path`; an unreadable, invalid or too deeply nested file raises an `InputError`
    naming it.

    Args:
        path: The file.
        what: What it holds, for the message (e.g. `"COCO results"`).
    """
    with reading(path, what, "check the file (valid UTF-8 JSON)"):
        return json.loads(Path(path).read_text(encoding="utf-8"))


__all__ = [
    "READ_ERRORS", "atomic_path", "atomic_write_bytes", "atomic_write_json", "atomic_write_text", "cache_dir",
    "exclusive_lock",
    "read_json", "reading", "sha256_of_file", "staged_directory",
]  # fmt: skip
