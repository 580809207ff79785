"""Options with one spelling across commands; other spellings are accepted as hidden aliases.

A hidden alias sets the same value as its option but is not shown by `--help` (or in the usage line), so the help
and the docs name one spelling only. The option and its aliases are mutually exclusive: passing two spellings of
one option is an error ("argument --output-dir: not allowed with argument --output"), whatever their order.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from ..utils.numbers import BEAM_SIZE, NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, Number

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
        type=number_type(BEAM_SIZE),
        default=None,
        help="Beam size (1 = greedy). Default: the model's generation config, its paper's test setting (5 beams "
        "for I-Tuning, ClipCap and cross-attention, 2 for XGPT).",
    )


def add_max_new_tokens(parser: argparse.ArgumentParser) -> argparse.Action:
    """`--max-new-tokens`, whose default is the model's own (its generation config).

    Args:
        parser: The command's parser.
    """
    return parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        help="Longest caption, in tokens (default: the model's generation config: 30 new tokens for I-Tuning, 60 in "
        "all for XGPT).",
    )


def add_adapters(parser: argparse.ArgumentParser, *, what: str) -> None:
    """`--adapter NAME=DIR` (repeatable) and `--use-adapter NAME`: several I-Tuning adapters on one frozen base
    (`itune_hf.adapter.switching`), in place of `--model`.

    Args:
        parser: The command's parser.
        what: What the command does with each adapter, for the help, e.g. "captions each image with each".
    """
    parser.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="An adapter-only checkpoint (itune train of an I-Tuning preset) to load on one shared frozen base, in "
        f"place of --model (repeatable; DIR alone is named after its folder); {what}.",
    )
    parser.add_argument(
        "--use-adapter",
        metavar="NAME",
        default=None,
        help="With several --adapter: use only this one (default: every adapter).",
    )


def model_or_adapters(args: argparse.Namespace) -> dict[str, str] | None:
    """The adapters `--adapter` names ({name: directory}; None when the command runs one `--model`), with `--model`,
    `--adapter` and `--use-adapter` checked before any work.

    Args:
        args: Parsed arguments with `model`, `adapter`, `use_adapter` and the speed options (`add_speed_arguments`).

    Raises:
        CommandError: both or neither of `--model` and `--adapter`, a malformed `--adapter`, a `--use-adapter`
            naming none of them, or `--adapter` with a speed option (`--int8`, `--precision`, `--vocabulary`).
    """
    from ..adapter.switching import parse_named_adapters
    from . import CommandError

    if args.model and args.adapter:
        raise CommandError(
            "--model and --adapter: pass one (--adapter NAME=DIR, repeated, loads the adapters on their shared base)"
        )
    if not args.adapter:
        if not args.model:
            raise CommandError("--model is required (or --adapter NAME=DIR, repeatable)")
        if args.use_adapter:
            raise CommandError(f"--use-adapter {args.use_adapter}: needs --adapter NAME=DIR")
        return None
    try:
        adapters = parse_named_adapters(args.adapter)
    except ValueError as error:
        raise CommandError(str(error)) from None
    if speed_options_given(args):
        raise CommandError("--int8, --precision and --vocabulary apply to --model; drop them with --adapter")
    from ..models.quantization import RECORDED

    if getattr(args, "load_in", RECORDED) != RECORDED:
        raise CommandError(f"--load-in {args.load_in} applies to --model; drop it with --adapter")
    if args.use_adapter and args.use_adapter not in adapters:
        raise CommandError(f"--use-adapter {args.use_adapter}: no such --adapter; choose one of {', '.join(adapters)}")
    return adapters


def speed_options_given(args: argparse.Namespace) -> bool:
    """Whether any of `--int8`, `--precision` (other than fp32) and `--vocabulary` was given.

    Args:
        args: Parsed arguments with `int8`, `precision` and `vocabulary`.
    """
    return bool(args.int8 or args.precision != "fp32" or args.vocabulary)


def load_adapters_argument(adapters: dict[str, str]):
    """`load_adapter_set(adapters)` for a command, each failure one line naming the `--adapter`.

    Args:
        adapters: What `model_or_adapters` returned.
    """
    from ..adapter.switching import load_adapter_set
    from ..errors import InputError
    from . import CommandError

    try:
        return load_adapter_set(adapters)
    except InputError as error:
        raise CommandError(str(error)) from error


def number_type(number: Number) -> Callable[[str], int | float]:
    """The argparse `type` of a numeric option of kind `number` (`itune_hf.utils.numbers.Number`): a bad value is
    refused while parsing, e.g. "argument --shard-size: expected an integer >= 1, got '0'", exit status 2.

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
    "add_adapters",
    "add_option",
    "add_output_dir",
    "load_adapters_argument",
    "metrics_argument",
    "model_or_adapters",
    "non_negative_int",
    "number_type",
    "positive_float",
    "positive_int",
]
