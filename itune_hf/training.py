"""Training I-Tuning adapters with Accelerate: one CPU, one GPU, DDP, FSDP or several nodes.

Only the I-Tuning modules train; both backbones stay frozen. The loop follows the Accelerate examples:
`get_dataloader` -> one `prepare()` -> `accumulate` / `backward` / clip / step (`_train_loop`), validation gathered
across ranks with the best adapter saved through `unwrap_model` on the main process (`BestAdapter`), checkpoints
through `save_state` (adapter weights, optimizer, scheduler, every rank's RNG states; `Checkpointer`). Data order is
a pure function of (seed, epoch), so `--resume` continues bit-for-bit where a run stopped.

Output directory::

    adapter_config.json, adapter_model.safetensors, config.json, processor files, README.md   the best adapter
    training_config.json, train_summary.json                                                  settings, results
    backbones/<vision|text>/         frozen backbones without a reference (e.g. the demo's random vision tower)
    checkpoints/step-0000200/        resumable state (only trainable weights are stored)
    logs/                            TensorBoard
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import json
import math
import os
import shutil
import time
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .evaluation import generate_captions, score  # noqa: F401  (re-exported: they lived here)
from .metrics.registry import PRIMARY_METRIC
from .training_config import MIXED_PRECISION, SCHEDULES, TrainingConfig  # noqa: F401  (re-exported)
from .visual_inputs import VisualInputs, boxes_or_whole_image


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------
class CaptionPairs(Dataset):
    """Every (image, reference caption) pair of a caption dataset: an epoch sees each caption once.

    Args:
        dataset: Rows with `image_id`, `image_path`, `captions` (and `boxes` with `boxes=True`).
        max_images: Use only the first N images.
        boxes: Keep each image's object boxes (its `boxes`: normalised x1, y1, x2, y2) in its items, for a model that
            pools its regions in them (XGPT, `visual_source="boxes"`). An image without boxes gets the whole image,
            `[0, 0, 1, 1]`, so that it still has one region.

    Raises:
        ValueError: no captions, or `boxes=True` on rows without a `boxes` column.
    """

    def __init__(self, dataset, max_images: int | None = None, *, boxes: bool = False) -> None:
        rows = dataset.select(range(min(max_images, len(dataset)))) if max_images else dataset
        self.image_ids: list[str] = list(rows["image_id"])
        self.image_paths: list[str] = list(rows["image_path"])
        self.pairs = [(row, caption) for row, captions in enumerate(rows["captions"]) for caption in captions]
        if not self.pairs:
            raise ValueError("The training split has no captions")
        self.boxes: list[list[list[float]]] | None = None
        if boxes:
            if "boxes" not in rows.column_names:
                raise ValueError("The training split has no 'boxes' column to pool the regions in")
            self.boxes = [boxes_or_whole_image(image_boxes) for image_boxes in rows["boxes"]]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row, caption = self.pairs[index]
        item = {"image_id": self.image_ids[row], "image_path": self.image_paths[row], "caption": caption}
        if self.boxes is not None:
            item["boxes"] = self.boxes[row]
        return item


class EpochPermutation(Sampler[int]):
    """A fresh random order every epoch that depends only on (seed, epoch): resumable, identical on every rank."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())


class CaptionCollator:
    """Turns caption pairs into model inputs: what the model reads of the images (pixels or cached vision states,
    plus boxes, or precomputed regions: `itune_hf.visual_inputs`) and the tokenised captions.

    Args:
        processor: The model's processor.
        feature_cache: A `FeatureCache`; without one, images are opened and processed.
        vision_states_input: The model's keyword for cached vision states (its family's `vision_states_input`).
        visual: What the model reads (a `VisualInputs`, e.g. for XGPT's boxes or regions); given, it replaces
            `feature_cache` and `vision_states_input`.
    """

    def __init__(
        self,
        processor,
        feature_cache=None,
        vision_states_input: str = "encoder_outputs",
        visual: VisualInputs | None = None,
    ) -> None:
        self.processor = processor
        self.visual = visual if visual is not None else VisualInputs("grid", feature_cache, vision_states_input)
        self.feature_cache, self.vision_states_input = self.visual.feature_cache, self.visual.vision_states_input

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.visual(self.processor, items, captions=[item["caption"] for item in items])


def load_splits(config: TrainingConfig):
    """The training and validation splits named by the config (validation None when disabled)."""
    from .data import load_captions

    loaded = load_captions(config.data, config.image_root, on_missing=config.on_missing)
    splits = {config.train_split: None, **({config.eval_split: None} if config.eval_split else {})}
    for name in splits:
        if name not in loaded:
            raise ValueError(f"{config.data} has no {name!r} split (it has {', '.join(loaded)})")
        splits[name] = loaded[name]
    return splits[config.train_split], (splits[config.eval_split] if config.eval_split else None)


def training_pairs(
    config: TrainingConfig, rows, cache, accelerator, visual: VisualInputs | None = None
) -> CaptionPairs:
    """The training split's (image, caption) pairs; with a feature cache, only those of the images it holds.

    Args:
        config: The run's settings (`max_train_images`; `data` and `train_split` name the rows in errors).
        rows: The training split.
        cache: The feature cache, or None.
        accelerator: The run's `Accelerator` (prints what is skipped).
        visual: What the model reads (`VisualInputs`): boxes are kept for `"boxes"`, and rows without what it reads
            are refused. Default: images or the cache.

    Raises:
        ValueError: naming the data, when it lacks boxes or region features the model reads.
    """
    visual = visual if visual is not None else VisualInputs(feature_cache=cache)
    used = rows.select(range(min(config.max_train_images, len(rows)))) if config.max_train_images else rows
    visual.check_rows(used, f"{config.data} ({config.train_split} split)")
    pairs = CaptionPairs(rows, config.max_train_images, boxes=visual.source == "boxes")
    if cache is not None:
        usable = [i for i, (row, _) in enumerate(pairs.pairs) if pairs.image_ids[row] in cache]
        if len(usable) < len(pairs):
            pairs.pairs = [pairs.pairs[i] for i in usable]
            accelerator.print(
                f"{len(pairs.image_ids) - len(set(pairs.image_ids) & set(cache.image_ids()))} training "
                f"images are not in the feature cache (unreadable when it was built) and are skipped"
            )
    return pairs


def get_dataloader(
    config: TrainingConfig, pairs: CaptionPairs, processor, cache, visual: VisualInputs | None = None
) -> DataLoader:
    """Micro-batches of `config.batch_size` pairs, in an order fixed by (seed, epoch): call `set_epoch` every epoch.

    Args:
        config: The run's settings.
        pairs: The training pairs.
        processor: The model's processor.
        cache: The feature cache, or None.
        visual: What the model reads (`VisualInputs`; default: images or the cache).
    """
    # The loader draws its workers' base seed from its own generator: creating an iterator (again after a resume)
    # must not consume the global RNG that dropout uses, or a resumed run would diverge.
    return DataLoader(
        pairs,
        batch_size=config.batch_size,
        sampler=EpochPermutation(len(pairs), config.seed),
        num_workers=config.num_workers,
        collate_fn=CaptionCollator(processor, cache, training_family(config).vision_states_input, visual=visual),
        drop_last=False,
        generator=torch.Generator().manual_seed(config.seed),
    )


class EpochLength(NamedTuple):
    """An epoch's length in micro-batches (of each process) and in optimizer steps."""

    micro_batches: int
    steps: int

    @classmethod
    def of(cls, config: TrainingConfig, num_pairs: int, num_processes: int) -> EpochLength:
        micro_batches = math.ceil(num_pairs / (config.batch_size * num_processes))
        return cls(micro_batches, math.ceil(micro_batches / config.gradient_accumulation_steps))


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------
def training_family(config: TrainingConfig):
    """The model family a run trains: its preset's, else `--family` (default: I-Tuning); see `itune_hf.models`."""
    from .models import get_family
    from .presets import get_preset

    if config.preset:
        family = get_preset(config.preset).family
        if config.family and config.family != family.name:
            raise ValueError(f"--family {config.family} does not match the preset {config.preset} ({family.name})")
        return family
    return get_family(config.family or "ituning")


def build_training_model(config: TrainingConfig):
    """What the run trains, built by its model family: the model (only what learns requires grad), the base it
    wraps, the processor and the family's settings (an `itune_hf.models.TrainingModel`).

    Raises:
        ValueError: for options of another model family (e.g. `--num-heads`, an I-Tuning setting, for XGPT).
    """
    family = training_family(config)
    foreign = config.foreign_settings(family.name)
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise ValueError(f"{flags}: not settings of {family.title} models (the run trains {family.name}); drop them")
    return family.load("build_for_training")(config)


def _open_feature_cache(config: TrainingConfig, base, processor):
    """The `--feature-cache`, refused unless it matches the vision tower and image processor; None without one."""
    if not config.feature_cache:
        return None
    from .features import FeatureCache, vision_fingerprint

    expected = vision_fingerprint(base.vision_model, processor.image_processor, _cache_dtype(config.feature_cache))
    return FeatureCache(config.feature_cache, expected_fingerprint=expected)


# ----------------------------------------------------------------------------------------------------------------
# Progress and checkpoints
# ----------------------------------------------------------------------------------------------------------------
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

    def epochs(self, length: EpochLength) -> float:
        """Epochs done, with the fraction of the one under way."""
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


def _prepare_output_dir(config: TrainingConfig, accelerator, checkpointer: Checkpointer) -> Path | None:
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


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------
class BestAdapter:
    """Validation during training, keeping the adapter with the best CIDEr (and its card) in the output directory.

    Without a validation split nothing is measured and the adapter is saved once, at the end of the run.

    Args:
        config: The run's settings (`eval_*`: what to validate on; `output_dir`: where the adapter goes).
        accelerator: The run's `Accelerator`; validation is shared by its processes.
        processor: The model's processor.
        rows: The validation split, or None.
        cache: The feature cache, or None.
        facts: What the run trains (`ModelFacts`: its config, trainable count and settings go into the card).
        precision: The run's mixed precision (for the card).
        regions: The `RegionFeatures` a model with `visual_source="regions"` reads, or None.

    Raises:
        ValueError: naming the data, when the validation rows lack boxes or region features the model reads.
    """

    def __init__(self, config, accelerator, processor, rows, cache, *, facts, precision: str, regions=None) -> None:
        if rows is not None and config.eval_max_images:
            rows = rows.select(range(min(config.eval_max_images, len(rows))))
        if rows is not None:
            visual = VisualInputs.for_model(facts.config, feature_cache=cache, regions=regions)
            visual.check_rows(rows, f"{config.data} ({config.eval_split} split)")
        self.config, self.accelerator, self.processor = config, accelerator, processor
        self.rows, self.cache, self.regions = rows, cache, regions
        self.card_config = dataclasses.replace(config, mixed_precision=precision)
        self.facts = facts

    def validate(self, model) -> dict[str, Any] | None:
        """Scores of greedy captions of the validation images (call it on every rank); None without validation."""
        if self.rows is None:
            return None
        captions = generate_captions(
            self.accelerator.unwrap_model(model),
            self.processor,
            self.rows,
            batch_size=self.config.eval_batch_size,
            num_beams=1,
            max_new_tokens=self.config.eval_max_new_tokens,
            feature_cache=self.cache,
            accelerator=self.accelerator,
            region_features=self.regions,
        )
        return score(captions, self.rows)

    def keep_if_best(self, model, state: TrainingState, scores: dict[str, Any] | None) -> None:
        """Record `scores` and save the adapter if they are the best so far; without scores, save it at the end."""
        if scores is None:
            if state.done:
                self.save(model, state.step, None)
            return
        self.accelerator.log({f"val/{k}": v for k, v in scores.items() if isinstance(v, float)}, step=state.step)
        state.history.append({"step": state.step, "val": scores})
        metric = scores[PRIMARY_METRIC]
        self.accelerator.print(f"step {state.step}: validation {PRIMARY_METRIC} {metric:.4f}")
        if state.best_metric is None or metric > state.best_metric:
            state.best_metric, state.best_step = metric, state.step
            self.save(model, state.step, scores)

    def save(self, model, step: int, scores: dict[str, Any] | None) -> None:
        """The adapter, processor and a card reporting `scores`, into the output directory (by the main process)."""
        if self.accelerator.is_main_process:
            from .cards import training_card
            from .hub import save_captioner

            save_captioner(
                self.accelerator.unwrap_model(model),
                Path(self.config.output_dir),
                processor=self.processor,
                card=training_card(self.card_config, self.facts, scores, step),
            )


# ----------------------------------------------------------------------------------------------------------------
# The training function
# ----------------------------------------------------------------------------------------------------------------
def train(config: TrainingConfig) -> dict[str, Any]:
    """Train an I-Tuning adapter; returns the summary also written to `train_summary.json`.

    Args:
        config: The run's settings.
    """
    from accelerate.utils import set_seed

    output_dir = Path(config.output_dir)
    accelerator, precision, runtime_note = _make_accelerator(config)
    checkpointer = Checkpointer(accelerator, output_dir, keep=config.keep_checkpoints)
    resume_from = _prepare_output_dir(config, accelerator, checkpointer)
    set_seed(config.seed)
    started = time.time()

    with accelerator.main_process_first():  # the main process builds any data/model caches first
        train_rows, eval_rows = load_splits(config)
        built = build_training_model(config)
    model, processor, facts, regions = built.model, built.processor, built.facts(), built.region_features
    cache = _open_feature_cache(config, built.base, processor)
    visual = VisualInputs.for_model(built.base, feature_cache=cache, regions=regions)
    del built  # train() alone holds the model (`model`): the DDP teardown below needs its last reference gone
    trainable = facts.trainable_parameters
    pairs = training_pairs(config, train_rows, cache, accelerator, visual)
    loader = get_dataloader(config, pairs, processor, cache, visual)
    epoch_length = EpochLength.of(config, len(pairs), accelerator.num_processes)
    max_steps = config.max_steps or math.ceil(config.num_epochs * epoch_length.steps)
    optimizer = _make_optimizer(config, model)
    objective = _pretraining_objective(config, processor)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.print(f"runtime: {runtime_note}")

    if resume_from is not None:
        state = checkpointer.progress(resume_from, total_steps=max_steps)
    elif config.time_budget is not None:  # as many steps as fit, from a step measured on the first captions
        collate = CaptionCollator(processor, visual=visual)
        batch = collate([pairs[i] for i in range(min(config.batch_size, len(pairs)))])
        tasks = len(objective.tasks) if objective is not None else 1
        steps = _steps_for_budget(config, model, batch, accelerator, optimizer, max_steps, tasks)
        state = TrainingState(total_steps=steps)
    else:
        state = TrainingState(total_steps=max_steps)
    scheduler = accelerator.prepare(_make_scheduler(config, optimizer, state.total_steps))
    checkpointer.save_only_trainable(model)
    if resume_from is not None:
        checkpointer.resume(resume_from)
        accelerator.print(f"resumed from {resume_from} (step {state.step}, epoch {state.epoch})")
    _record_settings(config, accelerator)
    accelerator.print(
        f"training {trainable:,} {facts.description} on {len(pairs):,} captions of {len(pairs.image_ids):,} images; "
        f"{epoch_length.steps} steps per epoch, {state.total_steps} steps, {accelerator.num_processes} process(es)"
    )

    best = BestAdapter(
        config, accelerator, processor, eval_rows, cache, facts=facts, precision=precision, regions=regions
    )
    _train_loop(
        config, accelerator, model, optimizer, scheduler, loader, state, best, checkpointer, epoch_length, objective
    )

    summary = _summary(
        accelerator,
        model,
        state,
        precision=precision,
        runtime_note=runtime_note,
        trainable=trainable,
        train_captions=len(pairs),
        epochs=state.epochs(epoch_length),
        started=started,
    )
    if accelerator.is_main_process:
        (output_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
    prepared_model = weakref.ref(model)
    model = None  # this was the last reference to the prepared (DDP) model: it must be freed before the teardown
    _end_training(accelerator, prepared_model)
    return summary


def _train_loop(
    config: TrainingConfig,
    accelerator,
    model,
    optimizer,
    scheduler,
    loader,
    state: TrainingState,
    best: BestAdapter,
    checkpointer: Checkpointer,
    epoch_length: EpochLength,
    objective=None,
) -> None:
    """Train from where `state` stands until it is done, epoch after epoch. After an optimizer step: the loss is logged,
    the adapter validated (the best one kept) and a checkpoint saved, each every so many steps and at the last step.
    Validation and checkpoints do not count against the time budget. With pre-training tasks (`objective`, see
    `itune_hf.pretraining`), each task's loss is logged too (`train/loss_<task>`, and in the progress bar)."""
    from tqdm.auto import tqdm

    bar = tqdm(
        total=state.total_steps,
        initial=state.step,
        desc="training",
        unit="step",
        disable=not accelerator.is_local_main_process,
    )
    model.train()
    losses: dict[str, _RunningMean] = {}
    budget = TimeBudget(config.time_budget)
    eval_every = config.eval_every or epoch_length.steps  # by default, validate once per epoch
    while not state.done:
        loader.set_epoch(state.epoch)
        # a resumed epoch goes on after the micro-batches its checkpoint had done
        batches = accelerator.skip_first_batches(loader, state.batch_in_epoch) if state.batch_in_epoch else loader
        for batch in batches:
            first = (state.batch_in_epoch * accelerator.num_processes + accelerator.process_index) * config.batch_size
            step_losses = _train_micro_batch(
                config, accelerator, model, optimizer, scheduler, batch, objective, (state.epoch, first)
            )
            for name, value in step_losses.items():
                losses.setdefault(name, _RunningMean()).add(value)
            state.batch_in_epoch += 1
            state.captions_seen += len(batch["labels"]) * accelerator.num_processes
            if accelerator.sync_gradients:  # this micro-batch ended an accumulation: the optimizer stepped
                state.step += 1
                bar.update(1)
                if budget.overrun(accelerator):
                    accelerator.print(
                        f"step {state.step}: 20% over the time budget, stopping here (the machine got slower)"
                    )
                    state.total_steps = state.step
                if state.step % config.log_every == 0 or state.done:
                    _log_losses(accelerator, bar, scheduler, state, losses, epoch_length)
                if state.step % eval_every == 0 or state.done:
                    with budget.paused():
                        scores = best.validate(model)
                    best.keep_if_best(model, state, scores)
                if state.step % config.save_every == 0 or state.done:
                    with budget.paused():
                        checkpointer.save(state)
            if state.done:
                break
        if not state.done:
            state.start_next_epoch()
    bar.close()


def _log_losses(accelerator, bar, scheduler, state: TrainingState, losses: dict, epoch_length: EpochLength) -> None:
    """Log the mean losses since the last log (the total as `train/loss`, each task's as `train/loss_<task>`)."""
    means = {name: mean.pop() for name, mean in losses.items()}
    accelerator.log(
        {
            **{f"train/{name}": value for name, value in means.items()},
            "train/lr": scheduler.get_last_lr()[0],
            "train/epoch": state.epochs(epoch_length),
        },
        step=state.step,
    )
    bar.set_postfix({name: f"{value:.3f}" for name, value in means.items()})
    state.history.append({"step": state.step, **{name: round(value, 5) for name, value in means.items()}})


def _train_micro_batch(
    config: TrainingConfig, accelerator, model, optimizer, scheduler, batch, objective=None, where=(0, 0)
) -> dict[str, float]:
    """Forward and backward on one micro-batch; at the end of an accumulation also clip, step and zero the gradients
    (Accelerate's wrappers skip the step otherwise). Returns `{"loss": ...}`, plus `"loss_<task>"` per pre-training
    task.

    With pre-training tasks (`objective`), `task_schedule="alternate"` (the paper, following Unicoder) computes each
    task's weighted loss in turn with one update each; `"sum"` makes one update on their sum. Each task's masks come
    from generators seeded by (seed, `where` = (epoch, the micro-batch's first example in the epoch's order), task).
    """
    if objective is None:
        return {"loss": _update(config, accelerator, model, optimizer, lambda: model(**batch).loss, scheduler)}
    unwrapped = accelerator.unwrap_model(model)
    task_batch = objective.task_batch(batch)
    count = len(task_batch.captions)

    def task_loss(name: str, weight: float) -> torch.Tensor:
        task_batch.generators = objective.generators(name, where[0], where[1], count)
        return weight * objective.loss(name, model, unwrapped, task_batch, accelerator.device)

    losses: dict[str, float] = {}
    if config.task_schedule == "sum":
        parts = {}

        def summed() -> torch.Tensor:
            parts.update({name: task_loss(name, weight) for name, weight in objective.tasks})
            return sum(parts.values())

        losses["loss"] = _update(config, accelerator, model, optimizer, summed, scheduler)
        losses.update({f"loss_{name}": part.detach().float().item() for name, part in parts.items()})
        return losses
    for index, (name, weight) in enumerate(objective.tasks):
        last = index == len(objective.tasks) - 1  # the learning rate moves once per iteration, after its last update
        losses[f"loss_{name}"] = _update(
            config,
            accelerator,
            model,
            optimizer,
            functools.partial(task_loss, name, weight),
            scheduler if last else None,
        )
    return {"loss": sum(losses.values()), **losses}


def _update(config: TrainingConfig, accelerator, model, optimizer, compute_loss, scheduler) -> float:
    """One accumulation-aware update: forward (`compute_loss()`), backward, clip, optimizer step, zero the gradients;
    steps `scheduler` unless it is None. Returns the loss."""
    with accelerator.accumulate(model):
        loss = compute_loss()
        accelerator.backward(loss)
        if accelerator.sync_gradients and config.max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad()
    return loss.detach().float().item()


def _pretraining_objective(config: TrainingConfig, processor):
    """The run's pre-training tasks (an `itune_hf.pretraining.Objective`), or None for plain captioning."""
    if not config.pretraining:
        return None
    from .pretraining import Objective

    return Objective.for_run(config, training_family(config).name, processor)


class _RunningMean:
    """The mean of the values added since the last `pop`."""

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def add(self, value: float) -> None:
        self.total, self.count = self.total + value, self.count + 1

    def pop(self) -> float:
        mean = self.total / self.count
        self.total, self.count = 0.0, 0
        return mean


def _make_accelerator(config: TrainingConfig):
    """The run's `Accelerator`, with its mixed precision and a line describing it (see `_choose_runtime`)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

    output_dir = Path(config.output_dir)
    precision, runtime_note = _choose_runtime(config)
    # Under DDP every trainable parameter must get a gradient in every backward unless DDP is told to look for the
    # unused ones. XGPT's encoder-text parameters serve only the pre-training tasks (plain captioning leaves them
    # unused), and each pre-training task leaves others unused (TIFG: the region embedding; IC: the text ones).
    unused = config.pretraining or training_family(config).name == "xgpt"
    accelerator = Accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=unused)],
        mixed_precision=precision,
        log_with=None if config.report_to == "none" else config.report_to,
        project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "logs")),
    )
    return accelerator, precision, runtime_note


def _make_optimizer(config: TrainingConfig, model) -> torch.optim.Optimizer:
    """AdamW over what trains, with the run's learning rate, weight decay and betas."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    betas = (config.adam_beta1, config.adam_beta2)
    return torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay, betas=betas)


def _make_scheduler(config: TrainingConfig, optimizer, total_steps: int):
    from transformers import get_scheduler

    schedule = "constant_with_warmup" if config.lr_schedule == "constant" else config.lr_schedule
    return get_scheduler(schedule, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=total_steps)


def _record_settings(config: TrainingConfig, accelerator) -> None:
    """Write `training_config.json` (the main process) and start the trackers with the settings."""
    output_dir = Path(config.output_dir)
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "training_config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
    accelerator.wait_for_everyone()
    if config.report_to != "none":
        accelerator.init_trackers(
            "itune",
            config={
                k: v if isinstance(v, (int, float, str, bool)) else str(v)
                for k, v in dataclasses.asdict(config).items()
            },
        )


def _summary(
    accelerator,
    model,
    state: TrainingState,
    *,
    precision: str,
    runtime_note: str,
    trainable: int,
    train_captions: int,
    epochs: float,
    started: float,
) -> dict[str, Any]:
    """The run's results (`train_summary.json`): length, settings, losses and scores, every rank's adapter checksums."""
    checksums = _rank_checksums(accelerator, model)
    return {
        "steps": state.step,
        "mixed_precision": precision,
        "runtime": runtime_note,
        "epochs": epochs,
        "captions_seen": state.captions_seen,
        "trainable_parameters": trainable,
        "train_captions": train_captions,
        "processes": accelerator.num_processes,
        "best_step": state.best_step,
        "best_val_CIDEr": state.best_metric,
        "final_loss": next((h["loss"] for h in reversed(state.history) if "loss" in h), None),
        "history": state.history,
        "seconds": round(time.time() - started, 1),
        "rank_adapter_checksums": checksums.cpu().tolist(),
        "ranks_identical": bool((checksums == checksums[0]).all()),
    }


def _rank_checksums(accelerator, model) -> torch.Tensor:
    """Three checksums of each rank's trainable weights, one row per rank: DDP must have kept the rows equal."""
    weights = torch.cat(
        [
            p.detach().flatten().float()
            for n, p in sorted(accelerator.unwrap_model(model).named_parameters())
            if p.requires_grad
        ]
    )
    mine = torch.stack([weights.sum(), weights.abs().sum(), (weights * torch.arange(len(weights))).sum()])
    return accelerator.gather(mine.unsqueeze(0).to(accelerator.device))


def _end_training(accelerator, prepared_model: weakref.ref) -> None:
    """End the run (trackers, process group) once the prepared model is freed; the caller has dropped its references."""
    # Free the DDP wrapper *before* end_training() destroys the process group. Once the group is destroyed, the DDP
    # reducer is its last owner, and freeing the reducer (from Python, GIL held) joins gloo worker threads that may be
    # waiting for the GIL to drop a finished collective's tensors: a hang at exit (seen ~1 run in 3 on 2 CPU cores;
    # pytorch/pytorch#56297). Freed while the group lives, the reducer only drops a reference; the group itself is
    # destroyed through torch's GIL-releasing destructor.
    accelerator.free_memory()
    gc.collect()  # a wrapper kept alive by a reference cycle would otherwise be freed later, at a random point
    if prepared_model() is not None:
        warnings.warn(
            "itune_hf: the prepared (DDP) model is still referenced after training; process-group teardown may hang",
            RuntimeWarning,
            stacklevel=3,
        )
    accelerator.end_training()


def _choose_runtime(config: TrainingConfig) -> tuple[str, str]:
    """The run's mixed precision and a line describing it and the CPU settings (see `itune_hf.runtime`)."""
    from .runtime import configure_cpu_runtime, resolve_mixed_precision

    device = launch_device()
    precision, reason = resolve_mixed_precision(config.mixed_precision, str(device))
    note = f"mixed precision {precision} ({reason})"
    if device.type == "cpu":
        note += f"; {configure_cpu_runtime().describe()}"
    return precision, note


def launch_device():
    """The device this process trains on, known before the `Accelerator` exists (its precision depends on it).

    Creates Accelerate's shared process state the way `Accelerator()` would, honouring `ACCELERATE_USE_CPU` (without
    it, a CPU run under `accelerate launch --multi_gpu` would become independent single processes).
    """
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    return PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU")).device


def measure_step_seconds(model, batch: dict[str, Any], accelerator, optimizer, repeats: int = 2) -> float:
    """Seconds one micro-batch's forward and backward take, measured on `batch` after one warm-up pass.

    Leaves no trace: gradients are cleared and every random generator is restored, so a sized run computes what the
    same run with that step count computes. Under several processes, every rank gets the slowest rank's figure.
    """
    from accelerate.utils import send_to_device

    states = _random_states()
    model.train()
    batch = send_to_device(batch, accelerator.device)
    timings = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        accelerator.backward(model(**batch).loss)
        timings.append(time.perf_counter() - started)
        optimizer.zero_grad(set_to_none=True)
    _restore_random_states(states)
    slowest = accelerator.gather(torch.tensor([sum(timings[1:]) / repeats], device=accelerator.device)).max()
    return float(slowest)


def steps_within_budget(budget_seconds: float, seconds_per_step: float, max_steps: int) -> int:
    """Optimizer steps that fit `budget_seconds` at `seconds_per_step`: at least 1, at most `max_steps`."""
    if seconds_per_step <= 0:
        return max_steps
    return max(1, min(max_steps, int(budget_seconds // seconds_per_step)))


class TimeBudget:
    """The optimizer steps' wall time against `--time-budget` (validation and checkpoints are paused out).

    Args:
        seconds: The budget; None for none.
        tolerance: How far past the budget a run may go before it stops (the sizing already aimed at the budget).
    """

    def __init__(self, seconds: float | None, tolerance: float = 1.2) -> None:
        self.seconds, self.tolerance = seconds, tolerance
        self.spent, self._since = 0.0, time.perf_counter()

    @contextlib.contextmanager
    def paused(self):
        self.spent += time.perf_counter() - self._since
        try:
            yield
        finally:
            self._since = time.perf_counter()

    def overrun(self, accelerator=None) -> bool:
        """True, on every rank alike (the main process decides), once the steps ran `tolerance` x the budget."""
        if self.seconds is None:
            return False
        over = self.spent + time.perf_counter() - self._since > self.tolerance * self.seconds
        if accelerator is None or accelerator.num_processes == 1:
            return over
        from accelerate.utils import broadcast

        return bool(broadcast(torch.tensor([float(over)], device=accelerator.device), from_process=0).item())


def _steps_for_budget(
    config: TrainingConfig, model, batch, accelerator, optimizer, max_steps: int, tasks: int = 1
) -> int:
    """The step count that fits `config.time_budget`, from a step measured on `batch` (printed); a step of `tasks`
    pre-training tasks is taken as `tasks` captioning passes."""
    seconds = measure_step_seconds(model, batch, accelerator, optimizer) * config.gradient_accumulation_steps * tasks
    steps = steps_within_budget(config.time_budget, seconds, max_steps)
    accelerator.print(
        f"time budget {config.time_budget:.0f}s: {seconds:.2f}s per step measured, {steps} of {max_steps} steps"
    )
    return steps


def _random_states() -> dict[str, Any]:
    import random

    states = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _restore_random_states(states: dict[str, Any]) -> None:
    import random

    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def _cache_dtype(directory: str) -> str:
    fingerprint = Path(directory) / "fingerprint.json"
    if not fingerprint.is_file():
        raise FileNotFoundError(f"{directory} is not a feature cache (no fingerprint.json): run itune cache-features")
    return json.loads(fingerprint.read_text())["dtype"]


__all__ = [
    "BestAdapter", "CaptionCollator", "CaptionPairs", "Checkpointer", "EpochLength", "EpochPermutation", "TimeBudget",
    "TrainingConfig", "TrainingState", "build_training_model", "generate_captions", "get_dataloader", "launch_device",
    "load_splits", "measure_step_seconds", "score", "steps_within_budget", "train", "training_pairs",
]  # fmt: skip
