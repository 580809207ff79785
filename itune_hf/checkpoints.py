"""Resumable training state: `TrainingState` (where a run stands), `Checkpointer` (checkpoints under
`<output_dir>/checkpoints/`) and the output directory's check before a run starts (`prepare_output_dir`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .training_config import TrainingConfig


@dataclasses.dataclass
class TrainingState:
    """Where a run stands; every checkpoint saves it as `progress.json` (these fields are its keys).

    Args:
        step: Optimizer steps done.
        epoch: The epoch under way, from 0.
        batch_in_epoch: Micro-batches of that epoch done (by each process).
        best_metric: The best validation CIDEr so far.
        best_step: The step that reached it (its adapter is the one in the output directory).
        history: Logged losses (`{"step", "loss"}`) and validation scores (`{"step", "val"}`).
        total_steps: The run's length: set at its start (sized to `--time-budget` if one is given), kept by a resume,
            cut short when a run overruns its budget.
        captions_seen: Training captions seen, by all processes together.
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    total_steps: int | None = None
    captions_seen: int = 0  # absent from checkpoints written before it was counted

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps

    def epochs(self, length) -> float:
        """Epochs done, with the fraction of the one under way (`length`: the run's `training.EpochLength`)."""
        return self.epoch + self.batch_in_epoch / length.micro_batches

    def start_next_epoch(self) -> None:
        self.epoch, self.batch_in_epoch = self.epoch + 1, 0


class Checkpointer:
    """Resumable checkpoints, `<output_dir>/checkpoints/step-NNNNNNN/`.

    A checkpoint is Accelerate's `save_state` (trainable weights only, optimizer, scheduler, every rank's random
    states) plus the `TrainingState` as `progress.json`. It is written as `step-NNNNNNN.partial` and renamed once
    complete, so an interrupted save never passes for a checkpoint; only the newest `keep` are kept.

    Args:
        accelerator: The run's `Accelerator`.
        output_dir: The run's output directory.
        keep: How many checkpoints to keep (the oldest are removed).
    """

    def __init__(self, accelerator, output_dir: str | os.PathLike, keep: int) -> None:
        self.accelerator, self.directory, self.keep = accelerator, Path(output_dir) / "checkpoints", keep

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints, oldest first."""
        return sorted(p for p in self.directory.glob("step-*") if p.is_dir() and not p.suffix)

    def latest(self) -> Path | None:
        checkpoints = self.checkpoints()
        return checkpoints[-1] if checkpoints else None

    def save_only_trainable(self, model) -> None:
        """Leave the frozen weights of `model` (prepared) out of every checkpoint: they are never written again."""
        trainable_names = {n for n, p in self.accelerator.unwrap_model(model).named_parameters() if p.requires_grad}

        def keep_trainable(models, weights, directory):
            for index, state in enumerate(weights):
                weights[index] = {k: v for k, v in state.items() if k.removeprefix("module.") in trainable_names}

        self.accelerator.register_save_state_pre_hook(keep_trainable)

    def save(self, state: TrainingState) -> None:
        """Checkpoint the run at `state.step`, then remove the oldest checkpoints (call it on every rank)."""
        accelerator = self.accelerator
        target = self.directory / f"step-{state.step:07d}"
        partial = target.with_suffix(".partial")
        if accelerator.is_main_process:
            if partial.exists():
                shutil.rmtree(partial)
            partial.mkdir(parents=True)  # before any rank writes its random states into it
        accelerator.wait_for_everyone()
        accelerator.save_state(str(partial))
        accelerator.wait_for_everyone()  # every rank's files are in before the directory is renamed
        if accelerator.is_main_process:
            (partial / "progress.json").write_text(json.dumps(dataclasses.asdict(state), indent=2))
            if target.exists():
                shutil.rmtree(target)
            os.replace(partial, target)  # whole checkpoints only: an interrupted save leaves a .partial behind
            for old in self.checkpoints()[: -self.keep]:
                shutil.rmtree(old)
        accelerator.wait_for_everyone()

    @staticmethod
    def progress(checkpoint: Path, total_steps: int) -> TrainingState:
        """The `TrainingState` saved in `checkpoint`; `total_steps` for one saved before the run's length was."""
        return TrainingState(**{"total_steps": total_steps, **json.loads((checkpoint / "progress.json").read_text())})

    def resume(self, checkpoint: Path) -> None:
        """Load the weights, optimizer, scheduler and random states of `checkpoint` (after `prepare`)."""
        self.accelerator.load_state(str(checkpoint), strict=False)


def prepare_output_dir(config: TrainingConfig, accelerator, checkpointer: Checkpointer) -> Path | None:
    """Check the output directory; return the checkpoint to resume from, if any. Never deletes a run silently."""
    output_dir = Path(config.output_dir)
    saved = output_dir / "training_config.json"
    if config.resume:
        latest = checkpointer.latest()
        if latest is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {checkpointer.directory} to continue from")
        if saved.is_file():
            before = json.loads(saved.read_text())
            changed = [
                f"{k}: {before.get(k)!r} -> {getattr(config, k)!r}"
                for k in config.RESUME_INVARIANTS
                if before.get(k) != getattr(config, k)
            ]
            if changed:
                raise ValueError(
                    f"--resume with settings that differ from the run in {output_dir} ({'; '.join(changed)}); "
                    "resume with the original settings or start a new run in another output directory"
                )
        return latest
    if saved.is_file() and not config.overwrite:
        raise FileExistsError(
            f"{output_dir} already holds a training run. Pass --resume to continue it, --overwrite to start over "
            "(its checkpoints are replaced), or choose another --output-dir."
        )
    if accelerator.is_main_process and config.overwrite and checkpointer.directory.exists():
        shutil.rmtree(checkpointer.directory)
    return None


__all__ = ["Checkpointer", "TrainingState", "prepare_output_dir"]
