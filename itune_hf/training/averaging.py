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

from ..utils.files import atomic_path, atomic_write_json
from ..utils.numbers import check_finite
from ..utils.output_dirs import OutputLock, claim_output_dir
from .checkpoints import CheckpointError, checkpoint_problems, checkpoint_step, rank_checkpoints, validation_scores

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
    """The `top` checkpoints to average: best validation CIDEr first, then the newest; a checkpoint whose files do
    not match its `manifest.json` (damaged, cut short) is passed over, as `--resume` passes over it, with a warning.

    Raises:
        FileNotFoundError: the run has no checkpoint.
        CheckpointError: no checkpoint of the run is sound (each one's problems named).
    """
    checkpoints = _complete_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(
            f"{run_dir / 'checkpoints'}: no checkpoint to average (is {run_dir} an itune train run?)"
        )
    chosen, damaged = [], []
    for checkpoint in rank_checkpoints(checkpoints, run_scores(run_dir)):
        if len(chosen) == top:
            break
        problems = checkpoint_problems(checkpoint)
        if problems:
            damaged.append(f"{checkpoint.name}: {'; '.join(problems)}")
        else:
            chosen.append(checkpoint)
    if not chosen:
        raise CheckpointError(
            f"{run_dir / 'checkpoints'}: no checkpoint is sound ({'; '.join(damaged)}); nothing to average"
        )
    for problem in damaged:
        warnings.warn(f"checkpoint {problem}: left out of the average", UserWarning, stacklevel=2)
    return chosen


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
        check_finite(state, str(checkpoint / WEIGHTS), "the run diverged before this step: average other checkpoints")
        if first_keys is None:
            first_keys, dtypes = set(state), {k: v.dtype for k, v in state.items()}
            shapes = {k: tuple(v.shape) for k, v in state.items()}
        elif set(state) != first_keys:
            raise ValueError(f"{checkpoint} holds other weights than {checkpoints[0]}: average checkpoints of one run")
        for key in sorted(k for k, v in state.items() if tuple(v.shape) != shapes[k])[:1]:
            raise ValueError(
                f"{checkpoint}: weight {key} has shape {tuple(state[key].shape)}, {shapes[key]} in {checkpoints[0]}: "
                "another model's; average checkpoints of one run"
            )
        for key, value in state.items():
            total[key] = total[key] + value.float() if key in total else value.float()
    return {key: (value / len(checkpoints)).to(dtypes[key]) for key, value in total.items()}


REPORT = "averaged_from.json"  # written last: a directory holding it is a finished average


def _average_run(run_dir: Path, top: int) -> tuple[list[Path], dict, list[str], dict]:
    """The chosen checkpoints, the run's model with their average in place, the warnings of the choice, and the
    averaged weights. The run's own lock is held while its checkpoints are chosen and read: a training run still
    going (which rotates checkpoints) is refused, naming it, instead of one listing being averaged from another."""
    from safetensors.torch import load_file

    with OutputLock(run_dir, what="itune average-checkpoints"):
        with warnings.catch_warnings(record=True) as passed_over:
            warnings.simplefilter("always", UserWarning)
            chosen = choose_checkpoints(run_dir, top)
        averaged = average_state(chosen)
        model = load_file(run_dir / WEIGHTS)
    outside = sorted(k for k in averaged if k not in model and not k.startswith("lm_head."))  # lm_head: tied
    if outside:
        raise ValueError(f"{chosen[0]} holds weights the model in {run_dir} lacks ({outside[:3]}): another model's")
    for key in sorted(k for k in averaged if k in model and averaged[k].shape != model[k].shape)[:1]:
        raise ValueError(
            f"{chosen[0]}: weight {key} has shape {tuple(averaged[key].shape)}, {tuple(model[key].shape)} in the "
            f"model of {run_dir / WEIGHTS}: another model's; average the checkpoints of the run that saved it"
        )
    model.update({k: v for k, v in averaged.items() if k in model})
    return chosen, model, [str(w.message) for w in passed_over], averaged


def average_checkpoints(
    run_dir: str | Path, output_dir: str | Path, top: int = 4, *, overwrite: bool = False
) -> dict[str, Any]:
    """Write the run's model with its trainable weights replaced by the average of its `top` best checkpoints.

    The output directory is claimed as every command claims its own (`itune_hf.utils.output_dirs.claim_output_dir`:
    locked; a directory holding other files is refused unless `overwrite`); every file is written under a temporary
    name and moved into place, `averaged_from.json` last, so a kill leaves no half-written weights. The run itself is
    never the output (its trained model would be replaced).

    Args:
        run_dir: An `itune train` output directory (full-checkpoint families: XGPT).
        output_dir: Where the averaged model goes (a copy of the run's model files).
        top: How many checkpoints to average (the paper: 4); fewer when the run kept fewer sound ones, with a warning
            naming how many were averaged.
        overwrite: Remove what `output_dir` holds that an earlier average did not write.

    Returns:
        `{"checkpoints": [...], "scores": [...], "weights": count, "warnings": [...]}` (also written as
        `averaged_from.json`; `warnings`: fewer checkpoints than `top`, damaged ones passed over, and what was not
        ranked by validation, see `ranking_warnings`; each also warned).

    Raises:
        FileNotFoundError: no run, model or checkpoint there.
        FileExistsError: `output_dir` is the run, or holds other files (without `overwrite`), or is in use.
        ValueError: `top` below 1, or checkpoints that do not fit the run's model.
        InputError: a checkpoint holds NaN or infinite weights.
    """
    from safetensors.torch import save_file

    run_dir, output_dir = Path(run_dir), Path(output_dir)
    if top < 1:
        raise ValueError(f"--top must be at least 1, got {top}")
    if not (run_dir / WEIGHTS).is_file():
        raise FileNotFoundError(
            f"{run_dir / WEIGHTS}: not found; average-checkpoints reads an XGPT itune train run (a full model and its "
            "checkpoints/); I-Tuning runs save adapters"
        )
    if output_dir.resolve() == run_dir.resolve():
        raise FileExistsError(
            f"--output-dir {output_dir} is the run itself: its trained model would be replaced; write the average "
            "into another directory"
        )
    chosen, model, notes, averaged = _average_run(run_dir, top)
    if len(chosen) < top:
        notes.insert(0, f"averaged {len(chosen)} checkpoint(s), not the {top} asked for (--top {top}): {run_dir} "
                        f"has only {len(chosen)} sound one(s) on disk")  # fmt: skip
    notes += ranking_warnings(run_dir, chosen)
    scores = checkpoint_scores(run_dir)
    report = {
        "checkpoints": [c.name for c in chosen], "scores": [scores[c] for c in chosen], "weights": len(averaged),
        "warnings": notes,
    }  # fmt: skip
    lock = claim_output_dir(
        output_dir, command="itune average-checkpoints", overwrite=overwrite,
        is_previous_output=lambda directory: (directory / REPORT).is_file(), inputs=[run_dir],
    )  # fmt: skip
    try:
        (output_dir / REPORT).unlink(missing_ok=True)  # unfinished until the new one is written, last
        for item in sorted(run_dir.iterdir()):
            if item.is_file() and item.name != WEIGHTS and not item.name.startswith("."):
                with atomic_path(output_dir / item.name) as temporary:
                    shutil.copy2(item, temporary)
        with atomic_path(output_dir / WEIGHTS) as temporary:
            save_file({k: v.contiguous() for k, v in model.items()}, str(temporary), metadata={"format": "pt"})
        atomic_write_json(output_dir / REPORT, report)
    finally:
        lock.release()
    for note in notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    return report


__all__ = [
    "average_checkpoints", "average_state", "checkpoint_scores", "choose_checkpoints", "ranking_warnings", "run_scores",
]  # fmt: skip
