"""`itune train`: train an I-Tuning adapter (runs under `accelerate launch -m itune_hf.cli train ...` too)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

HELP = (
    "Train I-Tuning modules on frozen backbones; saves the adapter (plus processor and card) to --output-dir. "
    "It reads two splits of --data, --train-split and --eval-split (where itune eval --split reads one)."
)
# Other spellings of a flag, accepted but not shown by --help. Training has two splits, so `--split` (the flag of the
# commands that read one) is taken as the one it trains on.
ALIASES = {"train_split": ("--split",)}


def _fields():
    from ..training.config import TrainingConfig

    return TrainingConfig, dataclasses.fields(TrainingConfig)


def _option_type(config_class, name: str):
    """The argparse `type` of option `name`: the value typed and checked as `TrainingConfig.coerce` does for recipes
    (`--max-steps 0` is refused while parsing; `--eval-max-images none` is None)."""

    def parse(text: str):
        try:
            value = config_class.coerce(name, text)
            # "none" stays text here (TrainingConfig reads it as None): a None flag means "not given" to the parser
            return text if value is None else value
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix(f"{name}: ")) from None

    parse.__name__ = name
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._options import add_option

    parser.add_argument("--config", metavar="FILE", help="A recipe (YAML or JSON) of these options; flags override it.")
    config_class, fields = _fields()
    for field in fields:
        flag = "--" + field.name.replace("_", "-")
        kind = str(field.type).split("|")[0].strip()  # postponed annotations: "int | None"
        help_text = config_class.help(field.name)
        aliases = ALIASES.get(field.name, ())
        if kind == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            default = field.default if field.default is not dataclasses.MISSING else None
            shown = f" (default: {default})" if default is not None else ""
            add_option(
                parser,
                flag,
                aliases=aliases,
                type=_option_type(config_class, field.name),
                default=None,
                help=help_text + shown,
            )


def config_from_args(args: argparse.Namespace):
    """Build the `TrainingConfig`: dataclass defaults < the --config recipe < command-line flags."""
    from . import CommandError

    config_class, fields = _fields()
    names = {f.name for f in fields}
    values: dict[str, Any] = read_recipe(Path(args.config), config_class) if args.config else {}
    values.update({name: getattr(args, name) for name in names if getattr(args, name, None) is not None})
    if "output_dir" not in values:
        raise CommandError("--output-dir is required (on the command line or in the --config recipe)")
    return config_class(**values)


def read_recipe(path: Path, config_class) -> dict[str, Any]:
    """The options of a `--config` recipe (YAML or JSON), each typed and checked by its option's type.

    Args:
        path: The recipe file.
        config_class: `TrainingConfig`.

    Raises:
        CommandError: naming the file, and the key, its value and the expected type.
    """
    from ..utils.files import reading
    from . import CommandError

    if not path.is_file():
        raise CommandError(f"--config {path}: no such file")
    kind = "YAML" if path.suffix in (".yaml", ".yml") else "JSON"
    with reading(f"--config {path}", f"the recipe (not valid {kind})", "fix the file"):
        text = path.read_text(encoding="utf-8")
        if kind == "YAML":
            import yaml

            recipe = yaml.safe_load(text)
        else:
            recipe = json.loads(text)
    if recipe is None:
        recipe = {}
    if not isinstance(recipe, dict):
        raise CommandError(
            f"--config {path}: expected a mapping of option names to values, got {type(recipe).__name__}"
        )
    names = [field.name for field in dataclasses.fields(config_class)]
    unknown = [str(key) for key in recipe if key not in names]
    if unknown:
        described = ", ".join(key + _suggestion(key, names) for key in unknown)
        raise CommandError(f"--config {path}: unknown option(s) {described}; itune train --help lists them")
    values = {}
    for key, value in recipe.items():
        try:
            values[key] = config_class.coerce(key, value)
        except ValueError as error:
            raise CommandError(f"--config {path}: {error}") from None
    return values


def _suggestion(key: str, names: list[str]) -> str:
    """ " (did you mean learning_rate?)" for a key close to an option's name (or its flag spelling)."""
    import difflib

    close = difflib.get_close_matches(key.lstrip("-").replace("-", "_"), names, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def resume_command(argv: list[str]) -> str:
    """The command line that continues an interrupted run: the same one with `--resume` (given once)."""
    import shlex

    words = [word for word in argv if word not in ("--resume", "--overwrite", "--no-resume")]
    return shlex.join(["itune", *words, "--resume"])


def interrupted_message(error, output_dir: str, argv: list[str]) -> str:
    """The one line printed when a signal stops `itune train`: where it stopped, what was saved, how to go on.

    Args:
        error: The `Interrupted` raised (a signal's number, the step, the checkpoint), or a plain KeyboardInterrupt.
        output_dir: The run's output directory.
        argv: The command's arguments (after `itune`).
    """
    import signal

    from ..training.checkpoints import Checkpointer

    signum = getattr(error, "signum", signal.SIGINT)
    checkpoint = getattr(error, "checkpoint", None) or Checkpointer(None, output_dir, keep=1).latest()
    step = getattr(error, "step", None)
    where = f"at step {step}" if step is not None else "before the step under way could be saved"
    if checkpoint is None:
        return f"itune train: interrupted ({signal.Signals(signum).name}) {where}; no checkpoint to resume from"
    return (
        f"itune train: interrupted ({signal.Signals(signum).name}) {where}; checkpoint {checkpoint} is saved; "
        f"continue with: {resume_command(argv)}"
    )


def run(args: argparse.Namespace) -> int:
    import signal
    import sys
    import threading

    from ..utils.output_dirs import check_output_dir

    config = config_from_args(args)
    check_output_dir(config.output_dir)  # before the model loads
    argv = getattr(args, "argv", None) or ["train", "--output-dir", config.output_dir]

    def terminated(signum, frame) -> None:  # before and after the loop (which saves first): stop as Ctrl-C does
        from ..training.loop import Interrupted

        raise Interrupted(signum)

    main_thread = threading.current_thread() is threading.main_thread()  # handlers belong to the main thread
    previous = signal.signal(signal.SIGTERM, terminated) if main_thread else None
    try:
        return _train_and_report(config)
    except KeyboardInterrupt as error:
        print(interrupted_message(error, config.output_dir, argv), file=sys.stderr)
        return getattr(error, "exit_status", 128 + signal.SIGINT)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _train_and_report(config) -> int:
    from accelerate import PartialState

    from ..training import train

    summary = train(config)
    state = PartialState()
    if state.is_main_process:
        print(json.dumps({k: v for k, v in summary.items() if k != "history"}))
    state.destroy_process_group()  # explicitly, before interpreter teardown (a gloo group can hang there)
    return 0
