"""`itune make-shards`: write a caption dataset as WebDataset tar shards in img2dataset's layout."""

from __future__ import annotations

import argparse

HELP = (
    "Write one split of a caption dataset (default: the synthetic world's train split) as WebDataset tar shards in "
    "img2dataset's layout (00000.tar, ...: <key>.png/.jpg + <key>.txt + <key>.json), for streamed training."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..data.args import add_data_arguments
    from ._options import add_output_dir

    add_data_arguments(parser, default_data="synthetic", default_split="train")
    add_output_dir(parser, help="Directory to write the shards into (created; must hold no .tar yet).")
    parser.add_argument("--shard-size", type=int, default=1000, metavar="N", help="Samples per shard (default: 1000).")
    parser.add_argument(
        "--caption-index",
        type=int,
        default=0,
        metavar="I",
        help="Which caption of each image to write (one per sample, as in web data; default: the first).",
    )


def run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from ..data.args import load_data_from_args
    from ..data.webdataset import write_shards
    from . import CommandError

    output = Path(args.output_dir)
    if output.is_dir() and any(output.glob("*.tar")):
        raise CommandError(f"--output-dir {output} already holds .tar shards: choose an empty directory")
    if args.shard_size < 1:
        raise CommandError(f"--shard-size must be at least 1, got {args.shard_size}")
    started = time.perf_counter()
    rows = load_data_from_args(args)
    if not hasattr(rows, "column_names") or "image_path" not in rows.column_names:
        raise CommandError(f"--data {args.data}: pass one split (--split) of a dataset whose images are files")
    shards = write_shards(rows, output, shard_size=args.shard_size, caption_index=args.caption_index)
    pattern = f"{output}/{{{shards[0].stem}..{shards[-1].stem}}}.tar" if len(shards) > 1 else str(shards[0])
    print(f"wrote {len(rows):,} samples in {len(shards):,} shards to {output} ({time.perf_counter() - started:.1f}s)")
    print(f"use it with: --data '{pattern}'")
    return 0
