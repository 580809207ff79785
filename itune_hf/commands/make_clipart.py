"""`itune make-clipart`: write the real human-captioned clip-art corpus of Debian's `openclipart-svg` package."""

from __future__ import annotations

import argparse

HELP = (
    "Write a real human-captioned image corpus from the installed openclipart-svg package (apt-get install "
    "openclipart-svg): every SVG rendered to PNG, its title, description and category cleaned into captions, its raw "
    "title and keywords kept as alt-text, as a Karpathy dataset.json with train/val/test splits."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..data.clipart import DEFAULT_IMAGE_SIZE, MAX_IMAGE_SIZE, MIN_IMAGE_SIZE
    from ..utils.numbers import Number
    from ._options import add_output_dir, number_type, positive_int

    add_output_dir(parser, help="Directory to write (created).")
    parser.add_argument(
        "--image-size",
        type=number_type(Number(int, MIN_IMAGE_SIZE, MAX_IMAGE_SIZE)),
        default=DEFAULT_IMAGE_SIZE,
        metavar="PX",
        help=f"The longest side of each image in pixels, {MIN_IMAGE_SIZE} to {MAX_IMAGE_SIZE} "
        f"(default: {DEFAULT_IMAGE_SIZE}).",
    )
    parser.add_argument(
        "--svg-root",
        default=None,
        metavar="DIR",
        help="Read this tree of SVG files instead of the installed openclipart-svg package (e.g. an unpacked "
        "openclipart release).",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="The render cache (default: $ITUNE_DATA_CACHE/clipart-renders, else "
        "~/.cache/itune_hf/data/clipart-renders): a rerun, or a run after an interrupted one, renders only the "
        "files it does not hold.",
    )
    parser.add_argument(
        "--workers", type=positive_int, default=None, metavar="N", help="Rendering processes (default: CPUs, <= 8)."
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Write into a non-empty directory that is not a previous make-clipart output "
        "(files of the same names are replaced, other files are kept).",
    )


def run(args: argparse.Namespace) -> int:
    import sys
    import time
    import warnings
    from pathlib import Path

    from ..data.clipart import SKIPPED_FILE, ClipartSkippedWarning, make_clipart
    from ..utils.output_dirs import check_output_dir
    from . import CommandError
    from ._dataset_summary import print_summary

    check_output_dir(args.output_dir)
    if args.svg_root is not None and not Path(args.svg_root).is_dir():
        raise CommandError(f"--svg-root {args.svg_root}: no such directory")
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ClipartSkippedWarning)
        dataset_json = make_clipart(
            args.output_dir, image_size=args.image_size, overwrite=args.overwrite, svg_root=args.svg_root,
            cache_dir=args.cache_dir, workers=args.workers,
        )  # fmt: skip
    skipped = [warning for warning in caught if issubclass(warning.category, ClipartSkippedWarning)]
    for warning in caught:
        if warning in skipped:
            print(f"note: {warning.message}", file=sys.stderr)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    print_summary(dataset_json, time.perf_counter() - started)
    print_cleaning(dataset_json)
    if skipped:
        print(f"skipped {len(skipped)} files that do not parse or render: {dataset_json.parent / SKIPPED_FILE}")
    return 0


def print_cleaning(dataset_json) -> None:
    """One line: the images each dropping rule removed, and where the per-rule counts are."""
    import json

    counts = json.loads(dataset_json.read_text(encoding="utf-8"))["generator"]["cleaning"]
    no_caption, capped, merged = (counts.get(name, 0) for name in ("no_caption_dropped", "group_cap_dropped",
                                                                    "duplicate_pixels_merged"))  # fmt: skip
    print(
        f"dropped: {no_caption:,} images without a caption, {capped:,} by the group cap; merged {merged:,} identical "
        "copies (every rule's count: generator.cleaning in dataset.json)"
    )
