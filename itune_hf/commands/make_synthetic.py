"""`itune make-synthetic`: write the procedurally generated caption world (the embedded default dataset)."""

from __future__ import annotations

import argparse

HELP = (
    "Write the synthetic caption world (shapes, colours, counts, positions; 5 captions per image) as a Karpathy "
    "dataset.json plus PNG images, deterministic by seed."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._options import add_output_dir

    add_output_dir(parser, help="Directory to write (created).")
    parser.add_argument("--num-images", type=int, default=2000, metavar="N", help="Number of images (default: 2000).")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="World seed (default: 0).")
    parser.add_argument(
        "--image-size", type=int, default=64, metavar="PX", help="Image width and height in pixels (default: 64)."
    )
    parser.add_argument(
        "--world",
        choices=("captions", "alt-text"),
        default="captions",
        help="captions (default): the in-domain world; alt-text: an out-of-domain, noisy stand-in for web alt-text "
        "(Conceptual Captions) to pre-train on (other shapes, short noisy captions, a fifth unrelated to the image).",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Write into a non-empty directory that is not a previous make-synthetic output "
        "(files of the same names are replaced, other files are kept).",
    )


def run(args: argparse.Namespace) -> int:
    import time

    from ..data.synthetic import make_synthetic
    from ._dataset_summary import print_summary

    started = time.perf_counter()
    dataset_json = make_synthetic(
        args.output_dir,
        num_images=args.num_images,
        seed=args.seed,
        image_size=args.image_size,
        overwrite=args.overwrite,
        world=args.world,
    )
    print_summary(dataset_json, time.perf_counter() - started)
    return 0
