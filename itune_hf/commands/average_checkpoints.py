"""`itune average-checkpoints`: the average of a run's top checkpoints as a model (XGPT's stage 2 starts from it)."""

from __future__ import annotations

import argparse
import sys
import warnings

HELP = (
    "Average the weights of a run's best checkpoints (by the validation CIDEr logged at their step; without one, the "
    "newest, with a warning naming them) "
    "into a copy of its model: XGPT's in-domain stage and fine-tuning start from the top-4 average "
    "(itune train --init-model DIR)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="An itune train output directory (with checkpoints/).")
    # --output-dir alone, without the hidden --output alias of add_output_dir
    parser.add_argument("--output-dir", required=True, metavar="DIR", help="Where the averaged model goes.")
    from ._options import positive_int

    parser.add_argument(
        "--top",
        type=positive_int,
        default=4,
        metavar="K",
        help="Checkpoints to average (default: 4). A run with fewer sound checkpoints averages those it has and "
        "warns, naming how many.",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Write into a directory holding other files (another model's, a README): they are removed, and named.",
    )


def run(args: argparse.Namespace) -> int:
    from ..training.averaging import average_checkpoints
    from . import CommandError

    try:
        with warnings.catch_warnings():  # the report's warnings are printed below, as one line each
            warnings.simplefilter("ignore", UserWarning)
            report = average_checkpoints(args.run_dir, args.output_dir, top=args.top, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError) as error:
        raise CommandError(str(error)) from None
    for note in report["warnings"]:
        print(f"warning: {note}", file=sys.stderr)
    print(
        f"averaged {len(report['checkpoints'])} checkpoints ({', '.join(report['checkpoints'])}) into {args.output_dir}"
    )
    return 0
