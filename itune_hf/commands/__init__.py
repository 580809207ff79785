"""Subcommands of the `itune` CLI, one module each (see `itune_hf.cli.COMMANDS`).

A command module defines `HELP`, `add_arguments(parser)` and `run(args) -> int`; it imports heavy libraries only
inside `run`. Commands raise `CommandError` for a problem with the user's input; `itune_hf.cli` prints it as one line.
"""

from ..errors import InputError


class CommandError(InputError):
    """A problem with the user's input: printed as one line (`itune <command>: error: ...`), exit status 2."""


__all__ = ["CommandError"]
