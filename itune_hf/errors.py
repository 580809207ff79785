"""Errors about the user's input and the one line the `itune` CLI prints for each expected failure (torch-free).

The CLI's discipline (`itune_hf.cli.main`): an expected failure (an `InputError`, a validation `ValueError`, an
`OSError` of any kind, a damaged safetensors/JSON/YAML/pickle file, input nested too deeply to read) is printed as one
line, `itune <command>: error: <message>`, with exit status 2; `ITUNE_DEBUG=1` shows its traceback instead. Any other
exception is a bug and keeps its traceback. Code that opens a user's file wraps the reading in `reading(path, what)`,
so that a damaged file names itself and says what to do.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class InputError(Exception):
    """A problem with the user's input (a file, a flag, a recipe key), naming it and what to do: printed by `itune`
    as one line (`itune <command>: error: ...`), exit status 2."""


class UnknownNameError(InputError, KeyError):
    """A name or id the user gave that is not there (a preset, a backbone, a model family, an image id): a `KeyError`
    to code that looks names up, one line to the CLI. Any other `KeyError` is a bug and keeps its traceback."""

    def __str__(self) -> str:  # a KeyError's text is the repr of its key: show the message
        return str(self.args[0]) if self.args else ""


# what the user can do about an OSError of each kind (errno), after "PATH: <strerror>"
_OS_HINTS = {
    errno.EACCES: "check its permissions or choose another path",
    errno.EPERM: "check its permissions or choose another path",
    errno.EROFS: "the file system is read-only: choose another path",
    errno.ENOSPC: "the disk is full: free space or choose another path",
    errno.EISDIR: "it is a directory: pass a file path",
    errno.ENOTDIR: "a part of the path is a file, not a directory: choose another path",
    errno.ENOENT: "check the path",
    errno.EEXIST: "it exists already: remove it or choose another path",
    errno.ENAMETOOLONG: "choose a shorter path",
}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _os_message(error: OSError) -> str:
    """`PATH: what went wrong; what to do` for an OSError that names a file, else its own text on one line."""
    if error.filename is None or error.strerror is None:
        return _one_line(str(error))
    hint = _OS_HINTS.get(error.errno or 0)
    target = f"{error.filename} -> {error.filename2}" if error.filename2 else str(error.filename)
    return f"{target}: {error.strerror.lower()}" + (f"; {hint}" if hint else "")


def _is_damaged_file_error(error: BaseException) -> bool:
    """A safetensors, YAML or pickle error: what reading a damaged or refused file raises."""
    name = type(error).__name__
    module = type(error).__module__
    return (
        name == "SafetensorError"
        or (module.startswith("yaml") and name.endswith("Error"))
        or isinstance(error, pickle.UnpicklingError)
    )


def error_message(error: BaseException) -> str | None:
    """The one line `itune` prints for an expected failure, or None for a bug (whose traceback is shown).

    Args:
        error: The exception a command raised.
    """
    if isinstance(error, InputError):
        return _one_line(str(error))
    if isinstance(error, OSError):
        return _os_message(error)
    if isinstance(error, RecursionError):
        return "an input is nested too deeply to read (maximum recursion depth exceeded); check the files given"
    if isinstance(error, ValueError) or _is_damaged_file_error(error):
        return _one_line(str(error)) or type(error).__name__
    return None


def _reason(error: BaseException) -> str:
    if isinstance(error, RecursionError):
        return "nested too deeply: maximum recursion depth exceeded"
    if isinstance(error, pickle.UnpicklingError) or "Weights only load failed" in str(error):
        return "a pickle holding more than tensors, refused: only safetensors or plain-tensor files load"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    text = _one_line(str(error)).split(". ")[0]  # the first sentence: torch's and the Hub's go on for lines
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


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
        if not (isinstance(error, READ_ERRORS) or _is_damaged_file_error(error) or _is_torch_read_error(error)):
            raise
        message = f"{path}: cannot read {what} ({_reason(error)})"
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
            f"{flag} {directory}: cannot write in {existing} ({_reason(error)}); choose a writable directory"
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


def non_finite_names(values: Any) -> list[str]:
    """The names of the tensors or arrays in `values` holding a NaN or an infinity (in order; integer ones never do).

    Args:
        values: A mapping of names to torch tensors or numpy arrays (a state dict, an `.npz`'s arrays).
    """
    import numpy as np

    found = []
    for name, value in values.items():
        if hasattr(value, "is_floating_point"):  # a torch tensor (any dtype, any device)
            bad = value.is_floating_point() and not bool(value.isfinite().all())
        else:
            array = np.asarray(value)
            bad = array.dtype.kind in "fc" and not bool(np.isfinite(array).all())
        if bad:
            found.append(str(name))
    return found


def check_finite(values: Any, where: str, hint: str) -> None:
    """Refuse NaN or infinite values where they enter (weights loaded, features read, a checkpoint averaged).

    Args:
        values: A mapping of names to tensors or arrays.
        where: What holds them, e.g. `"--init-model M/model.safetensors"`.
        hint: What to do.

    Raises:
        InputError: `"<where>: N of M tensors hold NaN or infinite values (e.g. a, b); <hint>"`.
    """
    bad = non_finite_names(values)
    if bad:
        raise InputError(
            f"{where}: {len(bad)} of {len(values)} tensors hold NaN or infinite values (e.g. {', '.join(bad[:3])}); "
            + hint
        )


# ------------------------------------------------------------------------------------------------------------------
# Values checked at the boundary: one definition per kind of number, used by the flags of every command
# (`itune_hf.commands._options.number_type`) and by `TrainingConfig` (flags and recipe keys alike)
# ------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Number:
    """A kind of numeric option: integer or real, with its bounds.

    Args:
        kind: `int` or `float`.
        minimum: The smallest accepted value (None: unbounded).
        maximum: The largest accepted value (None: unbounded).
        above: The minimum itself is refused (`> minimum`, e.g. a positive learning rate).
    """

    kind: type
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False

    def describe(self) -> str:
        """What the option takes, e.g. `"an integer >= 1"`."""
        noun = "an integer" if self.kind is int else "a number"
        if self.minimum is not None and self.maximum is not None:
            return f"{noun} from {self.minimum} to {self.maximum}"
        if self.minimum is not None:
            return f"{noun} {'>' if self.above else '>='} {self.minimum}"
        return noun if self.maximum is None else f"{noun} <= {self.maximum}"

    def parse(self, value: Any) -> int | float:
        """`value` (a number, or its text: YAML reads `1e-4` as a string) as this kind, checked against the bounds.

        Args:
            value: The value given.

        Raises:
            ValueError: "expected <what>, got <value>".
        """
        number = _to_number(value, self.kind)
        low, high = self.minimum, self.maximum
        if (
            number is None
            or number != number  # NaN
            or number in (math.inf, -math.inf)  # inf trains to NaN weights (and 1e308 overflows just the same)
            or (low is not None and (number < low or (self.above and number == low)))
            or (high is not None and number > high)
        ):
            raise ValueError(f"expected {self.describe()}, got {value!r}")
        return number


def _to_number(value: Any, kind: type) -> int | float | None:
    if isinstance(value, bool):  # True is an int to Python, not a number to a user
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip()) if kind is float else int(value.strip().replace("_", ""))
        except ValueError:
            try:
                value = float(value)  # "1e3" as an integer option
            except ValueError:
                return None
    if isinstance(value, float) and kind is int:
        return int(value) if value.is_integer() else None
    if isinstance(value, int) and kind is float:
        return float(value)
    return value if isinstance(value, kind) else None


POSITIVE_INT = Number(int, 1)
NON_NEGATIVE_INT = Number(int, 0)
POSITIVE_FLOAT = Number(float, 0, above=True)
NON_NEGATIVE_FLOAT = Number(float, 0)


__all__ = [
    "NON_NEGATIVE_FLOAT",
    "NON_NEGATIVE_INT",
    "POSITIVE_FLOAT",
    "POSITIVE_INT",
    "InputError",
    "UnknownNameError",
    "Number",
    "check_finite",
    "check_output_dir",
    "check_output_file",
    "error_message",
    "non_finite_names",
    "read_json",
    "reading",
]
