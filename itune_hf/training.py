"""Training I-Tuning adapters with Accelerate: one CPU, one GPU, DDP, FSDP or several nodes.

Only the I-Tuning modules train; both backbones stay frozen. The loop follows the Accelerate examples:
`get_dataloaders` -> one `prepare()` -> `accumulate` / `backward` / clip / step, validation gathered across ranks,
checkpoints through `save_state` (adapter weights, optimizer, scheduler, every rank's RNG states) and the adapter
saved with `unwrap_model` on the main process. Data order is a pure function of (seed, epoch), so `--resume`
continues bit-for-bit where a run stopped.

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
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .evaluation import generate_captions, score  # noqa: F401  (re-exported: they lived here)
from .training_config import MIXED_PRECISION, SCHEDULES, TrainingConfig  # noqa: F401  (re-exported)


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------
class CaptionPairs(Dataset):
    """Every (image, reference caption) pair of a caption dataset: an epoch sees each caption once.

    Args:
        dataset: Rows with `image_id`, `image_path`, `captions`.
        max_images: Use only the first N images.
    """

    def __init__(self, dataset, max_images: int | None = None) -> None:
        rows = dataset.select(range(min(max_images, len(dataset)))) if max_images else dataset
        self.image_ids: list[str] = list(rows["image_id"])
        self.image_paths: list[str] = list(rows["image_path"])
        self.pairs = [(row, caption) for row, captions in enumerate(rows["captions"]) for caption in captions]
        if not self.pairs:
            raise ValueError("The training split has no captions")

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, str]:
        row, caption = self.pairs[index]
        return {"image_id": self.image_ids[row], "image_path": self.image_paths[row], "caption": caption}


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
    """Turns caption pairs into model inputs: cached vision states (or pixels) plus tokenised captions.

    Args:
        processor: The `ITuningProcessor`.
        feature_cache: A `FeatureCache`; without one, images are opened and processed.
    """

    def __init__(self, processor, feature_cache=None) -> None:
        self.processor, self.feature_cache = processor, feature_cache

    def __call__(self, items: Sequence[dict[str, str]]) -> dict[str, torch.Tensor]:
        captions = [item["caption"] for item in items]
        if self.feature_cache is not None:
            batch = dict(self.processor(captions=captions, return_tensors="pt"))
            batch["encoder_outputs"] = self.feature_cache.get([item["image_id"] for item in items])
            return batch
        return dict(self.processor(images=[item["image_path"] for item in items], captions=captions))


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


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------
def build_base(config: TrainingConfig):
    """The bare captioning model (frozen backbones, no modules) and its processor."""
    from .modeling_ituning import ITuningForCaptioning
    from .presets import build_model, build_processor
    from .processing_ituning import ITuningProcessor

    if config.preset:
        base = build_model(config.preset, pretrained=config.pretrained, add_ituning_modules=False)
        processor = build_processor(config.preset)
    else:
        base = ITuningForCaptioning.from_vision_text_pretrained(
            config.vision_model, config.text_model, add_ituning_modules=False
        )
        processor = ITuningProcessor.from_vision_text_pretrained(config.vision_model, config.text_model)
    processor.max_caption_length = config.max_caption_length
    return base, processor


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------------------------
def _checkpoints(output_dir: Path) -> list[Path]:
    return sorted(p for p in (output_dir / "checkpoints").glob("step-*") if p.is_dir() and not p.suffix)


def _prepare_output_dir(config: TrainingConfig, accelerator) -> Path | None:
    """Check the output directory; return the checkpoint to resume from, if any. Never deletes a run silently."""
    output_dir = Path(config.output_dir)
    saved = output_dir / "training_config.json"
    if config.resume:
        checkpoints = _checkpoints(output_dir)
        if not checkpoints:
            raise FileNotFoundError(f"--resume: no checkpoint in {output_dir / 'checkpoints'} to continue from")
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
        return checkpoints[-1]
    if saved.is_file() and not config.overwrite:
        raise FileExistsError(
            f"{output_dir} already holds a training run. Pass --resume to continue it, --overwrite to start over "
            "(its checkpoints are replaced), or choose another --output-dir."
        )
    if accelerator.is_main_process and config.overwrite and (output_dir / "checkpoints").exists():
        shutil.rmtree(output_dir / "checkpoints")
    return None


# ----------------------------------------------------------------------------------------------------------------
# The training function
# ----------------------------------------------------------------------------------------------------------------
def train(config: TrainingConfig) -> dict[str, Any]:
    """Train an I-Tuning adapter; returns the summary also written to `train_summary.json`.

    Args:
        config: The run's settings.
    """
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed
    from peft import get_peft_model
    from tqdm.auto import tqdm
    from transformers import get_scheduler

    from .features import FeatureCache, vision_fingerprint
    from .hub import save_captioner

    output_dir = Path(config.output_dir)
    precision, runtime_note = _choose_runtime(config)
    accelerator = Accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        mixed_precision=precision,
        log_with=None if config.report_to == "none" else config.report_to,
        project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "logs")),
    )
    resume_from = _prepare_output_dir(config, accelerator)
    set_seed(config.seed)
    started = time.time()

    with accelerator.main_process_first():  # the main process builds any data/model caches first
        train_rows, eval_rows = load_splits(config)
        base, processor = build_base(config)
    base.vision_model.requires_grad_(False)
    cache = None
    if config.feature_cache:
        cache = FeatureCache(
            config.feature_cache,
            expected_fingerprint=vision_fingerprint(
                base.vision_model, processor.image_processor, _cache_dtype(config.feature_cache)
            ),
        )
    if config.gradient_checkpointing:
        base.activation_checkpointing_enable()
    if config.init_adapter:
        from peft import PeftConfig

        start = PeftConfig.from_pretrained(config.init_adapter)  # the adapter's own settings (e.g. after VLP)
        model = get_peft_model(base, start)
        _load_adapter_weights(model, config.init_adapter)
    else:
        model = get_peft_model(base, config.adapter_config(base.config))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    pairs = CaptionPairs(train_rows, config.max_train_images)
    if cache is not None:
        usable = [i for i, (row, _) in enumerate(pairs.pairs) if pairs.image_ids[row] in cache]
        if len(usable) < len(pairs):
            pairs.pairs = [pairs.pairs[i] for i in usable]
            accelerator.print(
                f"{len(pairs.image_ids) - len(set(pairs.image_ids) & set(cache.image_ids()))} training "
                f"images are not in the feature cache (unreadable when it was built) and are skipped"
            )
    sampler = EpochPermutation(len(pairs), config.seed)
    # The loader draws its workers' base seed from its own generator: creating an iterator (again after a resume)
    # must not consume the global RNG that dropout uses, or a resumed run would diverge.
    loader = DataLoader(
        pairs,
        batch_size=config.batch_size,
        sampler=sampler,
        num_workers=config.num_workers,
        collate_fn=CaptionCollator(processor, cache),
        drop_last=False,
        generator=torch.Generator().manual_seed(config.seed),
    )
    micro_batches_per_epoch = math.ceil(len(pairs) / (config.batch_size * accelerator.num_processes))
    steps_per_epoch = math.ceil(micro_batches_per_epoch / config.gradient_accumulation_steps)
    total_steps = config.max_steps or math.ceil(config.num_epochs * steps_per_epoch)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=config.learning_rate, weight_decay=config.weight_decay
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.print(f"runtime: {runtime_note}")

    progress = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "best_metric": None, "best_step": None, "history": []}
    if resume_from is not None:
        progress = json.loads((resume_from / "progress.json").read_text())
        total_steps = progress.get("total_steps", total_steps)
    elif config.time_budget is not None:
        batch = CaptionCollator(processor, cache)([pairs[i] for i in range(min(config.batch_size, len(pairs)))])
        total_steps = _steps_for_budget(config, model, batch, accelerator, optimizer, total_steps)
    progress["total_steps"] = total_steps
    schedule = "constant_with_warmup" if config.lr_schedule == "constant" else config.lr_schedule
    scheduler = get_scheduler(schedule, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=total_steps)
    scheduler = accelerator.prepare(scheduler)

    # Checkpoints hold only what trains: the frozen backbones are never written again and again.
    trainable_names = {n for n, p in accelerator.unwrap_model(model).named_parameters() if p.requires_grad}

    def keep_trainable(models, weights, directory):
        for index, state in enumerate(weights):
            weights[index] = {k: v for k, v in state.items() if k.removeprefix("module.") in trainable_names}

    accelerator.register_save_state_pre_hook(keep_trainable)

    if resume_from is not None:
        accelerator.load_state(str(resume_from), strict=False)
        accelerator.print(f"resumed from {resume_from} (step {progress['step']}, epoch {progress['epoch']})")

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

    eval_every = config.eval_every or steps_per_epoch
    accelerator.print(
        f"training {trainable:,} I-Tuning parameters on {len(pairs):,} captions of {len(pairs.image_ids):,} images; "
        f"{steps_per_epoch} steps per epoch, {total_steps} steps, {accelerator.num_processes} process(es)"
    )

    def validate() -> dict[str, Any] | None:
        if eval_rows is None:
            return None
        rows = (
            eval_rows.select(range(min(config.eval_max_images, len(eval_rows))))
            if config.eval_max_images
            else eval_rows
        )
        captions = generate_captions(
            accelerator.unwrap_model(model),
            processor,
            rows,
            batch_size=config.eval_batch_size,
            num_beams=1,
            max_new_tokens=config.eval_max_new_tokens,
            feature_cache=cache,
            accelerator=accelerator,
        )
        return score(captions, rows)

    def save_adapter(scores: dict[str, Any] | None) -> None:
        if accelerator.is_main_process:
            from .cards import training_card

            save_captioner(
                accelerator.unwrap_model(model),
                output_dir,
                processor=processor,
                card=training_card(
                    dataclasses.replace(config, mixed_precision=precision), base, trainable, scores, progress["step"]
                ),
            )

    def checkpoint() -> None:
        target = output_dir / "checkpoints" / f"step-{progress['step']:07d}"
        partial = target.with_suffix(".partial")
        if accelerator.is_main_process:
            if partial.exists():
                shutil.rmtree(partial)
            partial.mkdir(parents=True)  # before any rank writes its random states into it
        accelerator.wait_for_everyone()
        accelerator.save_state(str(partial))
        accelerator.wait_for_everyone()  # every rank's files are in before the directory is renamed
        if accelerator.is_main_process:
            (partial / "progress.json").write_text(json.dumps(progress, indent=2))
            if target.exists():
                shutil.rmtree(target)
            os.replace(partial, target)  # whole checkpoints only: an interrupted save leaves a .partial behind
            for old in _checkpoints(output_dir)[: -config.keep_checkpoints]:
                shutil.rmtree(old)
        accelerator.wait_for_everyone()

    bar = tqdm(
        total=total_steps,
        initial=progress["step"],
        desc="training",
        unit="step",
        disable=not accelerator.is_local_main_process,
    )
    model.train()
    running, seen = 0.0, 0
    budget = TimeBudget(config.time_budget)
    while progress["step"] < total_steps:
        loader.set_epoch(progress["epoch"])
        epoch_loader = (
            accelerator.skip_first_batches(loader, progress["batch_in_epoch"]) if progress["batch_in_epoch"] else loader
        )
        for batch in epoch_loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients and config.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            progress["batch_in_epoch"] += 1
            progress["captions_seen"] = (
                progress.get("captions_seen", 0) + len(batch["labels"]) * accelerator.num_processes
            )
            running, seen = running + loss.detach().float().item(), seen + 1
            if not accelerator.sync_gradients:
                continue
            progress["step"] += 1
            bar.update(1)
            step = progress["step"]
            if budget.overrun(accelerator):
                accelerator.print(f"step {step}: 20% over the time budget, stopping here (the machine got slower)")
                total_steps = progress["total_steps"] = step
            if step % config.log_every == 0 or step == total_steps:
                logged = {
                    "train/loss": running / seen,
                    "train/lr": scheduler.get_last_lr()[0],
                    "train/epoch": progress["epoch"] + progress["batch_in_epoch"] / micro_batches_per_epoch,
                }
                accelerator.log(logged, step=step)
                bar.set_postfix(loss=f"{logged['train/loss']:.3f}")
                progress["history"].append({"step": step, "loss": round(logged["train/loss"], 5)})
                running, seen = 0.0, 0
            if step % eval_every == 0 or step == total_steps:
                with budget.paused():
                    scores = validate()
                if scores is not None:
                    accelerator.log({f"val/{k}": v for k, v in scores.items() if isinstance(v, float)}, step=step)
                    progress["history"].append({"step": step, "val": scores})
                    accelerator.print(f"step {step}: validation CIDEr {scores['CIDEr']:.4f}")
                    if progress["best_metric"] is None or scores["CIDEr"] > progress["best_metric"]:
                        progress["best_metric"], progress["best_step"] = scores["CIDEr"], step
                        save_adapter(scores)
                elif step == total_steps:
                    save_adapter(None)
            if step % config.save_every == 0 or step == total_steps:
                with budget.paused():
                    checkpoint()
            if step >= total_steps:
                break
        else:
            progress["epoch"] += 1
            progress["batch_in_epoch"] = 0
            continue
        break
    bar.close()

    unwrapped = accelerator.unwrap_model(model)
    adapter_weights = torch.cat(
        [p.detach().flatten().float() for n, p in sorted(unwrapped.named_parameters()) if p.requires_grad]
    )
    checksums = accelerator.gather(
        torch.stack(
            [
                adapter_weights.sum(),
                adapter_weights.abs().sum(),
                (adapter_weights * torch.arange(len(adapter_weights))).sum(),
            ]
        )
        .unsqueeze(0)
        .to(accelerator.device)
    )
    summary = {
        "steps": progress["step"],
        "mixed_precision": precision,
        "runtime": runtime_note,
        "epochs": progress["epoch"] + progress["batch_in_epoch"] / micro_batches_per_epoch,
        "captions_seen": progress.get("captions_seen", 0),
        "trainable_parameters": trainable,
        "train_captions": len(pairs),
        "processes": accelerator.num_processes,
        "best_step": progress["best_step"],
        "best_val_CIDEr": progress["best_metric"],
        "final_loss": next((h["loss"] for h in reversed(progress["history"]) if "loss" in h), None),
        "history": progress["history"],
        "seconds": round(time.time() - started, 1),
        "rank_adapter_checksums": checksums.cpu().tolist(),
        "ranks_identical": bool((checksums == checksums[0]).all()),
    }
    if accelerator.is_main_process:
        (output_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
    # Free the DDP wrapper *before* end_training() destroys the process group. Once the group is destroyed, the DDP
    # reducer is its last owner, and freeing the reducer (from Python, GIL held) joins gloo worker threads that may be
    # waiting for the GIL to drop a finished collective's tensors: a hang at exit (seen ~1 run in 3 on 2 CPU cores;
    # pytorch/pytorch#56297). Freed while the group lives, the reducer only drops a reference; the group itself is
    # destroyed through torch's GIL-releasing destructor.
    wrapper = weakref.ref(model)
    model = unwrapped = None
    accelerator.free_memory()
    gc.collect()  # a wrapper kept alive by a reference cycle would otherwise be freed later, at a random point
    if wrapper() is not None:
        warnings.warn(
            "itune_hf: the prepared (DDP) model is still referenced after training; process-group teardown may hang",
            RuntimeWarning,
            stacklevel=2,
        )
    accelerator.end_training()
    return summary


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


def _steps_for_budget(config: TrainingConfig, model, batch, accelerator, optimizer, max_steps: int) -> int:
    """The step count that fits `config.time_budget`, from a step measured on `batch` (printed)."""
    seconds = measure_step_seconds(model, batch, accelerator, optimizer) * config.gradient_accumulation_steps
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


def _load_adapter_weights(model, adapter_dir: str) -> None:
    """Load an adapter's weights into the (single, default) adapter of `model`, refusing a partial load."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from .adapter.convert import ADAPTER_WEIGHTS_NAME, find_adapter_file

    path = find_adapter_file(adapter_dir, ADAPTER_WEIGHTS_NAME)
    if path is None:
        raise FileNotFoundError(f"--init-adapter {adapter_dir}: no {ADAPTER_WEIGHTS_NAME} there")
    result = set_peft_model_state_dict(model, load_file(str(path)))
    missing = [k for k in result.missing_keys if ".ituning_modules." in k]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"--init-adapter {adapter_dir} does not fit this model: missing {missing[:3]}, "
            f"unexpected {list(result.unexpected_keys)[:3]}"
        )


def _cache_dtype(directory: str) -> str:
    fingerprint = Path(directory) / "fingerprint.json"
    if not fingerprint.is_file():
        raise FileNotFoundError(f"{directory} is not a feature cache (no fingerprint.json): run itune cache-features")
    return json.loads(fingerprint.read_text())["dtype"]


__all__ = [
    "CaptionCollator", "CaptionPairs", "EpochPermutation", "TimeBudget", "TrainingConfig", "build_base",
    "generate_captions", "launch_device", "load_splits", "measure_step_seconds", "score", "steps_within_budget",
    "train",
]  # fmt: skip
