"""`itune make-photos`: write the tiny real test set (photos shipped in scikit-image, scikit-learn, matplotlib)."""

from __future__ import annotations

import argparse

HELP = (
    "Write the tiny real test set: the photos inside scikit-image, scikit-learn and matplotlib with five "
    "hand-written reference captions each, as a Karpathy dataset.json plus the image files."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._options import add_output_dir

    add_output_dir(parser, help="Directory to write (created).")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Write into a non-empty directory that is not a previous make-photos output "
        "(files of the same names are replaced, other files are kept).",
    )


def run(args: argparse.Namespace) -> int:
    import time
    import warnings

    from ..data.photos import PhotoSkippedWarning, make_photos
    from ..utils.output_dirs import check_output_dir
    from ._dataset_summary import print_summary

    check_output_dir(args.output_dir)
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PhotoSkippedWarning)
        dataset_json = make_photos(args.output_dir, overwrite=args.overwrite)
    for warning in caught:
        if issubclass(warning.category, PhotoSkippedWarning):
            print(f"note: {warning.message}")
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    print_summary(dataset_json, time.perf_counter() - started)
    return 0
