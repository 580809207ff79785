"""Writing a generated dataset directory without ever losing a user's files.

The dataset is built in a temporary sibling directory and moved into place when complete. An existing non-empty
output directory is only written into when it is a previous output of the same command (its `dataset.json` says so;
then the files that output listed are replaced and the other files are left alone) or when `overwrite` is given
(files of the same names are replaced, nothing else is deleted). Replacing a previous output removes its
`dataset.json` before the first new file moves in (recording its files in `.dataset.json.replacing`, which a rerun
after a kill reads), so no index ever lists a mix of old and new images; nothing is written through a symbolic link.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..utils.files import atomic_write_json, give_default_permissions
from ._common import DataError

DATASET_FILE = "dataset.json"
REPLACING_FILE = ".dataset.json.replacing"  # a previous output being replaced: the files it listed


def _listed_files(dataset_json: Path, kind: str) -> list[str] | None:
    """The files a previous output of `kind` wrote (relative paths), or None if it is not one."""
    try:
        data = json.loads(dataset_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("dataset") != kind or not isinstance(data.get("images"), list):
        return None
    files = [DATASET_FILE]
    for entry in data["images"]:
        if isinstance(entry, dict) and isinstance(entry.get("filename"), str):
            files.append(os.path.join(entry.get("filepath") or "", entry["filename"]))
    return files


def write_dataset_dir(
    output_dir: str | os.PathLike, *, kind: str, command: str, overwrite: bool, build: Callable[[Path], None]
) -> Path:
    """Build a dataset with `build(tmp_dir)` and move it to `output_dir`; returns `output_dir/dataset.json`.

    Args:
        output_dir: Where the dataset goes (created if missing).
        kind: The `dataset` field the builder writes into `dataset.json` (marks previous outputs).
        command: The command name, for messages (e.g. `itune make-synthetic`).
        overwrite: Write into a non-empty directory that is not a previous output of `command`.
        build: Writes `dataset.json` and the image files into the directory it is given.

    Raises:
        DataError: `output_dir` is a file, or a non-empty directory that is not a previous output, without
            `overwrite`.
    """
    output_dir = Path(output_dir).expanduser()
    if output_dir.exists() and not output_dir.is_dir():
        raise DataError(f"{output_dir}: exists and is not a directory")
    existing = output_dir.is_dir() and any(output_dir.iterdir())
    previous = _previous_files(output_dir, kind) if existing else None
    if existing and previous is None and not overwrite:
        raise DataError(
            f"{output_dir}: directory is not empty and is not a previous {command} output; choose a new directory "
            "or pass --overwrite (files of the same names are replaced, other files are kept)"
        )
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.tmp-", dir=output_dir.parent))
    try:
        build(tmp)
        give_default_permissions(tmp)  # mkdtemp's 0700 would keep the dataset from other users
        if not existing:
            if output_dir.is_dir():
                output_dir.rmdir()
            os.replace(tmp, output_dir)
            return output_dir / DATASET_FILE
        new_files = sorted(
            str(path.relative_to(tmp)) for path in tmp.rglob("*") if path.is_file() and path.name != DATASET_FILE
        )
        _refuse_links(output_dir, new_files, command)
        _swap_in(tmp, output_dir, new_files, set(previous or []))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return output_dir / DATASET_FILE


def _previous_files(output_dir: Path, kind: str) -> list[str] | None:
    """The files of a previous output of `kind` in `output_dir`: those its `dataset.json` lists and those an
    interrupted replacement recorded (`.dataset.json.replacing`); None if it holds neither."""
    listed = _listed_files(output_dir / DATASET_FILE, kind)
    try:
        pending = json.loads((output_dir / REPLACING_FILE).read_text(encoding="utf-8"))
        pending = pending["files"] if pending.get("replacing") == kind else None
    except (OSError, ValueError, AttributeError, KeyError):
        pending = None
    if listed is None and not isinstance(pending, list):
        return None
    return sorted({*(listed or []), *(pending if isinstance(pending, list) else []), DATASET_FILE})


def _refuse_links(output_dir: Path, files: list[str], command: str) -> None:
    """Refuse to write `files` into `output_dir` through a symbolic link (a file or a folder of their path)."""
    for relative in files:
        path = output_dir
        for part in Path(relative).parts:
            path = path / part
            if path.is_symlink():
                raise DataError(
                    f"{path} is a symbolic link (to {os.readlink(path)}); {command} never writes through a link "
                    "out of its output directory: remove the link or choose another --output-dir"
                )


def _swap_in(tmp: Path, output_dir: Path, new_files: list[str], previous: set[str]) -> None:
    """Replace a previous output with the one built in `tmp`, so that no `dataset.json` ever lists a mix.

    The old `dataset.json` is first replaced by `.dataset.json.replacing` (the old files, for a rerun to clean up
    after a kill), then the new files move in, then the new `dataset.json`, then the old files no longer listed go.
    """
    atomic_write_json(output_dir / REPLACING_FILE, {"replacing": _kind_of(tmp), "files": sorted(previous)})
    with contextlib.suppress(FileNotFoundError):
        (output_dir / DATASET_FILE).unlink()  # from here on, no index: an interruption leaves no mixed dataset
    for relative in new_files:
        target = output_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / relative, target)
    os.replace(tmp / DATASET_FILE, output_dir / DATASET_FILE)  # the index names only files now in place
    for relative in sorted(previous - set(new_files) - {DATASET_FILE}):
        stale = output_dir / relative
        if not stale.resolve().is_relative_to(output_dir.resolve()) or stale.is_symlink():
            continue  # never delete outside the output directory, whatever an old dataset.json lists
        if stale.is_file():
            stale.unlink()
            parent = stale.parent
            while parent != output_dir and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
    (output_dir / REPLACING_FILE).unlink()


def _kind_of(directory: Path) -> str:
    return json.loads((directory / DATASET_FILE).read_text(encoding="utf-8"))["dataset"]
