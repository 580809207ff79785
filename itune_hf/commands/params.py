"""`itune params`: count the trainable I-Tuning parameters of a preset, allocating no weight; `--list` the presets."""

from __future__ import annotations

import argparse

HELP = "Count the trainable (I-Tuning) parameters of a preset (the count is the last line printed), or list them."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._options import non_negative_int, positive_int

    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--preset", metavar="NAME", help="Preset name, e.g. itune-gpt2-large (see --list).")
    which.add_argument("--list", action="store_true", help="List the presets with their descriptions.")
    parser.add_argument(
        "--first-layer", type=non_negative_int, default=None, help="Override I-Tuning Dropping's first layer."
    )
    parser.add_argument("--bottleneck-dim", type=positive_int, default=None, help="Override the bottleneck width r.")


def _preset_lines() -> list[str]:
    """One line per preset: its name, then its description."""
    from ..presets import get_preset, list_presets

    names = list_presets()
    width = max(len(name) for name in names)
    return [f"{name:<{width}}  {get_preset(name).description}" for name in names]


def run(args: argparse.Namespace) -> int:
    if args.list:
        from . import CommandError

        if args.first_layer is not None or args.bottleneck_dim is not None:
            raise CommandError("--first-layer and --bottleneck-dim apply to --preset, not to --list")
        print("\n".join(_preset_lines()))
        return 0

    import torch

    from ..presets import get_preset

    preset = get_preset(args.preset)
    overrides = {}
    if args.first_layer is not None:
        overrides["first_layer"] = args.first_layer
    if args.bottleneck_dim is not None:
        overrides["bottleneck_dim"] = args.bottleneck_dim
    _check_overrides(preset, overrides)
    config = preset.config(**overrides)
    with torch.device("meta"):  # shapes only: no memory is allocated for any weight
        model = preset.family.load("model_class")(config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"preset: {preset.name} ({preset.description})")
    describe = preset.family.load("describe_preset") if preset.family.describe_preset else describe_settings
    print("\n".join(describe(preset, config, model, overrides)))
    print(trainable)
    return 0


def _check_overrides(preset, overrides: dict) -> None:
    """Refuse overrides that are not settings of the preset's family, naming the families whose settings they are."""
    import dataclasses

    from ..models import families
    from . import CommandError

    def settings_of(family) -> set[str]:
        return {f.name for f in dataclasses.fields(family.load("settings_class"))} if family.settings_class else set()

    if overrides and not set(overrides) <= settings_of(preset.family):
        options = ", ".join("--" + name.replace("_", "-") for name in overrides)
        takers = " or ".join(f.title for f in families().values() if set(overrides) <= settings_of(f))
        raise CommandError(f"{options} only apply to {takers} presets; {preset.name} is a {preset.family_name} preset")


def frozen_parameters(model) -> int:
    """How many parameters of `model` do not train."""
    return sum(p.numel() for p in model.parameters() if not p.requires_grad)


def describe_settings(preset, config, model, overrides: dict) -> list[str]:
    """What `itune params` says of a preset whose family describes nothing more (the baselines): its backbones, its
    settings as its cards list them, and its frozen parameters."""
    lines = [
        f"vision: {preset.vision.hub_id or preset.vision.name}  text: {preset.text.hub_id or preset.text.name}",
        ", ".join(f"{name}: {value}" for name, value in config.settings.card_rows(config).items()),
        f"frozen backbone parameters: {frozen_parameters(model):,}",
    ]
    if preset.paper_trainable_params:
        lines.append(f"paper: {preset.paper_trainable_params} trainable")
    return lines
