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
    from ._options import non_negative_int, positive_int

    add_output_dir(
        parser,
        help="Directory to write the shards into (created; a directory an interrupted make-shards left unfinished is "
        "finished by the same command; any other content is refused without --overwrite).",
    )
    parser.add_argument(
        "--shard-size", type=positive_int, default=1000, metavar="N", help="Samples per shard (default: 1000)."
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace the shards (and anything else) --output-dir holds; what is removed is named.",
    )
    parser.add_argument(
        "--caption-index",
        type=non_negative_int,
        default=0,
        metavar="I",
        help="Which caption of each image to write (one per sample, as in web data; default: the first).",
    )


def run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from ..data.args import load_data_from_args
    from ..data.webdataset import write_shards
    from ..utils.output_dirs import check_output_dir, claim_output_dir

    output = check_output_dir(args.output_dir)
    started = time.perf_counter()
    rows = _with_captions(load_data_from_args(args))
    _check_rows(args, rows)
    identity = {"data": str(Path(args.data).expanduser().resolve()), "split": args.split,
                "caption_column": args.caption_column, "image_root": args.image_root}  # fmt: skip
    lock = claim_output_dir(
        output,
        command="itune make-shards",
        overwrite=args.overwrite,
        is_previous_output=lambda d: any(d.glob("*.tar")),
        inputs=[args.data, getattr(args, "image_root", None)],
    )
    try:
        _check_previous_set(args, output, len(rows), identity)
        shards = write_shards(
            rows, output, shard_size=args.shard_size, caption_index=args.caption_index, identity=identity
        )
    finally:
        lock.release()
    pattern = f"{output}/{{{shards[0].stem}..{shards[-1].stem}}}.tar" if len(shards) > 1 else str(shards[0])
    print(f"wrote {len(rows):,} samples in {len(shards):,} shards to {output} ({time.perf_counter() - started:.1f}s)")
    print(f"use it with: --data '{pattern}'")
    return 0


def _with_captions(rows):
    """The rows that have a caption: a sample needs one (an image without, as in NoCaps' test split, made the write
    fail half-way); how many were left out is said on stderr."""
    import sys

    if not hasattr(rows, "column_names"):
        return rows  # several splits: refused by _check_rows
    keep = [index for index, captions in enumerate(rows["captions"]) if captions]
    if len(keep) == len(rows):
        return rows
    print(f"itune make-shards: {len(rows) - len(keep)} of the {len(rows)} images have no caption and are left out",
          file=sys.stderr)  # fmt: skip
    return rows.select(keep)


def _check_rows(args: argparse.Namespace, rows) -> None:
    from . import CommandError

    if not hasattr(rows, "column_names") or "image_path" not in rows.column_names:
        raise CommandError(f"--data {args.data}: pass one split (--split) of a dataset whose images are files")
    if len(rows) == 0:
        raise CommandError(
            f"--data {args.data}: its {args.split} split holds no image with a caption; choose another --split"
        )
    _check_caption_index(args, [len(captions) for captions in rows["captions"]])
    _check_image_paths(args, rows)


def _check_caption_index(args: argparse.Namespace, counts: list[int]) -> None:
    """`--caption-index I` past every image's captions is refused; images with fewer take their last (counted)."""
    import sys

    from . import CommandError

    if args.caption_index >= max(counts):
        raise CommandError(
            f"--caption-index {args.caption_index}: the images of --data {args.data} ({args.split} split) have at most "
            f"{max(counts)} caption(s); pass an index below {max(counts)}"
        )
    fewer = sum(count <= args.caption_index for count in counts)
    if fewer:
        print(f"itune make-shards: {fewer} of the {len(counts)} images have at most {args.caption_index} caption(s) "
              "and get their last one", file=sys.stderr)  # fmt: skip


def _check_image_paths(args: argparse.Namespace, rows) -> None:
    """A shard packs the bytes of each row's file: only image files, so that a member name can never be the
    caption's `.txt` or the `.json` (the loader has already refused files outside the image root)."""
    from pathlib import Path

    from ..data.webdataset import IMAGE_EXTENSIONS
    from . import CommandError

    for image_id, path in zip(rows["image_id"], rows["image_path"]):
        if Path(path).resolve().suffix.lstrip(".").lower() not in IMAGE_EXTENSIONS:
            raise CommandError(
                f"--data {args.data}: image {image_id!r} is {path}, not an image file "
                f"(.{', .'.join(IMAGE_EXTENSIONS)}); make-shards packs only images"
            )


def _check_previous_set(args: argparse.Namespace, output, count: int, identity: dict) -> None:
    """An unfinished set of the same settings is resumed; any other earlier set needs `--overwrite` (which removes
    it, naming how many shards)."""
    import sys

    from ..data.webdataset import UNFINISHED_NAME, unfinished_shards
    from . import CommandError

    unfinished = unfinished_shards(output)
    wanted = {"rows": count, "shard_size": args.shard_size, "caption_index": args.caption_index, **identity}
    old = sorted(output.glob("*.tar"))
    if unfinished == wanted:
        print(f"resuming the unfinished shard set in {output} ({len(old)} shard(s) complete)", file=sys.stderr)
        return
    if old and not args.overwrite:
        what = "an unfinished shard set of other settings" if unfinished is not None else "a finished shard set"
        raise CommandError(
            f"--output-dir {output} holds {what} ({len(old)} .tar shards); choose another directory or pass "
            "--overwrite to replace it"
        )
    if old:
        print(f"--overwrite: removing {len(old)} shard(s) of {output}", file=sys.stderr)
    for shard in old:
        shard.unlink()
    (output / UNFINISHED_NAME).unlink(missing_ok=True)
