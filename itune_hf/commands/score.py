"""`itune score PREDICTIONS.json REFERENCES.json`: coco-caption scores as one JSON object on stdout.

`--dataset DATASET.json` (a generated world's, or an `itune make-clipart` corpus's) adds the scene metric that reads
what it records (`Objects` for a world's scenes, `ContentWords` for a corpus's content words; both, each saying why
it is unavailable, for a file that records neither), and stands for REFERENCES when that is left out: the captions
of its `--split`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..metrics.registry import ALL_METRICS, SCENE_METRICS, describe_metrics
from ..utils.files import without_nan
from ..utils.text import few

HELP = (
    f"Score captions like coco-caption ({', '.join(ALL_METRICS)}): predictions in COCO results format, references "
    f"in COCO caption annotations format; with --dataset (a generated world, a clip-art corpus) or --instances (COCO "
    f"instance annotations), also {', '.join(SCENE_METRICS)} against what they record of each image (scenes, content "
    "words, objects); prints one JSON object."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("predictions", metavar="PREDICTIONS.json", help='COCO results: [{"image_id", "caption"}].')
    parser.add_argument(
        "references",
        metavar="REFERENCES.json",
        nargs="?",
        default=None,
        help='COCO caption annotations: {"annotations": [...], "images": ...}; optional with --dataset.',
    )
    parser.add_argument(
        "--dataset",
        metavar="DATASET.json",
        default=None,
        help="A generated world's dataset.json (itune make-synthetic) or a clip-art corpus's (itune make-clipart): "
        f"each image's recorded scene or content words, for {' or '.join(SCENE_METRICS)}; without REFERENCES.json, "
        "the references are its --split's captions.",
    )
    parser.add_argument(
        "--instances",
        action="append",
        default=None,
        metavar="INSTANCES.json",
        help="COCO instance annotations of the predicted images (e.g. instances_val2014.json), for CHAIR (object "
        "hallucination); repeat it for several files. Default: the instances_<name>.json beside a "
        "captions_<name>.json REFERENCES.json, if any.",
    )
    parser.add_argument(
        "--split",
        default=None,
        help="The --dataset split the predictions caption, when its captions are the references (default test).",
    )
    parser.add_argument(
        "--metrics",
        default=None,
        help=f"Comma-separated metrics, any of {describe_metrics()} (default: {', '.join(ALL_METRICS)}, and "
        f"those of {', '.join(SCENE_METRICS)} that read what --dataset or --instances record).",
    )
    parser.add_argument(
        "--idf-corpus",
        metavar="ANNOTATIONS.json",
        default=None,
        help="CIDEr-D document frequencies from these COCO caption annotations (e.g. the training set) instead of "
        "from REFERENCES.json.",
    )
    parser.add_argument("--per-image", metavar="PATH", default=None, help="Also write per-image scores (JSON) here.")
    parser.add_argument(
        "--require-all",
        action="store_true",
        help="Refuse references without a prediction. By default the predicted images are scored, as "
        "pycocoevalcap does (e.g. 5,000 Karpathy-test captions against captions_val2014.json), and stderr says how "
        "many reference images went unused.",
    )


def run(args: argparse.Namespace) -> int:
    from ..data.coco_results import read_coco_references, read_coco_results
    from ..metrics import scene_metrics_for, score_captions_detailed
    from ..utils.output_dirs import check_output_file
    from . import CommandError
    from ._options import metrics_argument

    if args.references is None and args.dataset is None:
        raise CommandError("give REFERENCES.json, or --dataset DATASET.json to score against its captions")
    if args.split is not None and args.references is not None:
        raise CommandError(f"--split {args.split} picks the --dataset split whose captions are the references; "
                           "REFERENCES.json is given instead: drop --split")  # fmt: skip
    args.split = args.split or "test"
    metrics = metrics_argument(args.metrics) if args.metrics else None  # a typo fails before any reading
    if args.idf_corpus and metrics is not None and "CIDEr" not in metrics:
        raise CommandError(f"--idf-corpus {args.idf_corpus} gives CIDEr-D its document frequencies, and --metrics "
                           f"{args.metrics} leaves CIDEr out: drop --idf-corpus or add CIDEr")  # fmt: skip
    if args.per_image:
        check_output_file(args.per_image, "--per-image")  # before scoring, not after
    predictions = read_coco_results(args.predictions)
    if args.dataset:  # a dataset's ids are strings; COCO results give COCO's as numbers (`"image_id": 391895`)
        predictions = _ids_as_text(args, predictions)
    references = read_coco_references(args.references) if args.references else _dataset_references(args)
    args.references = args.references or f"{args.dataset} ({args.split} split)"  # how messages name them
    references = _predicted_references(args, predictions, references)
    idf_corpus = read_coco_references(args.idf_corpus, "idf corpus") if args.idf_corpus else None
    scenes = _scenes(args, references)
    if metrics is None:  # the scene metrics that read the records; with --dataset, all of them where it records none
        scene_metrics = scene_metrics_for(scenes) or (SCENE_METRICS if args.dataset else ())
        metrics = metrics_argument(",".join(ALL_METRICS + scene_metrics))
    result = score_captions_detailed(predictions, references, metrics=metrics, idf_corpus=idf_corpus, scenes=scenes)
    if args.per_image:
        rows = [{"image_id": key, **values} for key, values in result.per_image.items()]
        with open(args.per_image, "w", encoding="utf-8") as handle:
            json.dump(without_nan(rows), handle)
    print(json.dumps(without_nan(result.scores)))  # a metric with no value (NaN) prints as null
    return 0


def _predicted_references(args: argparse.Namespace, predictions: dict, references: dict) -> dict:
    """The references of the predicted images; refused when a prediction has none (or, with `--require-all`, when
    a reference has no prediction). Unused references are counted on stderr."""
    import sys

    from . import CommandError

    missing = [key for key in references if key not in predictions]
    extra = [key for key in predictions if key not in references]
    if extra or (missing and args.require_all):
        parts = []
        if extra:
            parts.append(f"{len(extra)} predicted image id(s) not in {args.references}: {few(extra)}")
        if missing:
            parts.append(f"{len(missing)} image id(s) of {args.references} without a prediction: {few(missing)}")
        raise CommandError(f"image ids of {args.predictions} and {args.references} differ: " + "; ".join(parts))
    if missing:
        print(f"itune score: scoring the {len(predictions)} predicted images; {len(missing)} of the "
              f"{len(references)} images of {args.references} have no prediction and are not used (--require-all "
              "refuses this)", file=sys.stderr)  # fmt: skip
    return {key: captions for key, captions in references.items() if key in predictions}


def _ids_as_text(args: argparse.Namespace, predictions: dict) -> dict:
    """`predictions` keyed by the text of their ids, as a dataset's are; two ids of one text (`1` and `"1"`) are
    refused."""
    from . import CommandError

    keyed: dict[str, Any] = {}
    for key, caption in predictions.items():
        text = str(key)
        if text in keyed:
            raise CommandError(f"{args.predictions}: image ids {text!r} and {text} are both given; keep one")
        keyed[text] = caption
    return keyed


def _dataset_references(args: argparse.Namespace) -> dict[str, list[str]]:
    """Image id -> captions of `--dataset`'s `--split`."""
    from ..data import load_captions

    # captions only: no image is read, and a missing one keeps its references
    rows = load_captions(args.dataset, split=args.split, allow_outside_root=True, on_missing="keep")
    return {image_id: list(captions) for image_id, captions in zip(rows["image_id"], rows["captions"])}


def _scenes(args: argparse.Namespace, references: dict) -> dict | None:
    """Image id (as the references spell it) -> what `--dataset` records of it (scene, content words) or `--instances`
    (or the instances file beside REFERENCES.json) annotates, for the images that have a record; None: no records."""
    from ..data.scenes import read_instance_objects, scenes_of_data

    recorded = scenes_of_data(args.dataset) if args.dataset else {}  # a built-in name, a folder or its dataset.json
    if args.instances:
        recorded = {**read_instance_objects(args.instances), **recorded}
    elif args.references and not args.dataset:
        recorded = scenes_of_data(args.references, find_instances=True)  # instances_X.json beside captions_X.json
    if not recorded and not args.dataset:
        return None
    return {key: recorded[str(key)] for key in references if str(key) in recorded}
