"""Does a frozen vision tower see what the captions must say? A linear probe (logistic regression) of the colour and
the shape of a generated world's single-object images, from a preset's tower's mean-pooled hidden states (a third,
two thirds of the way up, the last two) and from the mean pixel, trained on train images and scored on test ones.

    python benchmarks/probe_tower.py WORLD/dataset.json --preset xgpt-lite0 --train 300 --test 100

Prints one line per attribute and layer: accuracy and the feature width. Needs scikit-learn.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sklearn.linear_model import LogisticRegression

from itune_hf.models._shared.backbones import as_vision_tokens
from itune_hf.presets import build_image_processor, get_preset


def pooled_states(vision, processor, root: Path, entries: list[dict]) -> dict:
    """Layer (or "pixels") -> (images, width) mean-pooled states."""
    found: dict = {}
    for start in range(0, len(entries), 25):
        images = []
        for entry in entries[start : start + 25]:
            with Image.open(root / entry["filepath"] / entry["filename"]) as image:
                images.append(image.convert("RGB"))
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            states = vision(pixel_values=pixels, output_hidden_states=True).hidden_states
        count = len(states)
        for layer in (count // 3, 2 * count // 3, count - 2, count - 1):  # a feature map's cells or a ViT's tokens
            pooled = as_vision_tokens(states[layer]).mean(dim=1)
            found.setdefault(f"{layer} of {count}", []).append(pooled.numpy())
        found.setdefault("pixels", []).append(pixels.mean((2, 3)).numpy())
    return {key: np.concatenate(parts) for key, parts in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--preset", default="xgpt-lite0")
    parser.add_argument("--train", type=int, default=300)
    parser.add_argument("--test", type=int, default=100)
    args = parser.parse_args()
    vision = get_preset(args.preset).vision.load(pretrained=True, vision=True).eval()
    processor = build_image_processor(args.preset)
    single = [e for e in json.loads(args.dataset.read_text())["images"] if len(e["objects"]) == 1]
    train = [e for e in single if e["split"] == "train"][: args.train]
    test = [e for e in single if e["split"] == "test"][: args.test]
    on_train = pooled_states(vision, processor, args.dataset.parent, train)
    on_test = pooled_states(vision, processor, args.dataset.parent, test)
    for attribute in ("color", "shape"):
        labels = [e["objects"][0][attribute] for e in train]
        truth = [e["objects"][0][attribute] for e in test]
        for key, features in on_train.items():
            probe = LogisticRegression(max_iter=2000).fit(features, labels)
            print(f"{attribute} {key}: accuracy {probe.score(on_test[key], truth):.3f} (width {features.shape[1]})")


if __name__ == "__main__":
    main()
