"""`train()`: the Accelerate training loop, read top to bottom like accelerate's `nlp_example.py`: data, model,
`prepare()`, then `accumulate` / `backward` / clip / step, validation and checkpoints."""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..utils.files import atomic_write_json
from ..vision.inputs import VisualInputs
from .accelerator import (
    end_training,
    fit_fsdp_wrapping,
    make_accelerator,
    make_optimizer,
    make_scheduler,
    record_settings,
    run_summary,
    stretch_scheduler,
)
from .budget import RESIZE_AFTER, WARM_STEPS, TimeBudget, steps_for_budget
from .checkpoints import Checkpointer, TrainingState, prepare_output_dir
from .config import TrainingConfig, describe_training_defaults
from .data import (
    CaptionPairs,
    EpochLength,
    get_collator,
    get_dataloader,
    load_splits,
    measured_items,
    prepare_loader,
    skip_batches,
    training_pairs,
)
from .model import build_training_model, open_feature_cache, training_family
from .peers import Peers
from .retrieval import retrieval_inputs
from .scst import SelfCritical
from .sharding import is_fsdp
from .signals import signals_caught
from .validation import BestModel

# ----------------------------------------------------------------------------------------------------------------


def train(config: TrainingConfig) -> dict[str, Any]:
    """Train a captioner of any family (an I-Tuning adapter, an XGPT model, a baseline); returns the summary also
    written to `train_summary.json`.

    Args:
        config: The run's settings.

    Raises:
        TrainingDiverged: the loss, a gradient or a weight became NaN or infinite (the last good checkpoint kept).
        Interrupted: SIGINT or SIGTERM, after a checkpoint of the step reached.
        PeerLost: another process of a multi-process run is gone (killed, crashed, its machine down).
    """
    accelerator, precision, runtime_note = make_accelerator(config)
    checkpointer = Checkpointer(accelerator, Path(config.output_dir), keep=config.keep_checkpoints)
    peers = Peers.gather(accelerator)
    try:
        return _train(config, accelerator, precision, runtime_note, checkpointer)
    except (RuntimeError, KeyboardInterrupt) as error:  # a collective failed, or the launcher stops this process
        # because another one failed: a process of the run gone is named in one line
        lost = peers.lost(error, checkpointer.latest())
        if lost is None:
            raise
        raise lost from error
    finally:  # a diverged or interrupted run gives its directory back too
        if checkpointer.lock is not None:
            checkpointer.lock.release()


# Over 80 lines: the run's parts in order (data, model, optimizer, resume, the loop, the summary), each one call or a
# few; split, they would hand a dozen locals from one part to the next.
def _train(config: TrainingConfig, accelerator, precision, runtime_note: str, checkpointer: Checkpointer):
    """`train` once the accelerator is made: the run, from the output directory's check to its summary."""
    from accelerate.utils import set_seed

    output_dir = Path(config.output_dir)
    resume_from = prepare_output_dir(config, accelerator, checkpointer)
    set_seed(config.seed)
    started = time.time()

    with accelerator.main_process_first():  # the main process builds any data/model caches first
        train_rows, eval_rows = load_splits(config)
        built = build_training_model(config)
    model, processor, facts, regions = built.model, built.processor, built.facts(), built.region_features
    cache = open_feature_cache(config, built.base, processor)
    visual = VisualInputs.for_model(built.base, feature_cache=cache, regions=regions)
    visual, datastore = retrieval_inputs(config, visual, processor, cache, train_rows, eval_rows, accelerator.print)
    del built  # train() alone holds the model (`model`): the DDP teardown below needs its last reference gone
    trainable = facts.trainable_parameters
    pairs = training_pairs(config, train_rows, cache, accelerator, visual)
    if visual.reads_images and isinstance(pairs, CaptionPairs):  # an unreadable image is skipped, not fatal
        pairs.read_images(processor, config.max_unreadable)
    loader = get_dataloader(config, pairs, processor, cache, visual)
    measured = measured_items(config, pairs, loader) if config.time_budget is not None else None
    epoch_length = EpochLength.of(config, pairs.padded_length, accelerator.num_processes)
    max_steps = config.max_steps or math.ceil(config.num_epochs * epoch_length.steps)
    optimizer = make_optimizer(config, model, sharded=is_fsdp(accelerator))
    objective = _objective(config, processor, train_rows, pairs)
    fit_fsdp_wrapping(accelerator, model)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = prepare_loader(accelerator, loader)
    accelerator.print(f"runtime: {runtime_note}")

    lengthened = False
    if resume_from is not None:
        state = checkpointer.progress(resume_from, total_steps=max_steps)
        _same_processes(state, accelerator, resume_from)
        lengthened = _train_longer(config, state, max_steps, accelerator)
    else:
        steps = _steps_for_run(config, model, pairs, measured, processor, visual, accelerator, optimizer, max_steps,
                               objective)  # fmt: skip
        state = TrainingState(total_steps=steps, processes=accelerator.num_processes)
    scheduler = accelerator.prepare(make_scheduler(config, optimizer, state.total_steps))
    checkpointer.save_only_trainable(model)
    if resume_from is not None:
        checkpointer.resume(resume_from)  # (the optimizer's saved learning rates are the shorter schedule's)
        if lengthened:
            stretch_scheduler(scheduler, config, state.total_steps)
        accelerator.print(f"resumed from {resume_from} (step {state.step}, epoch {state.epoch})")
    record_settings(config, accelerator)
    accelerator.print(
        f"training {trainable:,} {facts.description} on {len(pairs):,} captions of {pairs.num_images:,} images; "
        f"{epoch_length.steps} steps per epoch, {state.total_steps} steps, {accelerator.num_processes} process(es)"
    )
    accelerator.print(f"optimisation: {describe_training_defaults(config)}")

    best = BestModel(
        config, accelerator, processor, eval_rows, cache, facts=facts, precision=precision, regions=regions,
        prompts=visual.prompts, datastore=datastore,
    )  # fmt: skip
    resize_at = max(RESIZE_AFTER, config.warmup_steps) if resume_from is None else None
    budget = TimeBudget(config.time_budget, resize_at=resize_at, max_steps=max_steps)
    _train_loop(config, accelerator, model, optimizer, scheduler, loader, state, best, checkpointer, epoch_length,
                budget, objective)  # fmt: skip
    if resume_from is not None:
        _save_a_missing_final_model(output_dir, state, best, model)

    summary = run_summary(
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
        atomic_write_json(output_dir / "train_summary.json", summary)
    prepared_model = weakref.ref(model)
    model = None  # this was the last reference to the prepared (DDP) model: it must be freed before the teardown
    end_training(accelerator, prepared_model)
    return summary


def _save_a_missing_final_model(output_dir: Path, state: TrainingState, best: BestModel, model) -> None:
    """A resume from the last step's checkpoint of a run whose final save failed (a full disk): save it now."""
    if (output_dir / "config.json").is_file():
        return
    scores = next((h["val"] for h in reversed(state.history) if h.get("step") == state.step and "val" in h), None)
    best.save(model, state.step, scores)


def _train_longer(config: TrainingConfig, state: TrainingState, max_steps: int, accelerator) -> bool:
    """A resume with a larger `--max-steps` than the saved run's: the run goes on to it, and the log says so.
    Returns whether it does (the schedule is then stretched once the checkpoint is loaded)."""
    saved = getattr(config, "resumed_max_steps", None)
    if saved is None:
        return False
    accelerator.print(
        f"--resume with --max-steps {max_steps}, more than the run's {saved}: training on from step {state.step} to "
        f"step {max_steps} (the learning-rate schedule is stretched to the new length)"
    )
    state.total_steps = max_steps
    return True


def _steps_for_run(config: TrainingConfig, model, pairs, items, processor, visual, accelerator, optimizer,
                   max_steps: int, objective) -> int:  # fmt: skip
    """A new run's length: `max_steps`, or under `--time-budget` as many steps as fit, from a step measured on
    `items` (`measured_items`; one pass per pre-training task)."""
    if config.time_budget is None:
        return max_steps
    batch = get_collator(config, pairs, processor, None, visual)(items)
    if isinstance(objective, SelfCritical):  # sampling and scoring are part of the step
        unwrapped = accelerator.unwrap_model(model)
        loss_of = lambda batch: objective.loss(model, unwrapped, batch, accelerator)[0]  # noqa: E731
        return steps_for_budget(config, model, batch, accelerator, optimizer, max_steps, loss_of=loss_of)
    tasks = len(objective.tasks) if objective is not None else 1
    return steps_for_budget(config, model, batch, accelerator, optimizer, max_steps, tasks)


def _train_loop(
    config: TrainingConfig,
    accelerator,
    model,
    optimizer,
    scheduler,
    loader,
    state: TrainingState,
    best: BestModel,
    checkpointer: Checkpointer,
    epoch_length: EpochLength,
    budget: TimeBudget,
    objective=None,
) -> None:
    """Train from where `state` stands until it is done, epoch after epoch. After an optimizer step: the loss is logged,
    the adapter validated (the best one kept) and a checkpoint saved, each every so many steps and at the last step.
    Validation and checkpoints do not count against the time budget (`budget`, which re-sizes a new run once it has
    timed its first steps: `TimeBudget.fitted_length`). With pre-training tasks (`objective`, see
    `itune_hf.training.pretraining`), each task's loss is logged too (`train/loss_<task>`, and in the progress bar)."""
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
    eval_every = config.eval_every or epoch_length.steps  # by default, validate once per epoch
    try:
        with _stop_on_signals() as requested:
            _epochs(config, accelerator, model, optimizer, scheduler, loader, state, best, checkpointer, epoch_length,
                    objective, bar, losses, budget, eval_every, requested)  # fmt: skip
    finally:
        bar.close()  # before the line a diverged or interrupted run ends with


def _epochs(config, accelerator, model, optimizer, scheduler, loader, state, best, checkpointer, epoch_length,
            objective, bar, losses, budget, eval_every, requested) -> None:  # fmt: skip
    """The epochs of `_train_loop`; after each optimizer step, a signal received (`requested`) saves a checkpoint
    and stops the run (`Interrupted`), and a non-finite loss stops it (`TrainingDiverged`)."""
    while not state.done:
        loader.set_epoch(state.epoch)
        # a resumed epoch goes on after the micro-batches its checkpoint had done
        batches = skip_batches(accelerator, loader, state.batch_in_epoch)
        for batch in batches:
            first = (state.batch_in_epoch * accelerator.num_processes + accelerator.process_index) * config.batch_size
            scale = _accumulation_scale(config, epoch_length, state.batch_in_epoch)
            step_losses = _train_micro_batch(
                config, accelerator, model, optimizer, scheduler, batch, objective, (state.epoch, first), scale
            )
            _check_finite_loss(step_losses, state.step + 1, config, checkpointer)
            for name, value in step_losses.items():
                losses.setdefault(name, _RunningMean()).add(value)
            state.captions_seen += _captions_trained(config, accelerator, loader, batch, state.batch_in_epoch)
            state.batch_in_epoch += 1
            if accelerator.sync_gradients:  # this micro-batch ended an accumulation: the optimizer stepped
                state.step += 1
                bar.update(1)
                if budget.overrun(accelerator):
                    accelerator.print(
                        f"step {state.step}: 20% over the time budget, stopping here (the machine got slower)"
                    )
                    state.total_steps = state.step
                _fit_to_budget(config, accelerator, scheduler, state, budget, bar)
                if state.step % config.log_every == 0 or state.done:
                    _log_losses(accelerator, bar, scheduler, state, losses, epoch_length)
                saving = state.step % config.save_every == 0 or state.done or bool(requested)
                if saving or state.step % eval_every == 0:
                    _check_finite_weights(accelerator.unwrap_model(model), state.step, config, checkpointer)
                keep, scores = False, None
                if state.step % eval_every == 0 or state.done:
                    with budget.paused():
                        scores = best.validate(model)
                    keep = best.record(state, scores)
                if saving:  # the checkpoint first: a save that fails after it (a full disk) loses no step
                    with budget.paused():
                        checkpointer.save(state)
                if keep:
                    best.save(model, state.step, scores)
                if requested:
                    raise Interrupted(requested[0], state.step, checkpointer.latest())
            if state.done:
                break
        if not state.done:
            state.start_next_epoch()


def _accumulation_scale(config: TrainingConfig, epoch_length: EpochLength, batch_in_epoch: int) -> float:
    """What a micro-batch's loss is multiplied by so that a step's gradient is the mean of its micro-batches' ones:
    Accelerate divides each by `--gradient-accumulation-steps`, also in an epoch's last accumulation, which may hold
    fewer (Accelerate steps at the end of the data); `Trainer` divides by the micro-batches the step has."""
    steps = config.gradient_accumulation_steps
    started = batch_in_epoch - batch_in_epoch % steps  # accumulations start with each epoch
    return steps / max(1, min(steps, epoch_length.micro_batches - started))


def _fit_to_budget(config: TrainingConfig, accelerator, scheduler, state: TrainingState, budget: TimeBudget,
                   bar) -> None:  # fmt: skip
    """Once the run has timed its own steps (`TimeBudget.fitted_length`), give it the length that fits its budget:
    the step count, the schedule and the progress bar."""
    length = budget.fitted_length(state.step, accelerator)
    if length is None or length == state.total_steps:
        return
    accelerator.print(
        f"step {state.step}: steps {WARM_STEPS + 1}-{state.step} took {budget.measured:.2f}s each; {length} steps fit "
        f"the time budget (planned: {state.total_steps})"
    )
    state.total_steps = length
    stretch_scheduler(scheduler, config, length)
    bar.total = length
    bar.refresh()


class Interrupted(KeyboardInterrupt):
    """Training stopped by a signal (Ctrl-C, SIGTERM) after saving a checkpoint at the step it had reached.

    Args:
        signum: The signal.
        step: The step reached (None: before the first step).
        checkpoint: The checkpoint a `--resume` continues from (None: there is none).
    """

    def __init__(self, signum: int, step: int | None = None, checkpoint: Path | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.step, self.checkpoint = signum, step, checkpoint

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process a signal ended (130: SIGINT, 143: SIGTERM)."""
        return 128 + self.signum


def _stop_on_signals():
    """Turn SIGINT and SIGTERM into a request (the list yielded) that the loop honours after the step under way; a
    second signal stops at once (`Interrupted` without a checkpoint)."""

    def at_once(signum: int) -> None:
        raise Interrupted(signum)

    return signals_caught(on_repeat=at_once)


class TrainingDiverged(InputError):
    """The loss or the weights became NaN or infinite: the run stops before saving them."""


def _diverged(what: str, step: int, config: TrainingConfig, checkpointer: Checkpointer) -> TrainingDiverged:
    last = checkpointer.latest()
    kept = f"the last good checkpoint, {last}, is kept" if last is not None else "no checkpoint was saved before it"
    return TrainingDiverged(
        f"step {step}: {what} (the run diverged); nothing of this step was saved and {kept}. Lower --learning-rate "
        f"(now {config.learning_rate}), check --weight-decay and the data's features for NaN or inf, then start over "
        "with --overwrite"
    )


def _check_finite_loss(step_losses: dict[str, float], step: int, config: TrainingConfig, checkpointer) -> None:
    bad = {name: value for name, value in step_losses.items() if not math.isfinite(value)}
    if bad:
        described = ", ".join(f"{name} {value}" for name, value in bad.items())
        raise _diverged(f"the training loss or its gradient is not finite ({described})", step, config, checkpointer)


def _check_finite_weights(model, step: int, config: TrainingConfig, checkpointer) -> None:
    """Before a validation or a checkpoint: every trainable weight is finite (an update can overflow them while the
    loss it followed was finite)."""
    bad = [name for name, p in model.named_parameters() if p.requires_grad and not bool(p.isfinite().all())]
    if bad:
        what = f"{len(bad)} trainable weight tensor(s) hold NaN or infinite values (e.g. {', '.join(bad[:3])})"
        raise _diverged(what, step, config, checkpointer)


def _log_losses(accelerator, bar, scheduler, state: TrainingState, losses: dict, epoch_length: EpochLength) -> None:
    """Log the mean losses since the last log (the total as `train/loss`, each task's as `train/loss_<task>`)."""
    means = {name: mean.pop() for name, mean in losses.items()}
    lr = scheduler.get_last_lr()[0]  # the rate the next step takes
    accelerator.log(
        {
            **{f"train/{name}": value for name, value in means.items()},
            "train/lr": lr,
            "train/epoch": state.epochs(epoch_length),
        },
        step=state.step,
    )
    bar.set_postfix({name: f"{value:.3f}" for name, value in means.items()})
    state.history.append({"step": state.step, **{name: round(value, 5) for name, value in means.items()}, "lr": lr})


def _same_processes(state: TrainingState, accelerator, checkpoint) -> None:
    """Refuse to resume on another number of processes: the global batch would change, and the position in the
    epoch (micro-batches of each process) would point at other data (a checkpoint that does not record it passes)."""
    if state.processes is not None and state.processes != accelerator.num_processes:
        raise ValueError(
            f"--resume: {checkpoint} was saved by a run on {state.processes} process(es), this one has "
            f"{accelerator.num_processes}: the global batch and the position in the epoch would change. Resume on "
            f"{state.processes} process(es), or start a new run in another output directory"
        )


def _captions_trained(config: TrainingConfig, accelerator, loader, batch, batch_in_epoch: int) -> int:
    """The captions a micro-batch trained on, all processes together, not counting the repeats with which Accelerate
    evens out the processes' last micro-batches of an epoch (map-style data; a stream counts what it read)."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "__len__"):
        return len(batch["labels"]) * accelerator.num_processes
    full = config.batch_size * accelerator.num_processes
    return max(0, min(full, len(dataset) - batch_in_epoch * full))


def _train_micro_batch(
    config: TrainingConfig, accelerator, model, optimizer, scheduler, batch, objective=None, where=(0, 0), scale=1.0
) -> dict[str, float]:
    """Forward and backward on one micro-batch; at the end of an accumulation also clip, step and zero the gradients
    (Accelerate's wrappers skip the step otherwise). Returns `{"loss": ...}`, plus `"loss_<task>"` per pre-training
    task, or SCST's reward, baseline and ending rates (`objective` a `SelfCritical`: `training/scst.py`).

    With pre-training tasks (`objective`), `task_schedule="alternate"` (the paper, following Unicoder) computes each
    task's weighted loss in turn with one update each; `"sum"` makes one update on their sum. Each task's masks come
    from generators seeded by (seed, `where` = (epoch, the micro-batch's first example in the epoch's order), task).
    Each loss is back-propagated times `scale` (`_accumulation_scale`); the losses returned are not scaled.
    """
    update = functools.partial(_update, loss_scale=scale)
    if objective is None:
        return {"loss": update(config, accelerator, model, optimizer, lambda: model(**batch).loss, scheduler)}
    unwrapped = accelerator.unwrap_model(model)
    if isinstance(objective, SelfCritical):
        stats: dict[str, float] = {}

        def scst_loss() -> torch.Tensor:
            loss, measured = objective.loss(model, unwrapped, batch, accelerator)
            stats.update(measured)
            return loss

        return {"loss": update(config, accelerator, model, optimizer, scst_loss, scheduler), **stats}
    task_batch = objective.task_batch(batch)
    count = len(task_batch.captions)

    def task_loss(name: str) -> torch.Tensor:
        task_batch.generators = objective.generators(name, where[0], where[1], count)
        return objective.loss(name, model, unwrapped, task_batch, accelerator.device)

    losses: dict[str, float] = {}
    if config.task_schedule == "sum":
        parts = {}

        def summed() -> torch.Tensor:
            parts.update({name: task_loss(name) for name, _ in objective.tasks})
            return sum(weight * parts[name] for name, weight in objective.tasks)

        losses["loss"] = update(config, accelerator, model, optimizer, summed, scheduler)
        losses.update({f"loss_{name}": _mean(accelerator, part) for name, part in parts.items()})
        return losses
    for index, (name, weight) in enumerate(objective.tasks):
        last = index == len(objective.tasks) - 1  # the learning rate moves once per iteration, after its last update
        losses[f"loss_{name}"] = update(
            config, accelerator, model, optimizer, functools.partial(task_loss, name), scheduler if last else None,
            step_scale=weight,
        )  # fmt: skip
    return {"loss": sum(weight * losses[f"loss_{name}"] for name, weight in objective.tasks), **losses}


def _mean(accelerator, loss: torch.Tensor) -> float:
    """`loss` averaged over the processes."""
    return accelerator.reduce(loss.detach().float(), reduction="mean").item()


def _update(
    config: TrainingConfig,
    accelerator,
    model,
    optimizer,
    compute_loss,
    scheduler,
    step_scale: float = 1.0,
    loss_scale: float = 1.0,
) -> float:
    """One accumulation-aware update: forward (`compute_loss()`), backward (of the loss times `loss_scale`), clip,
    optimizer step (its learning rate times `step_scale`: a task's weight under the alternate schedule), zero the
    gradients; steps `scheduler` unless it is None. Returns the loss, the mean over the processes."""
    with accelerator.accumulate(model):
        loss = compute_loss()
        accelerator.backward(loss * loss_scale if loss_scale != 1.0 else loss)
        if accelerator.sync_gradients and config.max_grad_norm > 0:
            norm = accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            overflowed = norm is not None and not bool(torch.isfinite(torch.as_tensor(norm)))
            if overflowed and getattr(accelerator, "scaler", None) is None:
                optimizer.zero_grad()  # the weights stay as they were: the loss check below stops the run
                return math.nan if math.isfinite(loss.item()) else loss.item()
            # (fp16's loss scale overflowed: the scaler skips the step below and lowers the scale, as under Trainer)
        with _scaled_learning_rate(optimizer, step_scale):
            optimizer.step()
        if scheduler is not None and accelerator.sync_gradients and not optimizer.step_was_skipped:
            scheduler.step()  # once per optimizer step, whatever the processes (`make_accelerator`)
        optimizer.zero_grad()
    # the mean over the processes: the loss of the whole global batch (each process's alone was logged), and every
    # process sees a non-finite one together (the check that stops the run must stop all of them)
    return _mean(accelerator, loss)


@contextlib.contextmanager
def _scaled_learning_rate(optimizer, scale: float):
    """Every parameter group's learning rate times `scale` meanwhile (then as the schedule set it)."""
    if scale == 1.0:
        yield
        return
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * scale
    try:
        yield
    finally:
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate


def _objective(config: TrainingConfig, processor, train_rows, pairs):
    """What the run optimises besides plain captioning: SCST (a `SelfCritical`), its pre-training tasks (an
    `itune_hf.training.pretraining.Objective`), or None."""
    if config.objective == "scst":
        return SelfCritical.for_run(config, processor, train_rows, pairs.num_images)
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
