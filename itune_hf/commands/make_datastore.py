"""`itune make-datastore`: a caption datastore for retrieval-augmented captioning, from a dataset split and the
feature cache of its images (`itune_hf.vision.datastore`)."""

from __future__ import annotations

import argparse

HELP = (
    "Build a caption datastore (the captions of a dataset split, keyed by the pooled states of its images in a "
    "feature cache) for a retrieval-augmented model to retrieve from: itune caption and itune eval take it as their "
    "datastore, itune train trains with it. A datastore of another domain's captions changes what a model retrieves "
    "without training it."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..data import add_data_arguments
    from ..vision.datastore import DEFAULT_K
    from ._options import add_output_dir, positive_int

    add_data_arguments(parser, default_split="train")
    parser.add_argument(
        "--feature-cache",
        required=True,
        metavar="CACHE",
        help="The split's images' tower states (itune cache-features, with the tower of the model that will read the "
        "datastore: the keys must come from it).",
    )
    parser.add_argument(
        "--k",
        type=positive_int,
        default=DEFAULT_K,
        help=f"Captions per prompt (default {DEFAULT_K}) for a model trained without retrieval that reads this "
        "datastore; a model trained with retrieval quotes as many as it was trained with (itune train --retrieval DIR "
        "--retrieval-k K).",
    )
    add_output_dir(parser, help="Where the datastore goes (keys.safetensors, datastore.json).")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Write into an --output-dir holding files a datastore is not made of: they are removed (and named).",
    )


def run(args: argparse.Namespace) -> int:
    from ..data import load_data_from_args
    from ..data.karpathy import read_groups
    from ..utils.output_dirs import check_output_dir, claim_output_dir
    from ..vision.datastore import ENTRIES_FILE, CaptionDatastore
    from ..vision.feature_cache import FeatureCache
    from . import CommandError

    folder = check_output_dir(args.output_dir)
    claim_output_dir(
        folder, command="itune make-datastore", overwrite=args.overwrite,
        is_previous_output=lambda path: (path / ENTRIES_FILE).is_file(),
        inputs=[args.data, args.image_root, args.feature_cache],
    )  # fmt: skip
    rows = load_data_from_args(args)
    if not hasattr(rows, "column_names"):
        raise CommandError(f"--split is needed: {args.data} has several splits ({', '.join(rows)})")
    cache = FeatureCache(args.feature_cache)
    ids = [str(i) for i in rows["image_id"]]
    missing = [i for i in ids if i not in cache]
    if missing:
        raise CommandError(
            f"--feature-cache {args.feature_cache} holds no states of {len(missing)} of the {len(ids)} images of "
            f"{args.data} ({args.split}), e.g. {missing[0]!r}: run itune cache-features on this data into it first"
        )
    cache.check_rows(rows, f"{args.data} ({args.split})")
    groups = read_groups(args.data)
    tower = {"feature_cache": str(args.feature_cache), **cache.fingerprint, "data": str(args.data)}
    store = CaptionDatastore.from_cache(
        cache, ids, rows["captions"], [groups.get(i) for i in ids], tower=tower, k=args.k
    )
    store.save(folder)
    print(f"wrote a datastore of {len(store):,} images ({args.data}, {args.split}) to {folder}")
    return 0
