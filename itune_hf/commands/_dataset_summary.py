"""What the dataset-writing commands print: where the dataset is, images per split, and how to use it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


def print_summary(dataset_json: Path, seconds: float) -> None:
    """Print the dataset location, the number of images per split, and the `--data/--image-root` to pass."""
    data = json.loads(Path(dataset_json).read_text(encoding="utf-8"))
    counts = Counter(entry["split"] for entry in data["images"])
    per_split = ", ".join(f"{split} {counts[split]:,}" for split in ("train", "val", "test") if counts[split])
    root = Path(dataset_json).parent
    print(f"wrote {dataset_json} ({len(data['images']):,} images in {seconds:.1f}s)")
    print(f"images per split: {per_split}")
    print(f"use it with: --data {dataset_json} --image-root {root}")
