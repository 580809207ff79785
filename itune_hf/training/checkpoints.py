"""Resumable training state: `TrainingState` (where a run stands), `Checkpointer` (checkpoints under
`<output_dir>/checkpoints/`) and the output directory's check before a run starts (`prepare_output_dir`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError, is_write_failure, write_failure_message
from ..metrics.registry import PRIMARY_METRIC
from ..utils.files import atomic_write_json, sha256_of_file
from ..utils.output_dirs import LOCK_NAME, OutputLock, refuse_output_over_inputs
from . import sharding
from .peers import LAUNCH_MARKER, elastic_restart, restarted_launch

if TYPE_CHECKING:
    from .config import TrainingConfig


@dataclasses.dataclass
class TrainingState:
    """Where a run stands; every checkpoint saves it as `progress.json` (these fields are its keys).

    Args:
        step: Optimizer steps done.
        epoch: The epoch under way, from 0.
        batch_in_epoch: Micro-batches of that epoch done (by each process).
        best_metric: The best validation CIDEr so far.
        best_step: The step that reached it (its adapter is the one in the output directory).
        history: Logged losses and the learning rate they end at (`{"step", "loss", "lr"}`) and validation scores
            (`{"step", "val"}`).
        total_steps: The run's length: set at its start (sized to `--time-budget` if one is given), kept by a resume,
            cut short when a run overruns its budget.
        captions_seen: Training captions seen, by all processes together.
        processes: The processes the run trains on (a resume must have as many).
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    total_steps: int | None = None
    captions_seen: int = 0  # 0 for a checkpoint that does not record it (an older itune_hf's)
    processes: int | None = None  # None for a checkpoint that does not record it

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps

    def epochs(self, length) -> float:
        """Epochs done, with the fraction of the one under way (`length`: the run's `training.EpochLength`)."""
        return self.epoch + self.batch_in_epoch / length.micro_batches

    def start_next_epoch(self) -> None:
        self.epoch, self.batch_in_epoch = self.epoch + 1, 0


def validation_scores(history: list[dict[str, Any]]) -> dict[int, float]:
    """The validation CIDEr of every step a run validated, from its history (`TrainingState.history`: each
    validation is recorded there, whether or not a checkpoint of its step is kept).

    Args:
        history: A run's history entries (`{"step", "val": {...}}` for a validation).
    """
    return {
        int(entry["step"]): float(entry["val"][PRIMARY_METRIC])
        for entry in history
        if isinstance(entry, dict)  # a damaged or hand-edited history holds other things: they score nothing
        and isinstance(entry.get("step"), int)
        and isinstance(entry.get("val"), dict)
        and isinstance(entry["val"].get(PRIMARY_METRIC), (int, float))
    }


def checkpoint_step(checkpoint: Path) -> int:
    """The step of a checkpoint directory `step-NNNNNNN`."""
    return int(checkpoint.name.removeprefix("step-"))


def rank_checkpoints(checkpoints: list[Path], scores: dict[int, float]) -> list[Path]:
    """`checkpoints` best first: by the validation CIDEr of their step, then those without one, newest first."""

    def key(checkpoint: Path) -> tuple[bool, float, int]:
        score = scores.get(checkpoint_step(checkpoint))
        return score is not None, score if score is not None else 0.0, checkpoint_step(checkpoint)

    return sorted(checkpoints, key=key, reverse=True)


def checkpoints_to_keep(checkpoints: list[Path], scores: dict[int, float], keep: int) -> list[Path]:
    """Which of a run's checkpoints stay on disk: the newest (a resume continues from it) and the best `keep - 1` of
    the others by validation CIDEr (`rank_checkpoints`), so that the best ones are there to average. Without
    validation that is the newest `keep`.

    Args:
        checkpoints: The run's complete checkpoints.
        scores: The validation CIDEr by step (`validation_scores`).
        keep: How many to keep (at least 1).
    """
    if not checkpoints:
        return []
    newest = max(checkpoints, key=checkpoint_step)
    others = [c for c in checkpoints if c != newest]
    return [newest, *rank_checkpoints(others, scores)[: keep - 1]]


MANIFEST_NAME = "manifest.json"


class CheckpointError(ValueError):
    """No checkpoint of a run can be trusted (every one is damaged, incomplete or from another model)."""


class CheckpointWriteError(InputError):
    """A checkpoint could not be written (a full disk, a quota, a file-size limit): one line naming it, the cause and
    the last complete checkpoint, which is kept."""


def write_manifest(directory: Path) -> None:
    """Record the size and SHA-256 of every file in `directory` in its `manifest.json` (written last, atomically).

    Args:
        directory: A checkpoint directory whose files are all written.
    """
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)
    entries = {str(p.relative_to(directory)): {"size": p.stat().st_size, "sha256": sha256_of_file(p)} for p in files}
    atomic_write_json(directory / MANIFEST_NAME, {"format": 1, "files": entries})


def checkpoint_problems(directory: Path) -> list[str]:
    """What is wrong with a checkpoint: missing manifest, missing, resized, altered or extra files (empty if sound).

    Args:
        directory: A checkpoint directory.
    """
    try:
        manifest = json.loads((directory / MANIFEST_NAME).read_text())
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not a mapping")
    except FileNotFoundError:
        return [f"no {MANIFEST_NAME} (its save never completed, or an older itune_hf wrote it)"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return [f"{MANIFEST_NAME} is unreadable ({error})"]
    problems = []
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif path.stat().st_size != entry.get("size"):
            problems.append(f"{name} has {path.stat().st_size} bytes, {entry.get('size')} were saved")
        elif sha256_of_file(path) != entry.get("sha256"):
            problems.append(f"{name} differs from the file saved (checksum mismatch)")
    extra = sorted(
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME and str(p.relative_to(directory)) not in files
    )
    problems += [f"{name} was not part of the checkpoint" for name in extra]
    return problems


class Checkpointer:
    """Resumable checkpoints, `<output_dir>/checkpoints/step-NNNNNNN/`.

    A checkpoint is Accelerate's `save_state` (trainable weights only, optimizer, scheduler, every rank's random
    states) plus the `TrainingState` as `progress.json` and, written last, `manifest.json` (size and SHA-256 of every
    file). It is written as `step-NNNNNNN.partial` and renamed once complete, so an interrupted save never passes
    for a checkpoint; `keep` are kept: the newest and the best others by validation CIDEr (`checkpoints_to_keep`;
    without validation, the newest `keep`). A resume verifies every file against the manifest and falls
    back to the newest sound checkpoint, saying which were skipped and why.

    Args:
        accelerator: The run's `Accelerator`.
        output_dir: The run's output directory.
        keep: How many checkpoints to keep (the newest and the best by validation; without it, the newest).
    """

    def __init__(self, accelerator, output_dir: str | os.PathLike, keep: int) -> None:
        self.accelerator, self.directory, self.keep = accelerator, Path(output_dir) / "checkpoints", keep
        self.trainable_names: set[str] | None = None
        self.lock: OutputLock | None = None  # held by the main process from `prepare_output_dir` to the end

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints, oldest first."""
        return sorted(p for p in self.directory.glob("step-*") if p.is_dir() and not p.suffix)

    def latest(self) -> Path | None:
        checkpoints = self.checkpoints()
        return checkpoints[-1] if checkpoints else None

    def latest_sound(self) -> Path:
        """The newest checkpoint whose files all match its manifest; the damaged newer ones are named on stderr.

        Raises:
            FileNotFoundError: there is no checkpoint.
            CheckpointError: no checkpoint is sound (each one's problems named).
        """
        checkpoints = self.checkpoints()
        if not checkpoints:
            raise FileNotFoundError(f"--resume: no checkpoint in {self.directory} to continue from")
        damaged = []
        for checkpoint in reversed(checkpoints):
            problems = checkpoint_problems(checkpoint)
            if not problems:
                for name, reason in damaged:
                    print(f"warning: checkpoint {name} is damaged ({reason}); resuming from {checkpoint.name} instead",
                          file=sys.stderr)  # fmt: skip
                return checkpoint
            damaged.append((checkpoint.name, "; ".join(problems)))
        raise CheckpointError(
            f"--resume: no checkpoint in {self.directory} is sound ("
            + "; ".join(f"{name}: {reason}" for name, reason in damaged)
            + "). Start the run again with --overwrite, or in another --output-dir."
        )

    def save_only_trainable(self, model) -> None:
        """Leave the frozen weights of `model` (prepared) out of every checkpoint: they are never written again (under
        FSDP, `save` gathers the trainable weights itself: `sharding.save_state`)."""
        trainable_names = sharding.trainable_names(self.accelerator.unwrap_model(model))
        self.trainable_names = trainable_names

        def keep_trainable(models, weights, directory):
            for index, state in enumerate(weights):
                weights[index] = {k: v for k, v in state.items() if k.removeprefix("module.") in trainable_names}

        self.accelerator.register_save_state_pre_hook(keep_trainable)

    def save(self, state: TrainingState) -> None:
        """Checkpoint the run at `state.step`, then remove those `checkpoints_to_keep` leaves out (on every rank)."""
        accelerator = self.accelerator
        target = self.directory / f"step-{state.step:07d}"
        partial = target.with_suffix(".partial")
        if accelerator.is_main_process:
            if partial.exists():
                shutil.rmtree(partial)
            partial.mkdir(parents=True)  # before any rank writes its random states into it
        accelerator.wait_for_everyone()
        try:
            if sharding.is_fsdp(accelerator):  # Accelerate would write the whole model, frozen backbones included
                sharding.save_state(accelerator, partial, self.trainable_names)
            else:
                accelerator.save_state(str(partial))
        except Exception as error:
            if not is_write_failure(error):
                raise
            shutil.rmtree(partial, ignore_errors=True)  # never a half-written checkpoint beside the good ones
            last = self.checkpoints()
            kept = (
                f"the last complete checkpoint, {last[-1].name}, is kept: resume from it with --resume"
                if last
                else ("no earlier checkpoint exists")
            )
            raise CheckpointWriteError(f"{write_failure_message(partial, error)}; {kept}") from error
        accelerator.wait_for_everyone()  # every rank's files are in before the directory is renamed
        if accelerator.is_main_process:
            atomic_write_json(partial / "progress.json", dataclasses.asdict(state))
            write_manifest(partial)
            if target.exists():
                shutil.rmtree(target)
            os.replace(partial, target)  # whole checkpoints only: an interrupted save leaves a .partial behind
            checkpoints = self.checkpoints()
            kept = set(checkpoints_to_keep(checkpoints, validation_scores(state.history), self.keep))
            for old in (c for c in checkpoints if c not in kept):
                shutil.rmtree(old)
        accelerator.wait_for_everyone()

    @staticmethod
    def progress(checkpoint: Path, total_steps: int) -> TrainingState:
        """The `TrainingState` saved in `checkpoint`; `total_steps` for one that does not record the run's length.

        Raises:
            CheckpointError: `progress.json` is not a mapping of `TrainingState` fields.
        """
        path = checkpoint / "progress.json"
        saved = json.loads(path.read_text())
        fields = {f.name for f in dataclasses.fields(TrainingState)}
        if not isinstance(saved, dict) or not set(saved) <= fields or "step" not in saved:
            raise CheckpointError(f"{path}: not a training progress file (expected a mapping of {sorted(fields)})")
        return TrainingState(**{"total_steps": total_steps, **saved})

    def resume(self, checkpoint: Path) -> None:
        """Load the weights, optimizer, scheduler and random states of `checkpoint` (after `prepare` and
        `save_only_trainable`), refusing a checkpoint whose weights are not exactly this model's trainable ones.

        Raises:
            CheckpointError: the saved weights name other parameters than the model trains.
        """
        from safetensors import safe_open

        weights = checkpoint / "model.safetensors"
        if self.trainable_names is not None and weights.is_file():
            with safe_open(weights, framework="pt") as handle:
                saved = {k.removeprefix("module.") for k in handle.keys()}
            if saved != self.trainable_names:
                missing, unexpected = sorted(self.trainable_names - saved), sorted(saved - self.trainable_names)
                raise CheckpointError(
                    f"{weights} does not hold this model's trainable weights ({len(missing)} missing, e.g. "
                    f"{missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]}); resume with the run's "
                    "original settings"
                )
        from ..errors import InputError
        from ..utils.files import reading

        hint = "remove it to resume from the checkpoint before, or start over with --overwrite"
        self._check_random_states(checkpoint)
        with reading(checkpoint, "the checkpoint (damaged, or not the safe format)", hint):
            try:
                # strict=False: the frozen backbones are left out of checkpoints on purpose (checked just above)
                if sharding.is_fsdp(self.accelerator):
                    sharding.load_state(self.accelerator, checkpoint, strict=False)
                else:
                    self.accelerator.load_state(str(checkpoint), strict=False)
            except ValueError as error:  # torch's optimizer: "... different number of parameter groups" and alike
                if "parameter group" not in str(error):
                    raise
                raise InputError(  # not a damaged file: an optimizer of other groups wrote it
                    f"{checkpoint}: its optimizer state has other parameter groups than this run's optimizer ({error})"
                    "; checkpoints written before norm layers, biases and token-like vectors left the weight-decay "
                    "group have one group: resume with the itune_hf version that wrote it, or start over with "
                    "--overwrite"
                ) from error

    def _check_random_states(self, checkpoint: Path) -> None:
        """Read this process's random-state file as Accelerate's `load_state` will, which swallows a failure (an info
        log) and resumes with other random states: a resume is then not the uninterrupted run. An unreadable file is
        refused, naming it; a missing one (deleted to resume anyway) is said on stderr, with what will differ."""
        from accelerate.utils import RNG_STATE_NAME
        from accelerate.utils import load as accelerate_load

        from ..errors import InputError, describe_error

        path = checkpoint / f"{RNG_STATE_NAME}_{self.accelerator.process_index}.pkl"
        if not path.is_file():
            print(f"note: {path} is missing: resuming with fresh random states, so the data order and dropout after "
                  "this step differ from an uninterrupted run", file=sys.stderr)  # fmt: skip
            return
        try:
            accelerate_load(path)
        except Exception as error:  # noqa: BLE001 - whatever Accelerate's loader would swallow
            raise InputError(
                f"{path}: the random states cannot be read ({describe_error(error)}), so a resume would not continue "
                "the same run; delete the file to resume with fresh random states (the data order and dropout then "
                "differ), or start over with --overwrite"
            ) from error


RUN_MARKER = "training_config.json"  # written by every run: a directory holding it is a training run's


def _foreign_files(output_dir: Path) -> list[str]:
    """The entries of `output_dir` that no training run wrote (a directory without a run's marker holds only such)."""
    if not output_dir.is_dir() or (output_dir / RUN_MARKER).is_file():
        return []
    return sorted(p.name for p in output_dir.iterdir() if p.name not in (LOCK_NAME, LAUNCH_MARKER))


def prepare_output_dir(config: TrainingConfig, accelerator, checkpointer: Checkpointer) -> Path | None:
    """Lock the output directory (main process) and check it; return the checkpoint to resume from, if any.

    Never deletes a run silently, never writes over files a training run did not create unless `overwrite`.

    Raises:
        FileExistsError: another run holds the directory, it holds a run (without `resume`/`overwrite`), or files
            no training run wrote (without `overwrite`).
    """
    output_dir = Path(config.output_dir)
    inputs = ("data", "image_root", "feature_cache", "region_features", "init_adapter", "init_model", "vision_model")
    refuse_output_over_inputs(output_dir, [getattr(config, name, None) for name in inputs])
    if accelerator.is_main_process:
        checkpointer.lock = OutputLock(output_dir).acquire()
    saved = output_dir / RUN_MARKER
    restarted = _elastic_restart_of_this_run(config, accelerator, checkpointer)
    if config.resume:
        latest = checkpointer.latest_sound()
        if saved.is_file():
            _check_resume_settings(config, json.loads(saved.read_text()))
        return latest
    if saved.is_file() and not config.overwrite and not restarted:
        raise FileExistsError(
            f"{output_dir} already holds a training run. Pass --resume to continue it, --overwrite to start over "
            "(its checkpoints are removed), or choose another --output-dir."
        )
    foreign = _foreign_files(output_dir)
    if foreign and not config.overwrite:
        raise FileExistsError(
            f"{output_dir} holds files no training run wrote ({', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}); a run would write over files of the same names (README.md, "
            "config.json, ...). Choose a new or empty --output-dir, or pass --overwrite."
        )
    old = checkpointer.checkpoints()
    if accelerator.is_main_process and config.overwrite and checkpointer.directory.exists():
        names = ", ".join(p.name for p in old) or "none complete"
        print(f"--overwrite: removing {len(old)} checkpoint(s) of the previous run in {checkpointer.directory} "
              f"({names})", file=sys.stderr)  # fmt: skip
        shutil.rmtree(checkpointer.directory)
    return None


def _elastic_restart_of_this_run(config: TrainingConfig, accelerator, checkpointer: Checkpointer) -> bool:
    """Whether the launcher restarted this run's processes after a failure (`accelerate launch --max_restarts N`,
    `torchrun --max-restarts N`): the run then continues from its newest checkpoint as `--resume` would (or starts
    again when it saved none), saying so. A run in the directory that another launch started is left alone."""
    if config.resume or not restarted_launch(Path(config.output_dir)):
        return False
    latest = checkpointer.latest()
    accelerator.print(
        f"elastic restart {elastic_restart()} of this launch: "
        + (f"continuing from {latest.name} (as --resume)" if latest else "no checkpoint was saved yet, starting again")
    )
    config.resume = latest is not None
    return True


def _longer_run(config: TrainingConfig, before: dict[str, Any]) -> bool:
    """Whether the resume asks for more steps than the saved run's `--max-steps` (training longer: the common reason
    to resume); then `config.resumed_max_steps` records the saved run's, for the loop to say so and run on."""
    saved = before.get("max_steps")
    if saved is None or config.max_steps is None or config.max_steps <= saved:
        return False
    config.resumed_max_steps = saved  # not a field: what the resumed run was asked for
    return True


def _check_resume_settings(config: TrainingConfig, before: dict[str, Any]) -> None:
    """Refuse a resume whose settings differ from the saved run's. A setting the saved run does not record (it was
    written by an older itune_hf) counts as that setting's default, so upgrading never blocks a resume; a training
    default the resumed run does not give (learning rate, warm-up, ...) is the saved run's, whatever its preset or
    family chooses today. A larger `--max-steps` is allowed: the run trains on (see `_longer_run`)."""
    from .config import TRAINING_DEFAULTS

    defaults = {f.name: None if f.default is dataclasses.MISSING else f.default for f in dataclasses.fields(config)}
    defaults.update(TRAINING_DEFAULTS)  # what a saved run that does not record one (an older itune_hf's) ran with
    for name in list(getattr(config, "defaults_from", {})):
        saved = before.get(name)
        setattr(config, name, config.coerce(name, defaults[name] if saved is None else saved))
        config.defaults_from[name] = "the resumed run"
    longer = _longer_run(config, before)
    changed = [
        f"{k}: {before.get(k, defaults[k])!r} -> {getattr(config, k)!r}"
        for k in config.RESUME_INVARIANTS
        if before.get(k, defaults[k]) != getattr(config, k) and not (k == "max_steps" and longer)
    ]
    if changed:
        raise ValueError(
            f"--resume with settings that differ from the run in {config.output_dir} ({'; '.join(changed)}); "
            "resume with the original settings or start a new run in another output directory"
        )


__all__ = [
    "LOCK_NAME", "CheckpointError", "Checkpointer", "OutputLock", "TrainingState", "checkpoint_problems",
    "checkpoint_step", "checkpoints_to_keep", "prepare_output_dir", "rank_checkpoints", "validation_scores",
    "write_manifest",
]  # fmt: skip
