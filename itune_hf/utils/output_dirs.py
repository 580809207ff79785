"""Output directories a command owns: one lock per directory, and no command writes over what it did not make
(torch-free).

Every command that writes a directory (`train`, `average-checkpoints`, `make-shards`, `cache-features`,
`pretrain-vision`, `eval`) takes its `OutputLock` (`.itune-train.lock`: pid, host, command, start), so that two
commands never write one directory at once, and claims it with `claim_output_dir`: an empty or new directory, or a
previous output of the same command (its `.itune-output.json` names the command, written when it claimed the
directory, so that an output left unfinished by a kill is still its own), is written; a directory holding anything
else is refused, naming what it holds, unless `overwrite` is given, which removes those entries and says which.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..errors import InputError, describe_error
from .files import atomic_write_json

LOCK_NAME = ".itune-train.lock"  # one name for every command: `train` and the others exclude each other
OWNER_NAME = ".itune-output.json"  # which command claimed a directory: its later runs (after a kill too) may write it


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists, owned by another user
    return True


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, `/proc/PID/stat`), or None where that cannot be read (no
    such process, or no /proc). A lock records its holder's, so that another process given the same pid later (a
    reboot, a busy host) is not mistaken for the holder."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name before it may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def _holds_lock(pid: int, owner: dict[str, Any]) -> bool:
    """Whether live process `pid` is the one that wrote `owner` (its start time, where the lock recorded one; else
    a Python process, which every itune command is)."""
    started = owner.get("process_start")
    now = process_start(pid)
    if started is not None and now is not None:
        return int(started) == now
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return True  # cannot tell: assume it is
    return any(name in command for name in ("python", "itune", "accelerate", "torchrun"))


class OutputLock:
    """An output directory owned by one process: `.itune-train.lock` (pid, host, command, start), created exclusively.

    A lock left by a process of this host that no longer runs (killed) is taken over, saying so; a live one (or one
    from another host, which cannot be checked) is refused, naming its owner.

    Args:
        directory: The output directory.
        what: What holds it, for messages (`"a training run"`, `"itune make-shards"`).
    """

    def __init__(self, directory: str | os.PathLike, what: str = "a training run") -> None:
        self.path = Path(directory) / LOCK_NAME
        self.what = what
        self.held = False

    def acquire(self) -> OutputLock:
        """Take the lock (creating the directory).

        Raises:
            FileExistsError: another live process holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mine = {
            "pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "what": self.what, "process_start": process_start(os.getpid()),
        }  # fmt: skip
        for _ in range(2):
            try:
                descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale(mine)
                continue
            with os.fdopen(descriptor, "w") as handle:
                json.dump(mine, handle)
            self.held = True
            atexit.register(self.release)
            return self
        raise FileExistsError(f"{self.path}: could not be taken; remove it if no run uses {self.path.parent}")

    def _take_over_if_stale(self, mine: dict[str, Any]) -> None:
        try:
            owner = json.loads(self.path.read_text())
            pid, host = int(owner["pid"]), str(owner["host"])
        except (OSError, ValueError, KeyError, TypeError):
            owner, pid, host = {}, None, mine["host"]  # unreadable: a kill while it was written
        holder = owner.get("what", "a training run") if isinstance(owner, dict) else "a training run"
        if pid is not None and host != mine["host"]:
            raise FileExistsError(
                f"{self.path.parent} is in use by {holder} on host {host} (pid {pid}, since "
                f"{owner.get('started')}); wait for it, or choose another --output-dir (delete {self.path} if "
                "that run is gone)"
            )
        if pid is not None and pid != mine["pid"] and _pid_alive(pid) and _holds_lock(pid, owner):
            raise FileExistsError(
                f"{self.path.parent} is in use by {holder} (pid {pid}, since {owner.get('started')}); two "
                "commands writing one output directory would replace each other's files: wait for it or choose "
                f"another --output-dir (if no such run is going on, delete the lock file {self.path})"
            )
        if pid != mine["pid"]:
            gone = "is gone" if pid is None or not _pid_alive(pid) else "is gone (its pid now names another process)"
            print(f"note: taking over the lock of {self.path.parent} from a run that {gone} (pid {pid})",
                  file=sys.stderr)  # fmt: skip
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def release(self) -> None:
        """Give the directory back (idempotent; a directory gone or read-only meanwhile is not an error)."""
        if self.held:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.held = False

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def foreign_entries(directory: Path, ours: Iterable[str] = ()) -> list[str]:
    """The entries of `directory` other than the lock and the names in `ours` (sorted; none for a missing one).

    Args:
        directory: The output directory.
        ours: Names the command writes there.
    """
    if not directory.is_dir():
        return []
    keep = {LOCK_NAME, OWNER_NAME, *ours}
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


def claimed_by(directory: Path) -> str | None:
    """The command that claimed `directory` (its `.itune-output.json`), or None."""
    try:
        owner = json.loads((directory / OWNER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return owner.get("command") if isinstance(owner, dict) else None


class OutputOverInputError(InputError, FileExistsError):
    """An output directory that is one of the command's inputs, or holds one: writing it could lose the input."""


def refuse_output_over_inputs(
    directory: str | os.PathLike, inputs: Iterable[str | os.PathLike | None], flag: str = "--output-dir"
) -> None:
    """Refuse, before anything is written or removed, an output directory that is one of the command's inputs or
    contains one (paths resolved, symlinks followed): `--overwrite` would delete it, and a write could replace it. A
    new directory inside an input's folder is fine. Inputs that are not on disk (Hub ids, preset names) are skipped.

    Args:
        directory: The output directory.
        inputs: The command's input files and directories (None or "" where an option was not given).
        flag: The option that named the output directory.

    Raises:
        OutputOverInputError: naming the input and what to do.
    """
    output = Path(directory).expanduser().resolve()
    for given in inputs:
        if given is None or str(given) == "" or not Path(given).expanduser().exists():
            continue
        path = Path(given).expanduser().resolve()
        if path == output or output in path.parents:
            relation = "is" if path == output else "contains"
            raise OutputOverInputError(
                f"{flag} {directory} {relation} the command's input {given}: writing there could replace or (with "
                "--overwrite) delete it. Choose another output directory (a new folder inside the input's folder is "
                "fine)."
            )


def claim_output_dir(
    directory: str | os.PathLike,
    *,
    command: str,
    overwrite: bool,
    is_previous_output: Callable[[Path], bool] = lambda directory: False,
    flag: str = "--output-dir",
    inputs: Iterable[str | os.PathLike | None] = (),
) -> OutputLock:
    """Lock `directory` for `command` and check that it may write there, before any work.

    A new or empty directory, one this command claimed before (`.itune-output.json`), or one `is_previous_output`
    recognises (outputs of an older itune_hf, without that marker), is the command's. Any other non-empty one is
    refused unless `overwrite`, which removes its entries (named on stderr) once the lock is held. The marker is then
    written.

    Args:
        directory: The output directory.
        command: The command, for messages (`"itune average-checkpoints"`).
        overwrite: Remove what another program (or another command) put there.
        is_previous_output: Whether a non-empty directory is an earlier output of this command.
        flag: The option that named the directory.
        inputs: The command's inputs (`refuse_output_over_inputs`): the directory may be none of them, nor hold one.

    Returns:
        The held lock (released at exit, or by `release()`).

    Raises:
        FileExistsError: the directory holds what the command did not write (without `overwrite`), or another
            command holds its lock, or it is or holds an input (`OutputOverInputError`).
    """
    directory = Path(directory)
    refuse_output_over_inputs(directory, inputs, flag)
    lock = OutputLock(directory, what=command).acquire()
    try:
        foreign = foreign_entries(directory)
        if foreign and claimed_by(directory) != command and not is_previous_output(directory):
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            if not overwrite:
                raise FileExistsError(
                    f"{flag} {directory} holds files {command} did not write ({shown}); it would replace or mix "
                    "with them. Choose a new or empty directory, or pass --overwrite to remove them."
                )
            print(f"--overwrite: removing {len(foreign)} entries of {directory} ({shown})", file=sys.stderr)
            for name in foreign:
                path = directory / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        if claimed_by(directory) != command:
            atomic_write_json(directory / OWNER_NAME, {"command": command})
    except BaseException:
        lock.release()
        raise
    return lock


def check_output_dir(path: str | os.PathLike, flag: str = "--output-dir") -> Path:
    """Check, before any work, that a directory can be created or written at `path` (creating nothing).

    Args:
        path: The output directory.
        flag: The option that named it, for the message.

    Raises:
        InputError: naming `flag` and `path`, when it is a file, lies under a file, or is not writable.
    """
    directory = Path(path)
    existing = directory
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # a dangling symlink: mkdir would fail on it
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "is a file" if existing == directory else f"lies under {existing}, a file"
        raise InputError(f"{flag} {directory}: {where}, not a directory; choose another path")
    try:  # the real test: root passes os.access everywhere, a read-only file system does not
        with open(existing / f".itune-write-test-{os.getpid()}", "wb") as probe:
            probe_path = probe.name
        os.unlink(probe_path)
    except OSError as error:
        raise InputError(
            f"{flag} {directory}: cannot write in {existing} ({describe_error(error)}); choose a writable directory"
        ) from error
    return directory


def check_output_file(path: str | os.PathLike, flag: str) -> Path:
    """Check, before any work, that a file can be written at `path` (not a directory; its directory writable).

    Args:
        path: The file to write.
        flag: The option that named it, for the message.

    Raises:
        InputError: naming `flag` and `path`.
    """
    file = Path(path)
    if file.is_dir():
        raise InputError(f"{flag} {file}: is a directory; pass a file path, e.g. {file / 'scores.json'}")
    try:
        check_output_dir(file.parent, flag=flag)
    except InputError as error:
        raise InputError(f"{flag} {file}: cannot be written: {error}") from error.__cause__
    return file


__all__ = [
    "LOCK_NAME", "OWNER_NAME", "OutputLock", "check_output_dir", "check_output_file", "claim_output_dir", "claimed_by",
    "foreign_entries", "OutputOverInputError", "refuse_output_over_inputs",
]  # fmt: skip
