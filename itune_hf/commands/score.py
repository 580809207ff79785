"""`itune score PREDICTIONS.json REFERENCES.json`: coco-caption scores as one JSON object on stdout."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..metrics.registry import ALL_METRICS, describe_metrics

HELP = (
    f"Score captions like coco-caption ({', '.join(ALL_METRICS)}): predictions in COCO results format, references "
    "in COCO caption annotations format; prints one JSON object."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("predictions", metavar="PREDICTIONS.json", help='COCO results: [{"image_id", "caption"}].')
    parser.add_argument(
        "references", metavar="REFERENCES.json", help='COCO caption annotations: {"annotations": [...], "images": ...}.'
    )
    parser.add_argument(
        "--metrics",
        default=",".join(ALL_METRICS),
        help=f"Comma-separated metrics, any of {describe_metrics()} (default: all of them).",
    )
    parser.add_argument(
        "--idf-corpus",
        metavar="ANNOTATIONS.json",
        default=None,
        help="CIDEr-D document frequencies from these COCO caption annotations (e.g. the training set) instead of "
        "from REFERENCES.json.",
    )
    parser.add_argument("--per-image", metavar="PATH", default=None, help="Also write per-image scores (JSON) here.")


def _few(keys: list[Any], limit: int = 5) -> str:
    return ", ".join(repr(k) for k in keys[:limit]) + (", ..." if len(keys) > limit else "")


def run(args: argparse.Namespace) -> int:
    from ..data.coco_results import read_coco_references, read_coco_results
    from ..errors import check_output_file
    from ..metrics import score_captions_detailed
    from . import CommandError
    from ._options import metrics_argument

    metrics = metrics_argument(args.metrics)
    if args.per_image:
        check_output_file(args.per_image, "--per-image")  # before scoring, not after
    predictions = read_coco_results(args.predictions)
    references = read_coco_references(args.references)
    missing = [key for key in references if key not in predictions]
    extra = [key for key in predictions if key not in references]
    if missing or extra:
        parts = []
        if extra:
            parts.append(f"{len(extra)} predicted image id(s) not in {args.references}: {_few(extra)}")
        if missing:
            parts.append(f"{len(missing)} image id(s) of {args.references} without a prediction: {_few(missing)}")
        raise CommandError(f"image ids of {args.predictions} and {args.references} differ: " + "; ".join(parts))
    idf_corpus = read_coco_references(args.idf_corpus, "idf corpus") if args.idf_corpus else None
    result = score_captions_detailed(predictions, references, metrics=metrics, idf_corpus=idf_corpus)
    if args.per_image:
        rows = [{"image_id": key, **values} for key, values in result.per_image.items()]
        with open(args.per_image, "w", encoding="utf-8") as handle:
            json.dump(rows, handle)
    print(json.dumps(result.scores))
    return 0
