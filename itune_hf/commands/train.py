"""`itune train`: train an I-Tuning adapter (runs under `accelerate launch -m itune_hf.cli train ...` too)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
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
    from ..training_config import TrainingConfig

    return TrainingConfig, dataclasses.fields(TrainingConfig)


def _base_type(annotation: Any) -> type:
    hints = {"int": int, "float": float, "str": str, "bool": bool}
    if isinstance(annotation, str):  # postponed annotations: "int | None"
        return hints[annotation.split("|")[0].strip()]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if isinstance(annotation, types.UnionType) else annotation


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._options import add_option

    parser.add_argument("--config", metavar="FILE", help="A recipe (YAML or JSON) of these options; flags override it.")
    config_class, fields = _fields()
    for field in fields:
        flag = "--" + field.name.replace("_", "-")
        kind = _base_type(field.type)
        help_text = config_class.help(field.name)
        aliases = ALIASES.get(field.name, ())
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            default = field.default if field.default is not dataclasses.MISSING else None
            shown = f" (default: {default})" if default is not None else ""
            add_option(parser, flag, aliases=aliases, type=kind, default=None, help=help_text + shown)


def config_from_args(args: argparse.Namespace):
    """Build the `TrainingConfig`: dataclass defaults < the --config recipe < command-line flags."""
    from . import CommandError

    config_class, fields = _fields()
    names = {f.name for f in fields}
    values: dict[str, Any] = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise CommandError(f"--config {path}: no such file")
        text = path.read_text(encoding="utf-8")
        try:
            if path.suffix in (".yaml", ".yml"):
                import yaml

                recipe = yaml.safe_load(text) or {}
            else:
                recipe = json.loads(text)
        except Exception as error:  # a parse error names the file and where
            raise CommandError(f"--config {path}: not valid {path.suffix.lstrip('.').upper()} ({error})") from None
        if not isinstance(recipe, dict):
            raise CommandError(f"--config {path}: expected a mapping of option names to values")
        unknown = sorted(set(recipe) - names)
        if unknown:
            raise CommandError(f"--config {path}: unknown option(s) {', '.join(unknown)}")
        values.update(recipe)
    values.update({name: getattr(args, name) for name in names if getattr(args, name, None) is not None})
    if "output_dir" not in values:
        raise CommandError("--output-dir is required (on the command line or in the --config recipe)")
    return config_class(**values)


def run(args: argparse.Namespace) -> int:
    from accelerate import PartialState

    from ..training import train

    summary = train(config_from_args(args))
    state = PartialState()
    if state.is_main_process:
        print(json.dumps({k: v for k, v in summary.items() if k != "history"}))
    state.destroy_process_group()  # explicitly, before interpreter teardown (a gloo group can hang there)
    return 0
