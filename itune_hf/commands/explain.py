"""`itune explain`: caption one image and draw, per generated word, where the I-Tuning modules attend."""

from __future__ import annotations

import argparse
import sys

HELP = "Caption an image and save a PNG with one attention heatmap per generated word (I-Tuning models)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("image", metavar="IMAGE", help="The image to caption.")
    parser.add_argument("--model", required=True, help="Directory or Hub id of a full or adapter-only checkpoint.")
    parser.add_argument("--output", required=True, help="Where to write the PNG (e.g. heat.png).")
    parser.add_argument("--num-beams", type=int, default=5, help="Beam size (5, the paper's; 1 = greedy).")
    parser.add_argument("--max-new-tokens", type=int, default=30, help="Longest caption, in tokens.")
    parser.add_argument(
        "--layer", type=int, default=None, help="Show only the module in this LM layer (default: all, averaged)."
    )
    parser.add_argument("--head", type=int, default=None, help="Show only this head (default: all, averaged).")
    parser.add_argument("--columns", type=int, default=4, help="Panels per row of the figure.")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import CommandError

    for name in ("num_beams", "max_new_tokens", "columns"):
        if getattr(args, name) < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    output = Path(args.output)
    if output.suffix.lower() != ".png":
        raise CommandError(f"--output {args.output}: the figure is written as PNG; give a path ending in .png")
    if not output.parent.is_dir():
        raise CommandError(f"--output {args.output}: the folder {output.parent} does not exist")

    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise CommandError("itune explain draws with matplotlib: pip install matplotlib (or 'itune-hf[app]')")
    from ..explain import explain_caption, save_explanation
    from ..models.ituning.images import ImageError, open_image
    from ..models.loading import load_captioner

    try:
        image = open_image(args.image)
    except ImageError as error:
        raise CommandError(str(error)) from error
    model, processor = load_captioner(args.model)
    try:
        explanation = explain_caption(
            model,
            processor,
            image,
            num_beams=args.num_beams,
            max_new_tokens=args.max_new_tokens,
            layer=args.layer,
            head=args.head,
        )
    except ValueError as error:
        raise CommandError(str(error)) from error
    save_explanation(image, explanation, output, columns=args.columns, image_processor=processor.image_processor)
    print(f"{args.image}\t{explanation.caption}")
    print(f"itune explain: wrote {output} ({len(explanation.tokens)} words)", file=sys.stderr)
    return 0
