"""A picture of captions beside their images: trained captioners' captions, the nearest-neighbour retrieval
baseline's and the references, for images drawn at random (seeded) from one split, so that nothing is picked by hand.

    python tools/caption_sheet.py --model I-Tuning=RUN [--model "I-Tuning + retrieval"=RAG_RUN] \
        --data outputs/clipart/dataset.json --feature-cache CACHE --output docs/images/clipart-captions.png

Each captioner decodes as `itune eval` does (`--num-beams`; a model trained with retrieval prompts retrieves from its
own `datastore/`); retrieval reads the same feature cache (`itune_hf.vision.retrieval`). The sheet is a PNG drawn
with Pillow's own font (no other dependency).
"""

from __future__ import annotations

import argparse
import random
import textwrap
from pathlib import Path

THUMB = 112  # pixels of each image's side on the sheet
TEXT_WIDTH = 430  # pixels of the text column beside it
WRAP = 62  # characters per text line


def sample_rows(rows, count: int, seed: int):
    """`count` rows of `rows` drawn at random with `seed`, in split order."""
    chosen = sorted(random.Random(seed).sample(range(len(rows)), min(count, len(rows))))
    return rows.select(chosen)


def caption_lines(label: str, text: str) -> list[str]:
    """`label: text`, wrapped to the sheet's text column."""
    return textwrap.wrap(f"{label}: {text}", WRAP, subsequent_indent="   ") or [f"{label}:"]


def draw_sheet(entries: list[dict], title: str):
    """The sheet: one band per entry (`image`, then `lines` of text beside it), a title line on top."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=13)
    line_height, pad = 16, 8
    bands = [max(THUMB, line_height * len(entry["lines"])) + 2 * pad for entry in entries]
    heading = textwrap.wrap(title, WRAP + 14)
    top = 6 + line_height * len(heading) + pad
    sheet = Image.new("RGB", (THUMB + TEXT_WIDTH + 3 * pad, top + sum(bands)), "white")
    draw = ImageDraw.Draw(sheet)
    for index, line in enumerate(heading):
        draw.text((pad, 6 + index * line_height), line, fill="black", font=font)
    for entry, band in zip(entries, bands):
        image = entry["image"].convert("RGB")
        image.thumbnail((THUMB, THUMB))
        sheet.paste(image, (pad + (THUMB - image.width) // 2, top + pad + (THUMB - image.height) // 2))
        for index, line in enumerate(entry["lines"]):
            colour = "black" if not line.startswith(("reference", "   ")) else "dimgray"
            draw.text((THUMB + 2 * pad, top + pad + index * line_height), line, fill=colour, font=font)
        draw.line((pad, top + band - 1, sheet.width - pad, top + band - 1), fill="lightgray")
        top += band
    return sheet


def retrieval_prompts(model, directory: str, cache, rows) -> dict[str, str] | None:
    """The retrieval prompts of a model trained with them (its own datastore, `model_datastore`), else None."""
    from itune_hf.vision.datastore import DATASTORE_DIR, model_datastore

    store = model_datastore(model, None, Path(directory) / DATASTORE_DIR)
    return store.prompts(cache, list(rows["image_id"])) if store is not None else None


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, action="append", metavar="LABEL=DIR",
        help="A trained captioner (itune train's output) and its name on the sheet; repeat for several.",
    )  # fmt: skip
    parser.add_argument("--data", required=True, help="The dataset (a Karpathy-style dataset.json).")
    parser.add_argument("--feature-cache", required=True, help="The tower's cached states of every image.")
    parser.add_argument("--split", default="test")
    parser.add_argument("--num-images", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="Which images are drawn.")
    parser.add_argument("--num-beams", type=int, default=3)
    parser.add_argument("--output", required=True, help="The PNG to write.")
    args = parser.parse_args(argv)

    from itune_hf.data import load_captions, open_example_image
    from itune_hf.evaluation import generate_captions
    from itune_hf.models.loading import load_captioner
    from itune_hf.vision.feature_cache import FeatureCache
    from itune_hf.vision.retrieval import nearest_neighbour_captions

    splits = load_captions(args.data)
    rows = sample_rows(splits[args.split], args.num_images, args.seed)
    cache = FeatureCache(args.feature_cache)
    captioned = {}
    for named in args.model:
        label, _, directory = named.rpartition("=")
        model, processor = load_captioner(directory)
        captioned[label or directory] = generate_captions(
            model, processor, rows, num_beams=args.num_beams, max_new_tokens=25, feature_cache=cache,
            progress=False, prompts=retrieval_prompts(model, directory, cache, rows),
        )  # fmt: skip
    train = dict(zip(splits["train"]["image_id"], map(list, splits["train"]["captions"])))
    captioned["retrieval"] = nearest_neighbour_captions(cache, train, list(rows["image_id"]))
    entries = []
    for row in rows:
        lines = [line for label, c in captioned.items() for line in caption_lines(label, c.get(row["image_id"], "-"))]
        lines += caption_lines("reference", " | ".join(row["captions"]))
        entries.append({"image": open_example_image(row), "lines": lines})
    title = (
        f"{len(entries)} {args.split} images drawn at random (seed {args.seed}) from {Path(args.data).parent.name}; "
        f"{', '.join(label for label in captioned if label != 'retrieval')} ({args.num_beams} beams), "
        "nearest-neighbour retrieval, the references"
    )
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    draw_sheet(entries, title).save(output, optimize=True)
    print(f"wrote {output} ({output.stat().st_size:,} bytes)")
    return output


if __name__ == "__main__":
    main()
