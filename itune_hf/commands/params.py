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
    from . import CommandError

    preset = get_preset(args.preset)
    overrides = {}
    if args.first_layer is not None:
        overrides["first_layer"] = args.first_layer
    if args.bottleneck_dim is not None:
        overrides["bottleneck_dim"] = args.bottleneck_dim
    if overrides and preset.family_name != "ituning":
        options = ", ".join("--" + name.replace("_", "-") for name in overrides)
        raise CommandError(f"{options} only apply to I-Tuning presets; {preset.name} is a {preset.family_name} preset")
    config = preset.config(**overrides)
    with torch.device("meta"):  # shapes only: no memory is allocated for any weight
        model = preset.family.load("model_class")(config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    print(f"preset: {preset.name} ({preset.description})")
    if preset.family_name == "xgpt":
        _print_xgpt(preset, config, model)
    elif preset.family_name == "ituning":
        _print_ituning(preset, config, trainable, frozen, overrides)
    else:  # the baselines (ClipCap, cross-attention): their settings as their cards list them
        _print_settings(preset, config, frozen)
    print(trainable)
    return 0


def _backbone_source(backbone) -> str:
    """A backbone's Hub id, or what it is without one (a random tower built from the preset's stored config)."""
    return backbone.hub_id or f"random (preset config {backbone.name}, seed {backbone.init_seed})"


def _print_ituning(preset, config, trainable: int, frozen: int, overrides: dict) -> None:
    layers = config.ituning_layers
    per_layer = trainable // len(layers)
    print(f"vision: {_backbone_source(preset.vision)}  text: {_backbone_source(preset.text)}")
    print(
        f"I-Tuning layers: {layers[0]}..{layers[-1]} ({len(layers)} of {config.text_config.num_hidden_layers}), "
        f"bottleneck {config.resolved_bottleneck_dim}, {per_layer:,} parameters per layer"
    )
    print(f"frozen backbone parameters: {frozen:,}")
    if preset.paper_trainable_params and not overrides:
        print(f"paper (Table 1): {preset.paper_trainable_params} trainable")


def _print_settings(preset, config, frozen: int) -> None:
    """Another family's backbones, settings (as its cards list them) and frozen parameters."""
    print(f"vision: {preset.vision.hub_id or preset.vision.name}  text: {preset.text.hub_id or preset.text.name}")
    print(", ".join(f"{name}: {value}" for name, value in config.settings.card_rows(config).items()))
    print(f"frozen backbone parameters: {frozen:,}")
    if preset.paper_trainable_params:
        print(f"paper: {preset.paper_trainable_params} trainable")


def _print_xgpt(preset, config, model) -> None:
    """XGPT trains everything but its vision tower: the parts, and the total of each Table 3 architecture."""
    import torch

    vision = _backbone_source(preset.vision)
    print(f"vision: {vision}, frozen  tokenizer: GPT-2 BPE, {config.vocab_size:,} tokens")
    print(
        f"architecture: {config.architecture}, {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads, AoA refiner {'on' if config.use_aoa_refiner else 'off'}"
    )
    for part, count in model.parameter_counts().items():
        print(f"  {part}: {count:,}")
    others = []
    for architecture in ("enc", "encdec", "encdec_share"):
        if architecture != config.architecture:
            variant = preset.config(architecture=architecture, encoder_signal=None)
            with torch.device("meta"):
                other = type(model)(variant)
            others.append(f"{architecture} {sum(p.numel() for p in other.parameters() if p.requires_grad):,}")
    print(f"trainable in the other architectures (Table 3): {', '.join(others)}")
    print("trainable (everything but the vision tower; the paper gives no count):")
