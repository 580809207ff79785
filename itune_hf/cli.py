"""The `itune` command line: `itune <command> [options]`; `itune <command> --help` for each command.

Also runnable as `python -m itune_hf.cli` (and so as `accelerate launch -m itune_hf.cli train ...`).
Command modules import heavy libraries (torch, transformers) only inside `run`, and `import itune_hf` imports none,
so `itune --help` is fast and `itune score` never imports torch, transformers or PEFT.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import warnings
from collections.abc import Sequence

from .errors import error_message
from .utils.versions import __version__

# command name -> module in itune_hf.commands defining `add_arguments(parser)`, `run(args) -> int` and `HELP`.
COMMANDS: dict[str, str] = {
    "params": "params",
    "caption": "caption",
    "make-synthetic": "make_synthetic",
    "make-photos": "make_photos",
    "make-clipart": "make_clipart",
    "make-shards": "make_shards",
    "cache-features": "cache_features",
    "make-datastore": "make_datastore",
    "pretrain-vision": "pretrain_vision",
    "train": "train",
    "average-checkpoints": "average_checkpoints",
    "score": "score",
    "eval": "eval",
    "demo": "demo",
    "explain": "explain",
    "serve": "serve",
    "export": "export",
}
# commands that never load a model: no transformers logging set-up (`itune score` stays free of transformers)
NO_MODEL_COMMANDS = frozenset({"params", "score"})


# commands that compute with torch on the CPU: started once more with the allocator settings of itune_hf.utils.runtime
TORCH_COMMANDS = frozenset(
    {"train", "demo", "caption", "eval", "cache-features", "make-datastore", "pretrain-vision", "explain"}
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `itune` with every registered command."""
    parser = argparse.ArgumentParser(
        prog="itune",
        description="Lightweight image captioning, HuggingFace-native: I-Tuning, XGPT and the ClipCap / "
        "cross-attention baselines.",
    )
    parser.add_argument("--version", action="version", version=f"itune {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"itune_hf.commands.{module_name}")
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


def _not_the_optional_kernel_hint(record: logging.LogRecord) -> bool:
    return "kernels-community" not in record.getMessage()


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """The package's own warnings (an unusable image, a bad shard, a short split) as the line a user reads,
    `warning: <message>`, not Python's `<install path>:<line>: <Category>: <message>`; others as Python shows them."""
    if category.__module__.startswith("itune_hf"):
        return f"warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


_python_format_warning = warnings.formatwarning


def _close_progress_bars() -> None:
    """Close the progress bars a failed command left open, so that its error starts a line of its own."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", None) or ()):
        bar.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `itune` console script; returns the exit status.

    Expected failures (bad input, an unreadable or damaged file, an unwritable path: see `itune_hf.errors`) print
    one line naming the problem and the input and exit 2; set `ITUNE_DEBUG=1` to see the traceback instead. Any
    other exception is a bug and shows its traceback.
    """
    from .utils.runtime import restart_with_runtime_environment, set_openmp_environment

    set_openmp_environment()  # read by OpenMP when torch loads: before any command imports torch
    if argv is None and sys.argv[1:2] and sys.argv[1] in TORCH_COMMANDS:
        restart_with_runtime_environment()  # glibc reads its allocator settings at process start only
    args = build_parser().parse_args(argv)
    warnings.formatwarning = _format_warning
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what was typed: e.g. for the line that resumes a run
    if args.command not in NO_MODEL_COMMANDS:
        # stderr carries the command's own progress and errors, not a bar per weight file loaded
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        # PEFT 0.21 reads a property transformers 5 deprecated; the warning is not actionable for our users
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
        # bitsandbytes, which PEFT imports whenever it is installed, warns on CPUs with AVX512-BF16 that its optional
        # Hub kernel for 4-bit products is not installed; it uses its own kernel then, and nothing is wrong
        logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_not_the_optional_kernel_hint)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C (`train` handles its own: a checkpoint at the interrupt, then 130)
        if os.environ.get("ITUNE_DEBUG", "") not in ("", "0"):
            raise
        print(f"itune {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # the reader of the output went away (`itune caption ... | head -1`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more is written, even at exit
        return 128 + signal.SIGPIPE
    except Exception as error:
        message = error_message(error)  # None: a bug, whose traceback is shown
        if message is None or os.environ.get("ITUNE_DEBUG", "") not in ("", "0"):
            raise
        _close_progress_bars()
        print(f"itune {args.command}: error: {message}", file=sys.stderr)
        return 2


def _stdout_closed() -> bool:
    """Whether standard output is a pipe (or socket) whose reader has gone."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (AttributeError, OSError, ValueError):  # no real file behind it (a test's capture)
        return False
    return any(events & select.POLLERR for _, events in poller.poll(0))


if __name__ == "__main__":
    sys.exit(main())
