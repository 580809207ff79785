"""Options with one spelling across commands; earlier or other spellings stay accepted as hidden aliases.

A hidden alias sets the same value as its option but is not shown by `--help` (or in the usage line), so the help
and the docs name one spelling only. The option and its aliases are mutually exclusive: passing two spellings of
one option is an error ("argument --output-dir: not allowed with argument --output"), whatever their order.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, Number

# what a hidden alias shares with its option, so that it parses the value the same way
_SHARED = ("action", "type", "choices", "nargs", "const")


def add_option(
    container: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    *,
    aliases: Sequence[str] = (),
    required: bool = False,
    **kwargs: Any,
) -> argparse.Action:
    """`container.add_argument(flag, **kwargs)`, plus each of `aliases` as a hidden spelling of it.

    Args:
        container: The command's parser or one of its argument groups.
        flag: The option, e.g. `--output-dir`.
        aliases: Other accepted spellings, e.g. `("--output",)`; not shown by `--help`.
        required: One of the spellings must be given.
        **kwargs: `add_argument`'s keywords for the option (`help`, `default`, `type`, `metavar`, ...).

    Returns:
        The option's action.
    """
    if not aliases:
        return container.add_argument(flag, required=required, **kwargs)
    group = container.add_mutually_exclusive_group(required=required)
    action = group.add_argument(flag, **kwargs)
    shared = {key: kwargs[key] for key in _SHARED if key in kwargs}
    for alias in aliases:
        # default=SUPPRESS: the option's own default is the one that applies when no spelling is given
        group.add_argument(alias, dest=action.dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **shared)
    return action


def add_output_dir(parser: argparse.ArgumentParser, *, help: str, default: str | None = None) -> argparse.Action:
    """`--output-dir DIR`, the directory a command writes (`--output` is accepted too); required without a default.

    Args:
        parser: The command's parser.
        help: What goes in the directory.
        default: The directory when none is given; None makes the option required.
    """
    return add_option(
        parser,
        "--output-dir",
        aliases=("--output",),
        required=default is None,
        default=default,
        metavar="DIR",
        help=help,
    )


def add_num_beams(parser: argparse.ArgumentParser) -> argparse.Action:
    """`--num-beams`, whose default is the model's own (its generation config: its family's paper setting).

    Args:
        parser: The command's parser.
    """
    return parser.add_argument(
        "--num-beams",
        type=number_type(POSITIVE_INT),
        default=None,
        help="Beam size (1 = greedy). Default: the model's generation config, its paper's test setting (5 beams "
        "for I-Tuning, ClipCap and cross-attention, 2 for XGPT).",
    )


def number_type(number: Number) -> Callable[[str], int | float]:
    """The argparse `type` of a numeric option of kind `number` (`itune_hf.errors.Number`): a bad value is refused
    while parsing, e.g. "argument --shard-size: expected an integer >= 1, got '0'", exit status 2.

    Args:
        number: The kind of number (integer or real, bounds).
    """

    def parse(text: str) -> int | float:
        try:
            return number.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = number.describe()  # argparse names the type in some messages
    return parse


def metrics_argument(value: str) -> tuple[str, ...]:
    """The metrics named by `--metrics` (comma-separated, case-insensitive), checked before any work.

    Args:
        value: The option's value, e.g. `"BLEU,CIDEr"`.

    Raises:
        CommandError: naming `--metrics` and the unknown name.
    """
    from ..metrics import normalize_metrics
    from . import CommandError

    try:
        return normalize_metrics([name for name in value.split(",") if name.strip()])
    except (ValueError, KeyError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        raise CommandError(f"--metrics {value}: {message}") from None


# the numeric option types of every command (one definition each; TrainingConfig's fields carry theirs)
positive_int = number_type(POSITIVE_INT)
non_negative_int = number_type(NON_NEGATIVE_INT)
positive_float = number_type(POSITIVE_FLOAT)


__all__ = [
    "add_option",
    "add_output_dir",
    "metrics_argument",
    "non_negative_int",
    "number_type",
    "positive_float",
    "positive_int",
]
