"""`itune make-synthetic`: write the procedurally generated caption world (the embedded default dataset)."""

from __future__ import annotations

import argparse

HELP = (
    "Write the synthetic caption world (shapes, colours, counts, positions; 5 captions per image) as a Karpathy "
    "dataset.json plus PNG images, deterministic by seed."
)


# the largest --image-size: larger images only cost disk and time (the vision towers resize to a few hundred pixels)
MAX_IMAGE_SIZE = 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..data.synthetic import MIN_IMAGE_SIZE, WORLDS
    from ..utils.numbers import Number
    from ._options import add_output_dir, number_type, positive_int

    add_output_dir(parser, help="Directory to write (created).")
    parser.add_argument(
        "--num-images", type=positive_int, default=2000, metavar="N", help="Number of images (default: 2000)."
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="World seed (default: 0).")
    parser.add_argument(
        "--image-size",
        type=number_type(Number(int, MIN_IMAGE_SIZE, MAX_IMAGE_SIZE)),
        default=64,
        metavar="PX",
        help=f"Image width and height in pixels, {MIN_IMAGE_SIZE} to {MAX_IMAGE_SIZE} (default: 64).",
    )
    parser.add_argument(
        "--world",
        choices=WORLDS,
        default="captions",
        help="captions (default): the in-domain world; alt-text: an out-of-domain, noisy stand-in for web alt-text "
        "(Conceptual Captions) to pre-train on (other shapes, short noisy captions, a fifth unrelated to the image); "
        "hard: 1-5 overlapping objects of 13 shapes and 10 colours on textured backgrounds, captions with synonyms "
        "(a constant caption scores little).",
    )
    parser.add_argument(
        "--caption-noise",
        type=caption_noise,
        default=None,
        metavar="RATE[,DROP]",
        help="alt-text world only: the chance that a caption is unrelated to its image and the chance that each colour "
        "or shape word is dropped (one rate: both; default 0.2,0.25). 0 writes the clean arm: every caption names "
        "every object of its image. The images do not depend on it.",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Write into a non-empty directory that is not a previous make-synthetic output "
        "(files of the same names are replaced, other files are kept).",
    )


def caption_noise(value: str):
    """`--caption-noise RATE` (both rates) or `UNRELATED,DROP`, as a `CaptionNoise`."""
    from ..data.synthetic import CaptionNoise

    parts = value.split(",")
    try:
        rates = [float(part) for part in parts]
        if len(rates) not in (1, 2):
            raise ValueError(f"one or two rates, got {len(rates)}")
        return CaptionNoise(rates[0], rates[-1])
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"{value!r}: give one rate from 0 to 1 (both kinds of noise) or two, UNRELATED,DROP ({error})"
        ) from None


def run(args: argparse.Namespace) -> int:
    import time

    from ..data.synthetic import make_synthetic
    from ..utils.output_dirs import check_output_dir
    from . import CommandError
    from ._dataset_summary import print_summary

    check_output_dir(args.output_dir)
    if args.caption_noise is not None and args.world != "alt-text":
        raise CommandError(
            f"--caption-noise: only the alt-text world has caption noise (--world {args.world}); drop it"
        )
    started = time.perf_counter()
    dataset_json = make_synthetic(
        args.output_dir,
        num_images=args.num_images,
        seed=args.seed,
        image_size=args.image_size,
        overwrite=args.overwrite,
        world=args.world,
        caption_noise=args.caption_noise,
    )
    print_summary(dataset_json, time.perf_counter() - started)
    return 0
