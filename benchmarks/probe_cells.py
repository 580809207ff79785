"""Where does a frozen vision tower keep an object's colour? A linear probe (logistic regression) of each object's
colour and shape in a generated world, from the grid cell under the object's centre, layer-normalised as XGPT's
region embedding reads it, using only the cell's top-k principal components (fitted on all cells of the probed
images): an attribute that the top components carry is one a captioner finds early; one that needs them all sits
in low-variance directions.

    python benchmarks/probe_cells.py WORLD/dataset.json --preset xgpt-lite0 --train 600 --test 200 \
        --output benchmarks/records/probe-cells.json

Probes every hidden state of the tower (each area-pooled to the last state's grid) and the tower's output as the
captioners read it (`last_hidden_state`: with `feature_taps`, the head's cells and the tapped layers'). Prints one
line per layer and writes the accuracies to `--output`. Needs scikit-learn.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import _common as common
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression

from itune_hf.models._shared.backbones import as_vision_tokens
from itune_hf.presets import build_image_processor, get_preset

COMPONENTS = (8, 32, None)  # None: every feature


def cell_states(vision, processor, root: Path, entries: list[dict]) -> tuple[dict[str, torch.Tensor], list]:
    """Layer name -> `(images, cells, width)` layer-normalised states on the output's grid, and each image's size."""
    found: dict[str, list] = {}
    sizes = []
    for start in range(0, len(entries), 50):
        images = []
        for entry in entries[start : start + 50]:
            with Image.open(root / entry["filepath"] / entry["filename"]) as image:
                images.append(image.convert("RGB"))
                sizes.append(image.size)
        with torch.no_grad():
            out = vision(pixel_values=processor(images=images, return_tensors="pt")["pixel_values"],
                         output_hidden_states=True)  # fmt: skip
        grid = out.last_hidden_state.shape[-2:]
        for index, states in enumerate(out.hidden_states):
            found.setdefault(f"hidden_states[{index}]", []).append(
                as_vision_tokens(F.adaptive_avg_pool2d(states, grid))
            )
        found.setdefault("output", []).append(as_vision_tokens(out.last_hidden_state))
    return {name: F.layer_norm(torch.cat(parts), (parts[0].shape[-1],)) for name, parts in found.items()}, sizes


def object_cells(
    entries: list[dict], sizes: list[tuple[int, int]], grid: int, first: int = 0
) -> tuple[list[tuple[int, int]], dict[str, list[str]]]:
    """(image index, cell index) under each object's box centre, and the objects' colours and shapes. The boxes map to
    the grid by the image's size: right for a generated world's square images (a centre crop would cut others).
    Image indices count from `first`."""
    cells, labels = [], {"color": [], "shape": []}
    for index, (entry, (width, height)) in enumerate(zip(entries, sizes), start=first):
        for item in entry["objects"]:
            x0, y0, x1, y1 = item["bbox"]
            row = min(grid - 1, int((y0 + y1) / 2 / height * grid))
            col = min(grid - 1, int((x0 + x1) / 2 / width * grid))
            cells.append((index, row * grid + col))
            for attribute in labels:
                labels[attribute].append(item[attribute])
    return cells, labels


def probe(states: torch.Tensor, train: list, test: list, labels: dict, truth: dict, components: int | None) -> dict:
    """Test accuracy per attribute from the top `components` principal components of the cells."""
    rows = lambda picked: np.stack([states[i, c].float().numpy() for i, c in picked])  # noqa: E731
    x_train, x_test = rows(train), rows(test)
    if components is not None:
        pca = PCA(components, random_state=0).fit(states.flatten(0, 1).float().numpy()[::7])
        x_train, x_test = pca.transform(x_train), pca.transform(x_test)
    return {
        attribute: round(
            LogisticRegression(max_iter=3000).fit(x_train, labels[attribute]).score(x_test, truth[attribute]), 3
        )
        for attribute in labels
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--preset", default="xgpt-lite0")
    parser.add_argument("--train", type=int, default=600, help="Training images (of the train split).")
    parser.add_argument("--test", type=int, default=200, help="Test images (of the test split).")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    vision = get_preset(args.preset).vision.load(pretrained=True, vision=True).eval()
    images = json.loads(args.dataset.read_text())["images"]
    on_train = [e for e in images if e["split"] == "train"][: args.train]
    picked = on_train + [e for e in images if e["split"] == "test"][: args.test]
    states, sizes = cell_states(vision, build_image_processor(args.preset), args.dataset.parent, picked)
    grid = int(round(states["output"].shape[1] ** 0.5))
    count = len(on_train)  # the split may hold fewer than --train
    train, labels = object_cells(picked[:count], sizes[:count], grid)
    test, truth = object_cells(picked[count:], sizes[count:], grid, first=count)
    layers = {}
    for name, layer in states.items():
        layers[name] = {"width": layer.shape[-1]}
        for components in COMPONENTS:
            if components is None or components < layer.shape[-1]:
                layers[name][f"top {components or 'all'}"] = probe(layer, train, test, labels, truth, components)
        print(name, json.dumps(layers[name]))
    if args.output:
        record = {
            "what": "logistic probes of each object's colour and shape from the cell under its centre "
            "(layer-normalised), from the top-k principal components of the cells",
            "machine": common.machine(torch.device("cpu")),
            "command": f"python benchmarks/probe_cells.py {args.dataset} --preset {args.preset} --train {args.train} "
            f"--test {args.test}",
            "preset": args.preset, "objects": {"train": len(train), "test": len(test)}, "layers": layers,
        }  # fmt: skip
        args.output.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
