"""`itune score PREDICTIONS.json REFERENCES.json`: coco-caption scores as one JSON object on stdout."""

from __future__ import annotations

import argparse
import json
import os
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


def _load_json(path: str, role: str) -> Any:
    from . import CommandError

    if not os.path.exists(path):
        raise CommandError(f"{path}: {role} file not found")
    if os.path.isdir(path):
        raise CommandError(f"{path}: {role} file is a directory")
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise CommandError(
            f"{path}: not valid JSON ({error.msg} at line {error.lineno} column {error.colno})"
        ) from None
    except UnicodeDecodeError as error:
        raise CommandError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def _describe(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _id_key(value: Any) -> Any:
    """Image ids as dictionary keys: JSON numbers and strings as they are (1 and 1.0 are the same id)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _check_id(path: str, where: str, value: Any) -> Any:
    from . import CommandError

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise CommandError(f'{path}: {where}: "image_id" must be a number or a string, got {_describe(value)}')
    return _id_key(value)


def read_predictions(path: str) -> dict[Any, str]:
    """Image id -> caption from a COCO results file, with errors naming the file, the entry and the field.

    Args:
        path: JSON file: a list of {"image_id": ..., "caption": ...} objects.
    """
    from . import CommandError

    data = _load_json(path, "predictions")
    if isinstance(data, dict) and "annotations" in data:
        raise CommandError(
            f'{path}: expected COCO results (a list of {{"image_id", "caption"}} objects), got an object with '
            '"annotations": is this the references file? Usage: itune score PREDICTIONS.json REFERENCES.json'
        )
    if not isinstance(data, list):
        raise CommandError(
            f'{path}: expected COCO results, a list of {{"image_id", "caption"}} objects; got {_describe(data)}'
        )
    predictions: dict[Any, str] = {}
    first_entry: dict[Any, int] = {}
    for index, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise CommandError(
                f'{path}: entry {index} must be an object {{"image_id", "caption"}}, got {_describe(entry)}'
            )
        for name in ("image_id", "caption"):
            if name not in entry:
                raise CommandError(f'{path}: entry {index} has no "{name}" field')
        key = _check_id(path, f"entry {index}", entry["image_id"])
        caption = entry["caption"]
        if not isinstance(caption, str):
            raise CommandError(f'{path}: entry {index}: "caption" must be a string, got {_describe(caption)}')
        if key in predictions:
            raise CommandError(
                f"{path}: duplicate prediction for image_id {entry['image_id']!r} (entries {first_entry[key]} and "
                f"{index}); give one caption per image"
            )
        predictions[key] = caption
        first_entry[key] = index
    if not predictions:
        raise CommandError(f"{path}: no predictions (the list is empty)")
    return predictions


def read_references(path: str, role: str = "references") -> dict[Any, list[str]]:
    """Image id -> reference captions from a COCO caption annotations file, in the order of its "images" list.

    Args:
        path: JSON file: {"annotations": [{"image_id": ..., "caption": ...}, ...], "images": [{"id": ...}, ...]}.
        role: What the file is, for error messages.
    """
    from . import CommandError

    data = _load_json(path, role)
    if isinstance(data, list):
        raise CommandError(
            f'{path}: expected COCO caption annotations, an object with an "annotations" list; got a list (is this a '
            "results file? Usage: itune score PREDICTIONS.json REFERENCES.json)"
        )
    if not isinstance(data, dict):
        raise CommandError(
            f'{path}: expected COCO caption annotations, an object with "annotations"; got {_describe(data)}'
        )
    if "annotations" not in data:
        raise CommandError(f'{path}: no "annotations" field (COCO caption annotations format)')
    annotations = data["annotations"]
    if not isinstance(annotations, list):
        raise CommandError(f'{path}: "annotations" must be a list, got {_describe(annotations)}')
    references: dict[Any, list[str]] = {}
    for index, entry in enumerate(annotations):
        if not isinstance(entry, dict):
            raise CommandError(f"{path}: annotations[{index}] must be an object, got {_describe(entry)}")
        for name in ("image_id", "caption"):
            if name not in entry:
                raise CommandError(f'{path}: annotations[{index}] has no "{name}" field')
        key = _check_id(path, f"annotations[{index}]", entry["image_id"])
        caption = entry["caption"]
        if not isinstance(caption, str):
            raise CommandError(f'{path}: annotations[{index}]: "caption" must be a string, got {_describe(caption)}')
        references.setdefault(key, []).append(caption)
    if not references:
        raise CommandError(f'{path}: no captions ("annotations" is empty)')
    images = data.get("images")
    if isinstance(images, list):  # coco-caption's image order (it matters only at caption boundaries)
        order = [_id_key(image.get("id")) for image in images if isinstance(image, dict)]
        ordered = {key: references[key] for key in dict.fromkeys(order) if key in references}
        ordered.update((key, refs) for key, refs in references.items() if key not in ordered)
        references = ordered
    return references


def _few(keys: list[Any], limit: int = 5) -> str:
    return ", ".join(repr(k) for k in keys[:limit]) + (", ..." if len(keys) > limit else "")


def run(args: argparse.Namespace) -> int:
    from ..metrics.scoring import normalize_metrics, score_captions_detailed
    from . import CommandError

    metrics = normalize_metrics([m for m in args.metrics.split(",") if m.strip()])
    predictions = read_predictions(args.predictions)
    references = read_references(args.references)
    missing = [key for key in references if key not in predictions]
    extra = [key for key in predictions if key not in references]
    if missing or extra:
        parts = []
        if extra:
            parts.append(f"{len(extra)} predicted image id(s) not in {args.references}: {_few(extra)}")
        if missing:
            parts.append(f"{len(missing)} image id(s) of {args.references} without a prediction: {_few(missing)}")
        raise CommandError(f"image ids of {args.predictions} and {args.references} differ: " + "; ".join(parts))
    idf_corpus = read_references(args.idf_corpus, "idf corpus") if args.idf_corpus else None
    result = score_captions_detailed(predictions, references, metrics=metrics, idf_corpus=idf_corpus)
    if args.per_image:
        rows = [{"image_id": key, **values} for key, values in result.per_image.items()]
        with open(args.per_image, "w", encoding="utf-8") as handle:
            json.dump(rows, handle)
    print(json.dumps(result.scores))
    return 0
