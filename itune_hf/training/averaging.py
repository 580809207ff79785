"""Averaging training checkpoints (XGPT section 5.4: stage 2 and fine-tuning start from the average of the top-4
pre-training checkpoints): `itune average-checkpoints`.

A run's checkpoints (`<run>/checkpoints/step-NNNNNNN/model.safetensors`) hold its trainable weights; the run
directory holds the whole model (`model.safetensors`, config, processor). The average of the chosen checkpoints'
weights replaces those weights in a copy of the run's model, so the result is a model directory like the run's:
`itune train --init-model` starts from it, `itune eval` scores it.

"Top" checkpoints are ranked by the validation CIDEr the run logged at their step (`progress.json`'s history);
checkpoints without one rank after those with one, newest first (a run without validation averages its newest).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

WEIGHTS = "model.safetensors"


def checkpoint_scores(run_dir: Path) -> dict[Path, float | None]:
    """Each complete checkpoint of a run and the validation CIDEr logged at its step (None without one)."""
    checkpoints = sorted(p for p in (run_dir / "checkpoints").glob("step-*") if p.is_dir() and not p.suffix)
    scores: dict[int, float] = {}
    for checkpoint in checkpoints:
        progress = checkpoint / "progress.json"
        history = json.loads(progress.read_text()).get("history", []) if progress.is_file() else []
        for entry in history:
            if isinstance(entry.get("val"), dict) and "CIDEr" in entry["val"]:
                scores[entry["step"]] = entry["val"]["CIDEr"]
    return {c: scores.get(int(c.name.removeprefix("step-"))) for c in checkpoints}


def choose_checkpoints(run_dir: Path, top: int) -> list[Path]:
    """The `top` checkpoints to average: best validation CIDEr first, then the newest.

    Raises:
        FileNotFoundError: the run has no checkpoint.
    """
    scores = checkpoint_scores(run_dir)
    if not scores:
        raise FileNotFoundError(
            f"{run_dir / 'checkpoints'}: no checkpoint to average (is {run_dir} an itune train run?)"
        )
    ranked = sorted(scores, key=lambda c: (scores[c] is not None, scores[c] or 0.0, c.name), reverse=True)
    return ranked[:top]


def average_state(checkpoints: list[Path]) -> dict[str, Any]:
    """The element-wise mean (in float32, cast back) of the checkpoints' weights.

    Raises:
        ValueError: the checkpoints hold different weights (another run's, or another model's).
    """
    from safetensors.torch import load_file

    total: dict[str, Any] = {}
    first_keys = None
    for checkpoint in checkpoints:
        state = load_file(checkpoint / WEIGHTS)
        if first_keys is None:
            first_keys, dtypes = set(state), {k: v.dtype for k, v in state.items()}
        elif set(state) != first_keys:
            raise ValueError(f"{checkpoint} holds other weights than {checkpoints[0]}: average checkpoints of one run")
        for key, value in state.items():
            total[key] = total[key] + value.float() if key in total else value.float()
    return {key: (value / len(checkpoints)).to(dtypes[key]) for key, value in total.items()}


def average_checkpoints(run_dir: str | Path, output_dir: str | Path, top: int = 4) -> dict[str, Any]:
    """Write the run's model with its trainable weights replaced by the average of its `top` best checkpoints.

    Args:
        run_dir: An `itune train` output directory (full-checkpoint families: XGPT).
        output_dir: Where the averaged model goes (a copy of the run's model files).
        top: How many checkpoints to average (the paper: 4); fewer when the run kept fewer.

    Returns:
        `{"checkpoints": [...], "scores": [...], "weights": count}` (also written as `averaged_from.json`).

    Raises:
        FileNotFoundError: no run, model or checkpoint there.
        ValueError: `top` below 1, or checkpoints that do not fit the run's model.
    """
    from safetensors.torch import load_file, save_file

    run_dir, output_dir = Path(run_dir), Path(output_dir)
    if top < 1:
        raise ValueError(f"--top must be at least 1, got {top}")
    if not (run_dir / WEIGHTS).is_file():
        raise FileNotFoundError(
            f"{run_dir / WEIGHTS}: not found; average-checkpoints reads an XGPT itune train run (a full model and its "
            "checkpoints/); I-Tuning runs save adapters"
        )
    chosen = choose_checkpoints(run_dir, top)
    averaged = average_state(chosen)
    model = load_file(run_dir / WEIGHTS)
    outside = sorted(k for k in averaged if k not in model and not k.startswith("lm_head."))  # lm_head: tied
    if outside:
        raise ValueError(f"{chosen[0]} holds weights the model in {run_dir} lacks ({outside[:3]}): another model's")
    model.update({k: v for k, v in averaged.items() if k in model})
    if output_dir.resolve() != run_dir.resolve():
        output_dir.mkdir(parents=True, exist_ok=True)
        for item in run_dir.iterdir():
            if item.is_file() and item.name != WEIGHTS:
                shutil.copy2(item, output_dir / item.name)
    save_file({k: v.contiguous() for k, v in model.items()}, str(output_dir / WEIGHTS), metadata={"format": "pt"})
    scores = checkpoint_scores(run_dir)
    report = {"checkpoints": [c.name for c in chosen], "scores": [scores[c] for c in chosen], "weights": len(averaged)}
    (output_dir / "averaged_from.json").write_text(json.dumps(report, indent=2))
    return report


__all__ = ["average_checkpoints", "average_state", "checkpoint_scores", "choose_checkpoints"]
