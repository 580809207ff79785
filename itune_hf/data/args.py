"""`add_data_arguments`: the same `--data/--image-root/--split/--on-missing/--image-column/--caption-column`
options on every command.

This module imports nothing heavy, so commands can call it from `add_arguments` without slowing `itune --help`.
"""

from __future__ import annotations

import argparse
from typing import Any

from ._common import ON_MISSING_CHOICES

DATA_HELP = (
    "Dataset: a Karpathy split JSON (dataset_coco.json, a make-synthetic/make-photos/make-clipart dataset.json or its "
    "directory), "
    "a NoCaps/COCO-style caption JSON, a Visual Genome region_descriptions.json, WebDataset tar shards "
    "('shards/{00000..00009}.tar', a glob or a directory; itune train), a built-in name (synthetic, photos), or a "
    "Hugging Face dataset id / save_to_disk directory."
)


def add_data_arguments(
    parser: argparse.ArgumentParser,
    *,
    default_data: str | None = None,
    default_split: str | None = None,
    verify_option: bool = False,
) -> argparse._ArgumentGroup:
    """Add `--data`, `--image-root`, `--allow-outside-image-root`, `--split`, `--on-missing` (and optionally
    `--verify-images`) to `parser`.

    Args:
        parser: The command's parser.
        default_data: Default for `--data` (e.g. `synthetic`); None makes `--data` required.
        default_split: Default for `--split` (None: every split).
        verify_option: Also add `--verify-images` (decode every image before use; see `verify_images`).

    Returns:
        The argument group holding the options.
    """
    group = parser.add_argument_group("data")
    group.add_argument(
        "--data",
        required=default_data is None,
        default=default_data,
        metavar="DATA",
        help=DATA_HELP + (f" Default: {default_data}." if default_data else ""),
    )
    group.add_argument(
        "--image-root",
        default=None,
        metavar="DIR",
        help="Directory the dataset's image paths are relative to (default: the directory of the --data file).",
    )
    group.add_argument(
        "--allow-outside-image-root",
        action="store_true",
        help="Read images the data file places outside the image root (.., absolute paths, symlinks out of it); "
        "by default such a file is refused, naming the entry.",
    )
    group.add_argument(
        "--split",
        default=default_split,
        metavar="SPLIT",
        help="train, val (validation, dev) or test" + (f" (default: {default_split})." if default_split else "."),
    )
    group.add_argument(
        "--on-missing",
        choices=ON_MISSING_CHOICES,
        default="report",
        help="Missing or empty image files: 'report' skips them and lists their paths, 'error' stops "
        "(default: report).",
    )
    add_column_arguments(group)
    if verify_option:
        group.add_argument(
            "--verify-images",
            action="store_true",
            help="Decode every image before use; undecodable ones are skipped or stop the command per --on-missing.",
        )
    return group


def add_column_arguments(group: Any) -> None:
    """Add `--image-column` and `--caption-column`: which columns of a Hugging Face dataset hold the images and the
    captions (default: the first known name present, `IMAGE_COLUMN_CANDIDATES` / `CAPTION_COLUMN_CANDIDATES`);
    `--caption-column` also names the field a Karpathy dataset.json's entries hold their captions in.

    Args:
        group: The parser or argument group to add them to.
    """
    group.add_argument(
        "--image-column",
        default=None,
        metavar="NAME",
        help="Hugging Face datasets: the column holding the images (default: the first of image, img, image_path, "
        "filepath, file_name, ... present).",
    )
    group.add_argument(
        "--caption-column",
        default=None,
        metavar="NAME",
        help="Hugging Face datasets: the column holding the captions (default: the first of captions, caption, "
        "sentences, text, ... present). A Karpathy dataset.json: the entry field read as the captions (a string or "
        "a list of strings) in place of sentences, e.g. alt_text (make-clipart's raw alt-text arm).",
    )


def column_options(source: Any) -> dict[str, Any]:
    """The `image_column` / `caption_column` given (parsed arguments or a `TrainingConfig`), and
    `allow_outside_root` when `--allow-outside-image-root` is set, as `load_captions` options.

    Args:
        source: Anything with `image_column` / `caption_column` (and `allow_outside_image_root`) attributes.
    """
    names = ("image_column", "caption_column")
    options: dict[str, Any] = {name: getattr(source, name) for name in names if getattr(source, name, None) is not None}
    if getattr(source, "allow_outside_image_root", False):
        options["allow_outside_root"] = True
    return options


def load_data_from_args(args: argparse.Namespace, split: str | None = None, **options: Any):
    """`load_captions` with the options `add_data_arguments` added (and `verify_images` if `--verify-images`).

    Args:
        args: Parsed arguments.
        split: Overrides `--split` (e.g. a command that always evaluates on `test`).
        **options: Passed to `load_captions`.
    """
    from .loading import load_captions
    from .verify import verify_images

    options = {**column_options(args), **options}
    dataset = load_captions(
        args.data, args.image_root, split if split is not None else args.split, on_missing=args.on_missing, **options
    )
    from datasets import IterableDataset, IterableDatasetDict

    if isinstance(dataset, (IterableDataset, IterableDatasetDict)):
        from ._common import DataError

        raise DataError(
            f"--data {args.data}: streamed WebDataset shards are for training (itune train); this command reads a "
            "dataset with image files (e.g. a Karpathy dataset.json)"
        )
    if getattr(args, "verify_images", False):
        dataset, _ = verify_images(dataset, on_error=args.on_missing)
    return dataset
