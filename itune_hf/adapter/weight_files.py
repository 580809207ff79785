"""Which files of a checkpoint folder hold a whole model's weights: what both the adapter config (which rewrites only
a reference `config.json`) and the conversions (`convert`) ask of a folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

#: The key of a `model.safetensors.index.json`'s metadata that marks it as listing an adapter checkpoint's trainable
#: weights only (`AdapterCheckpoints` writes one so that `Trainer` can resume a native model): not a full model.
TRAINABLE_ONLY_MARK = "itune_hf_trainable_only"
FULL_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def is_trainable_only_index(path: str | os.PathLike | None) -> bool:
    """Whether `path` is a weight index that lists only trainable weights (see `TRAINABLE_ONLY_MARK`).

    Args:
        path: A file, or None.
    """
    if path is None or Path(path).name != "model.safetensors.index.json" or not Path(path).is_file():
        return False
    try:
        index = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(index, dict) and bool((index.get("metadata") or {}).get(TRAINABLE_ONLY_MARK))


def folder_holds_full_weights(folder: str | os.PathLike) -> bool:
    """Whether a local folder holds a full model's weights (a trainable-only index does not count).

    Args:
        folder: The folder.
    """
    found = [Path(folder) / name for name in FULL_WEIGHT_FILES if (Path(folder) / name).is_file()]
    return any(not is_trainable_only_index(path) for path in found)


__all__ = ["FULL_WEIGHT_FILES", "TRAINABLE_ONLY_MARK", "folder_holds_full_weights", "is_trainable_only_index"]
