"""`itune cache-features`: run the frozen vision tower once over a dataset and store its last hidden states."""

from __future__ import annotations

import argparse
import sys

HELP = (
    "Cache the frozen vision tower's last hidden states of a dataset (resumable), for training without it. "
    "Exit status 1 when some images could not be read (listed, by path, in failed.json)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..data import add_data_arguments
    from ._options import add_output_dir, positive_int

    add_data_arguments(parser, verify_option=True)
    model = parser.add_argument_group("vision tower")
    model.add_argument("--preset", default=None, help="Model preset whose vision tower to use (e.g. itune-demo).")
    model.add_argument("--vision-model", default=None, help="Vision checkpoint id or directory (instead of a preset).")
    add_output_dir(parser, help="Cache directory (an interrupted run resumes here).")
    parser.add_argument(
        "--dtype",
        default="float16",
        choices=["float16", "bfloat16", "float32"],
        help="Storage dtype (default: float16).",
    )
    parser.add_argument("--batch-size", type=positive_int, default=64, help="Images per vision-tower call.")
    parser.add_argument("--shard-size", type=positive_int, default=2048, help="Images per shard file.")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Cache into a --output-dir holding files that are not a feature cache: they are removed (and named).",
    )


def load_vision(preset: str | None, vision_model: str | None):
    """The frozen vision tower and its image processor, from a preset or a checkpoint."""
    from . import CommandError

    if bool(preset) == bool(vision_model):
        raise CommandError("pass exactly one of --preset and --vision-model")
    if preset:
        from ..presets import build_image_processor, get_preset

        return get_preset(preset).vision.load(pretrained=True, vision=True), build_image_processor(preset)
    from transformers import AutoImageProcessor

    from ..models._shared.backbones import load_vision_tower, resolve_reference

    location = resolve_reference(vision_model)
    return load_vision_tower(location), AutoImageProcessor.from_pretrained(location)


def run(args: argparse.Namespace) -> int:
    import torch
    from datasets import DatasetDict, concatenate_datasets

    from ..data import load_data_from_args
    from ..utils.output_dirs import check_output_dir, refuse_output_over_inputs
    from ..vision.feature_cache import cache_features

    check_output_dir(args.output_dir)  # before the vision tower loads
    refuse_output_over_inputs(args.output_dir, [args.data, getattr(args, "image_root", None), args.vision_model])
    vision, image_processor = load_vision(args.preset, args.vision_model)
    if torch.cuda.is_available():
        vision.to("cuda")
    data = load_data_from_args(args)
    rows = concatenate_datasets(list(data.values())) if isinstance(data, DatasetDict) else data
    report = cache_features(
        rows,
        args.output_dir,
        vision_model=vision,
        image_processor=image_processor,
        dtype=args.dtype,
        batch_size=args.batch_size,
        shard_size=args.shard_size,
        on_error="error" if args.on_missing == "error" else "report",
        overwrite=args.overwrite,
    )
    print(f"cached {report.cached} images ({report.already_cached} were already cached) in {report.directory}")
    if report.recomputed:
        print(f"{report.recomputed} cached entries were computed from other image files and were computed again")
    if report.damaged:
        print(f"{len(report.damaged)} damaged shard(s) moved aside (*.damaged); their images were cached again")
    if report.failed:
        print(
            f"{len(report.failed)} image(s) could not be read and were skipped "
            f"(see {report.directory / 'failed.json'}):",
            file=sys.stderr,
        )
        for entry in list(report.failed.values())[:10]:
            print(f"  {entry['path']}: {entry['reason']}", file=sys.stderr)
        return 1
    return 0
