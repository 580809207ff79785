"""Averaging training checkpoints (XGPT section 5.4: stage 2 and fine-tuning start from the average of the top-4
pre-training checkpoints): `itune average-checkpoints`.

A run's checkpoints (`<run>/checkpoints/step-NNNNNNN/model.safetensors`) hold its trainable weights; the run
directory holds the whole model (`model.safetensors`, config, processor). The average of the chosen checkpoints'
weights replaces those weights in a copy of the run's model, so the result is a model directory like the run's:
`itune train --init-model` starts from it, `itune eval` scores it.

"Top" checkpoints are ranked by the validation CIDEr of their step, read from every evaluation the run recorded (the
histories of its checkpoints' `progress.json` and of `train_summary.json`), so a step's score is known even once its
checkpoint is removed; a run keeps its best checkpoints on disk (`--keep-checkpoints`, see `checkpoints_to_keep`).
Checkpoints without a score rank after those with one, newest first, and averaging one of them warns, naming it: a run
without validation averages its newest checkpoints, and says so. A better-scored step whose checkpoint is not on
disk is named too.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

from .checkpoints import checkpoint_step, rank_checkpoints, validation_scores

WEIGHTS = "model.safetensors"


def _history(path: Path) -> list[dict[str, Any]]:
    try:
        history = json.loads(path.read_text()).get("history", []) if path.is_file() else []
    except (OSError, ValueError, AttributeError):  # a damaged file: its scores are in the other histories
        return []
    return history if isinstance(history, list) else []


def run_scores(run_dir: Path) -> dict[int, float]:
    """The validation CIDEr of every step the run validated (checkpoint kept or not), by step."""
    paths = [*sorted((run_dir / "checkpoints").glob("step-*/progress.json")), run_dir / "train_summary.json"]
    scores: dict[int, float] = {}
    for path in paths:
        scores.update(validation_scores(_history(path)))
    return scores


def _complete_checkpoints(run_dir: Path) -> list[Path]:
    return sorted(p for p in (run_dir / "checkpoints").glob("step-*") if p.is_dir() and not p.suffix)


def checkpoint_scores(run_dir: Path) -> dict[Path, float | None]:
    """Each complete checkpoint of a run and the validation CIDEr logged at its step (None without one)."""
    scores = run_scores(run_dir)
    return {c: scores.get(checkpoint_step(c)) for c in _complete_checkpoints(run_dir)}


def choose_checkpoints(run_dir: Path, top: int) -> list[Path]:
    """The `top` checkpoints to average: best validation CIDEr first, then the newest.

    Raises:
        FileNotFoundError: the run has no checkpoint.
    """
    checkpoints = _complete_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(
            f"{run_dir / 'checkpoints'}: no checkpoint to average (is {run_dir} an itune train run?)"
        )
    return rank_checkpoints(checkpoints, run_scores(run_dir))[:top]


def ranking_warnings(run_dir: Path, chosen: list[Path]) -> list[str]:
    """What the choice of `chosen` did not rank by validation: the checkpoints averaged without a score, and the
    steps that scored better than one averaged but whose checkpoint is not on disk."""
    scores, notes = run_scores(run_dir), []
    unscored = [c.name for c in chosen if checkpoint_step(c) not in scores]
    if unscored and len(unscored) == len(chosen):
        notes.append(
            f"{run_dir} logged no validation score for its checkpoints: averaging the newest {len(chosen)} "
            f"({', '.join(unscored)}), not the best (train with an --eval-split validated at the --save-every steps "
            "to rank them)"
        )
    elif unscored:
        notes.append(
            f"{', '.join(unscored)} had no validation score at its step: averaged as the newest of the unscored "
            "checkpoints, after the scored ones"
        )
    floor = min((scores[checkpoint_step(c)] for c in chosen if checkpoint_step(c) in scores), default=None)
    on_disk = {checkpoint_step(c) for c in _complete_checkpoints(run_dir)}
    # a scored step outranks every unscored checkpoint, and a scored one below its score
    lost = sorted(step for step, score in scores.items() if step not in on_disk and (unscored or score > floor))
    if lost:
        notes.append(
            f"step(s) {', '.join(map(str, lost))} scored better on validation than a checkpoint averaged but have no "
            "checkpoint on disk (not saved at that step, or removed: raise --keep-checkpoints)"
        )
    return notes


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
        `{"checkpoints": [...], "scores": [...], "weights": count, "warnings": [...]}` (also written as
        `averaged_from.json`; `warnings`: what was not ranked by validation, see `ranking_warnings`, also warned).

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
    notes = ranking_warnings(run_dir, chosen)
    for note in notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    report = {
        "checkpoints": [c.name for c in chosen], "scores": [scores[c] for c in chosen], "weights": len(averaged),
        "warnings": notes,
    }  # fmt: skip
    (output_dir / "averaged_from.json").write_text(json.dumps(report, indent=2))
    return report


__all__ = [
    "average_checkpoints", "average_state", "checkpoint_scores", "choose_checkpoints", "ranking_warnings", "run_scores",
]  # fmt: skip
