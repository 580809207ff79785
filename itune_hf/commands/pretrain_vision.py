"""`itune pretrain-vision`: pre-train a preset's small vision tower on the synthetic world (cached on first use)."""

from __future__ import annotations

import argparse

HELP = (
    "Pre-train a preset's small random vision tower on the synthetic world (predicting each scene's objects, "
    "colours, count, layout and background); cached and fingerprinted, reused when nothing changed."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..utils.numbers import POSITIVE_FLOAT
    from ..vision.pretraining import VisionPretrainingSettings
    from ._options import number_type, positive_int

    defaults = VisionPretrainingSettings()
    parser.add_argument("--preset", default="itune-demo", help="Preset whose vision tower to pre-train (default: "
                        "itune-demo).")  # fmt: skip
    parser.add_argument(
        "--output-dir",
        default=None,
        metavar="DIR",
        help="Where the tower goes (reused when its fingerprint matches); default: the shared cache, "
        "$ITUNE_CACHE/vision-towers/<tower>-<fingerprint> ($ITUNE_CACHE: ~/.cache/itune_hf), where a preset whose "
        "tower is itune:pretrain-vision/<preset> (xgpt-demo-resnet's) finds it when the settings are the defaults.",
    )
    parser.add_argument("--steps", type=positive_int, default=defaults.steps, help="Optimizer steps.")
    parser.add_argument("--batch-size", type=positive_int, default=defaults.batch_size, help="Images per step.")
    parser.add_argument(
        "--learning-rate", type=number_type(POSITIVE_FLOAT), default=defaults.learning_rate, help="Peak learning rate."
    )
    parser.add_argument(
        "--num-images",
        type=positive_int,
        default=None,
        help="Distinct training images rendered (default: as many as the steps see, at most 4,096).",
    )
    parser.add_argument("--eval-images", type=positive_int, default=defaults.eval_images, help="Held-out images.")
    parser.add_argument(
        "--world-seed", type=int, default=defaults.world_seed, help="Seed of the pre-training world (the demo's is 0)."
    )
    parser.add_argument("--image-size", type=positive_int, default=defaults.image_size, help="Rendered image side.")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="Seed of the heads and the batch order.")
    parser.add_argument("--force", action="store_true", help="Pre-train again even if an intact tower is cached.")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Pre-train into a --output-dir holding other files: they are removed (and named); refused without it.",
    )


def settings_from_args(args: argparse.Namespace):
    """The `VisionPretrainingSettings` the flags ask for.

    Raises:
        CommandError: naming the flag, for a value the settings refuse (e.g. a too small --image-size).
    """
    from ..vision.pretraining import VisionPretrainingSettings
    from . import CommandError

    fields = ("steps", "batch_size", "learning_rate", "num_images", "eval_images", "world_seed", "image_size", "seed")
    try:
        return VisionPretrainingSettings(**{name: getattr(args, name) for name in fields})
    except ValueError as error:
        flag = str(error).split(" ", 1)[0].replace("_", "-")
        raise CommandError(f"--{flag}: {str(error).split(' ', 1)[1]}") from None


def run(args: argparse.Namespace) -> int:
    from ..vision.pretraining import pretrain_vision_tower
    from . import CommandError

    settings = settings_from_args(args)
    try:
        tower = pretrain_vision_tower(
            args.preset, args.output_dir, settings, force=args.force, progress=True, overwrite=args.overwrite
        )
    except KeyError as error:
        raise CommandError(f"--preset {args.preset}: {error.args[0]}") from None
    except (ValueError, NotADirectoryError) as error:
        raise CommandError(f"--preset {args.preset} / --output-dir {args.output_dir}: {error}") from None
    print(tower.describe())
    for name, head in tower.report["heads"].items():
        print(f"  {name:12} {head['accuracy']:.3f} (chance {head['chance']:.3f})")
    print(f"use it: itune train --preset {args.preset} --vision-model {tower.tower_dir} ...")
    return 0
