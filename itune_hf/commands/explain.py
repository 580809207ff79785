"""`itune explain`: caption one image and draw, per generated word, where the captioner attends (I-Tuning's modules
over the patch grid as heatmaps; XGPT's decoder over its regions as boxes)."""

from __future__ import annotations

import argparse
import sys

HELP = (
    "Caption an image and save a PNG with one attention map per generated word: a heatmap over the patch grid "
    "(I-Tuning) or the regions' boxes weighted by attention (XGPT)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._options import add_max_new_tokens, add_num_beams

    parser.add_argument("image", metavar="IMAGE", help="The image to caption.")
    parser.add_argument("--model", required=True, help="Directory or Hub id of a full or adapter-only checkpoint.")
    parser.add_argument("--output", required=True, help="Where to write the PNG (e.g. heat.png).")
    add_num_beams(parser)
    add_max_new_tokens(parser)
    parser.add_argument(
        "--layer",
        type=int,
        default=None,
        help="Show only this layer: an LM layer with an I-Tuning module, or an XGPT decoder layer (default: all, "
        "averaged).",
    )
    parser.add_argument("--head", type=int, default=None, help="Show only this head (default: all, averaged).")
    parser.add_argument("--columns", type=int, default=4, help="Panels per row of the figure.")
    parser.add_argument(
        "--boxes",
        default=None,
        metavar="JSON",
        help="XGPT models that pool in object boxes (visual_source boxes): the image's boxes as JSON, normalised "
        "[[x1, y1, x2, y2], ...], or a .json file holding that list.",
    )
    parser.add_argument(
        "--region-features",
        default=None,
        metavar="PATH",
        help="XGPT models over precomputed regions (visual_source regions): the .npz folder or .tsv file of region "
        "features and boxes (as itune train/eval take it).",
    )
    parser.add_argument(
        "--image-id",
        default=None,
        help="With --region-features: the image's id there (default: the image file's name without its suffix).",
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import CommandError

    for name in ("num_beams", "max_new_tokens", "columns"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    from ._models import check_model_argument

    check_model_argument(args.model)
    output = Path(args.output)
    if output.suffix.lower() != ".png":
        raise CommandError(f"--output {args.output}: the figure is written as PNG; give a path ending in .png")
    if not output.parent.is_dir():
        raise CommandError(f"--output {args.output}: the folder {output.parent} does not exist")
    if args.image_id is not None and args.region_features is None:
        raise CommandError("--image-id names the image in --region-features: pass --region-features PATH too")
    boxes = _boxes(args.boxes) if args.boxes is not None else None

    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise CommandError("itune explain draws with matplotlib: pip install matplotlib (or 'itune-hf[app]')")
    from ..explain import explain_caption, save_explanation
    from ..models._shared.images import ImageError, open_image
    from ._models import load_model_argument, refuse_retrieval_model

    try:
        image = open_image(args.image)
    except ImageError as error:
        raise CommandError(str(error)) from error
    regions = _regions(args) if args.region_features is not None else None
    refuse_retrieval_model(args.model, "itune explain")
    model, processor = load_model_argument(args.model)
    try:
        explanation = explain_caption(
            model,
            processor,
            image,
            num_beams=args.num_beams,
            max_new_tokens=args.max_new_tokens,
            layer=args.layer,
            head=args.head,
            boxes=boxes,
            regions=regions,
        )
    except ValueError as error:
        raise CommandError(str(error).replace("itune explain --", "--")) from error
    save_explanation(image, explanation, output, columns=args.columns, image_processor=processor.image_processor)
    print(f"{args.image}\t{explanation.caption}")
    if explanation.note:
        print(f"itune explain: note: {explanation.note}", file=sys.stderr)
    print(f"itune explain: wrote {output} ({len(explanation.tokens)} words)", file=sys.stderr)
    return 0


def _boxes(value: str) -> list[list[float]]:
    """`--boxes`: a JSON list of normalised `[x1, y1, x2, y2]`, given inline or as a .json file."""
    import json
    from pathlib import Path

    from . import CommandError

    path = Path(value)
    text = path.read_text() if value.lower().endswith(".json") and path.is_file() else value
    try:
        boxes = json.loads(text)
    except json.JSONDecodeError as error:
        raise CommandError(f"--boxes {value}: not JSON ({error.msg}); give [[x1, y1, x2, y2], ...]") from error
    ok = isinstance(boxes, list) and boxes and all(isinstance(box, list) and len(box) == 4 for box in boxes)
    if not ok or not all(isinstance(v, (int, float)) and 0 <= v <= 1 for box in boxes for v in box):
        raise CommandError(f"--boxes {value}: expected a non-empty list of [x1, y1, x2, y2] numbers in [0, 1]")
    return [[float(v) for v in box] for box in boxes]


def _regions(args: argparse.Namespace) -> dict:
    """`--region-features` / `--image-id`: the image's precomputed regions."""
    from pathlib import Path

    from ..data.regions import RegionFeatures
    from . import CommandError

    regions = RegionFeatures(args.region_features)
    image_id = args.image_id if args.image_id is not None else Path(args.image).stem
    if image_id not in regions:
        raise CommandError(
            f"--region-features {args.region_features} has no regions for image id {image_id!r}"
            + ("" if args.image_id is not None else f" (the name of {args.image}); give it with --image-id")
        )
    return regions.get([image_id])
