"""Errors about the user's input and the one line the `itune` CLI prints for each expected failure (torch-free).

The CLI's discipline (`itune_hf.cli.main`): an expected failure (an `InputError`, a validation `ValueError`, an
`OSError` of any kind, a damaged safetensors/JSON/YAML/pickle file, input nested too deeply to read) is printed as one
line, `itune <command>: error: <message>`, with exit status 2; `ITUNE_DEBUG=1` shows its traceback instead. Any other
exception is a bug and keeps its traceback. Code that opens a user's file wraps the reading in
`itune_hf.utils.files.reading(path, what)`, so that a damaged file names itself and says what to do.
"""

from __future__ import annotations

import errno
import os
import pickle


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


def is_damaged_file_error(error: BaseException) -> bool:
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
    if is_out_of_memory(error):
        return (
            f"out of memory ({describe_error(error)}); lower --batch-size, --num-beams or --max-new-tokens, or close "
            "other programs"
        )
    if isinstance(error, ValueError) or is_damaged_file_error(error):
        return _one_line(str(error)) or type(error).__name__
    return None


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation that failed: Python's `MemoryError`, torch's `OutOfMemoryError` (a GPU), or
    its CPU allocator's `RuntimeError` ("DefaultCPUAllocator: can't allocate memory").

    Args:
        error: The exception.
    """
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


#: What torch's and safetensors' writers say when the disk refuses a write (they name no errno)
_WRITE_FAILURES = ("unexpected pos", "basic_ios::clear", "PytorchStreamWriter failed", "File too large",
                   "No space left", "Disk quota exceeded", "I/O error")  # fmt: skip


def is_write_failure(error: BaseException) -> bool:
    """Whether `error` is a write the file system refused: an `OSError`, or torch's / safetensors' failure to write
    (a full disk, a quota, a file-size limit), which they raise as a `RuntimeError` or their own error naming no file.

    Args:
        error: The exception.
    """
    if isinstance(error, OSError):
        return True
    return isinstance(error, Exception) and any(text in str(error) for text in _WRITE_FAILURES)


def write_failure_message(path, error: BaseException) -> str:
    """One line for a write to `path` that failed: the OS error where known, else the likely causes checked here
    (the free space of `path`'s file system, this process's file-size limit).

    Args:
        path: The file or directory being written.
        error: The exception.
    """
    import errno as errnos
    import resource

    if isinstance(error, OSError) and error.errno in (errnos.ENOSPC, errnos.EDQUOT, errnos.EFBIG):
        cause = f"{errnos.errorcode[error.errno]}: {error.strerror}"
    else:
        causes = []
        try:
            stats = os.statvfs(path if os.path.isdir(path) else os.path.dirname(os.fspath(path)) or ".")
            if stats.f_bavail * stats.f_frsize < 64 << 20:
                causes.append(f"ENOSPC: {stats.f_bavail * stats.f_frsize / 2**20:.1f} MB left on the disk")
        except OSError:
            pass
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            causes.append(f"EFBIG: this process may write files of {limit:,} bytes at most (ulimit -f)")
        cause = "; ".join(causes) or describe_error(error)
    return f"{path}: could not be written ({cause}); free disk space (or raise the limit) and run again"


def describe_error(error: BaseException) -> str:
    """A short reason for an error, for a message that names the file it concerns (`"<path>: cannot read ...
    (<reason>)"`).

    Args:
        error: The exception.
    """
    if isinstance(error, RecursionError):
        return "nested too deeply: maximum recursion depth exceeded"
    if isinstance(error, pickle.UnpicklingError) or "Weights only load failed" in str(error):
        return "a pickle holding more than tensors, refused: only safetensors or plain-tensor files load"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    text = _one_line(str(error)).split(". ")[0]  # the first sentence: torch's and the Hub's go on for lines
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


__all__ = [
    "InputError", "UnknownNameError", "describe_error", "error_message", "is_damaged_file_error", "is_out_of_memory",
    "is_write_failure", "write_failure_message",
]  # fmt: skip
