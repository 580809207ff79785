"""`itune params`: count the trainable I-Tuning parameters of a preset without allocating any weight."""

from __future__ import annotations

import argparse

HELP = "Count the trainable (I-Tuning) parameters of a preset; the count is the last line printed."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", required=True, help="Preset name, e.g. itune-gpt2-large (see --list).")
    parser.add_argument("--first-layer", type=int, default=None, help="Override I-Tuning Dropping's first layer.")
    parser.add_argument("--bottleneck-dim", type=int, default=None, help="Override the bottleneck width r.")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..presets import get_preset

    preset = get_preset(args.preset)
    overrides = {}
    if args.first_layer is not None:
        overrides["first_layer"] = args.first_layer
    if args.bottleneck_dim is not None:
        overrides["bottleneck_dim"] = args.bottleneck_dim
    config = preset.config(**overrides)
    with torch.device("meta"):  # shapes only: no memory is allocated for any weight
        model = preset.family.load("model_class")(config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    layers = config.ituning_layers
    per_layer = trainable // len(layers)
    print(f"preset: {preset.name} ({preset.description})")
    print(f"vision: {preset.vision.hub_id}  text: {preset.text.hub_id}")
    print(
        f"I-Tuning layers: {layers[0]}..{layers[-1]} ({len(layers)} of {config.text_config.num_hidden_layers}), "
        f"bottleneck {config.resolved_bottleneck_dim}, {per_layer:,} parameters per layer"
    )
    print(f"frozen backbone parameters: {frozen:,}")
    if preset.paper_trainable_params and not overrides:
        print(f"paper (Table 1): {preset.paper_trainable_params} trainable")
    print(trainable)
    return 0
