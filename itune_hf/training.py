"""Training I-Tuning adapters with Accelerate: one CPU, one GPU, DDP, FSDP or several nodes.

Only the I-Tuning modules train; both backbones stay frozen. The loop follows the Accelerate examples:
`get_dataloader` -> one `prepare()` -> `accumulate` / `backward` / clip / step (`_train_loop`), validation gathered
across ranks with the best model saved through `unwrap_model` on the main process (`BestModel`), checkpoints
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
import sys
import time
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ._io import atomic_write_json
from .checkpoints import Checkpointer, TrainingState, prepare_output_dir
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
        self._reading: tuple[int | None, float] | None = None  # (shortest edge, max unreadable) once read_images
        self._unreadable: dict[int, str] = {}  # row -> reason, found by this process
        if boxes:
            if "boxes" not in rows.column_names:
                raise ValueError("The training split has no 'boxes' column to pool the regions in")
            self.boxes = [boxes_or_whole_image(image_boxes) for image_boxes in rows["boxes"]]

    def __len__(self) -> int:
        return len(self.pairs)

    @property
    def padded_length(self) -> int:
        """The pairs an epoch goes through, all processes together (`BatchSamplerShard` evens them out)."""
        return len(self.pairs)

    @property
    def num_images(self) -> int:
        """How many images the pairs come from."""
        return len(self.image_ids)

    def first_items(self, count: int) -> list[dict[str, Any]]:
        """The first `count` pairs in dataset order (to measure a step on)."""
        return [self[i] for i in range(min(count, len(self)))]

    def read_images(self, processor, max_unreadable: float = 0.05) -> None:
        """Open each item's image when it is fetched (the item's `image`), so that an unreadable one is skipped.

        A pair whose image cannot be read (undecodable, truncated, refused by the size limits of `open_image`) is
        reported once on stderr and replaced by the next readable pair in dataset order: batches keep their size and
        the data order stays a pure function of (seed, epoch), so `--resume` stays bit-exact.

        Args:
            processor: The model's processor (its image processor's resize bounds the image size).
            max_unreadable: Stop (ValueError) once more than this fraction of the images proved unreadable.
        """
        from .models._shared.images import shortest_edge_of

        self._reading = (shortest_edge_of(getattr(processor, "image_processor", None)), max_unreadable)

    def _item(self, index: int) -> dict[str, Any]:
        row, caption = self.pairs[index]
        item = {"image_id": self.image_ids[row], "image_path": self.image_paths[row], "caption": caption}
        if self.boxes is not None:
            item["boxes"] = self.boxes[row]
        return item

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._reading is None:
            return self._item(index)
        from .models._shared.images import ImageError, open_image

        for offset in range(len(self.pairs)):
            position = (index + offset) % len(self.pairs)
            row = self.pairs[position][0]
            if row in self._unreadable:
                continue
            item = self._item(position)
            try:
                item["image"] = open_image(item["image_path"], shortest_edge=self._reading[0])
                return item
            except ImageError as error:
                self._skip(row, error.reason)
        raise ValueError(f"none of the {len(self.image_ids)} training images could be read")

    def _skip(self, row: int, reason: str) -> None:
        import sys

        self._unreadable[row] = reason
        print(f"itune train: skipping unreadable image {self.image_paths[row]}: {reason}", file=sys.stderr)
        limit = self._reading[1]
        if len(self._unreadable) > limit * len(self.image_ids):
            raise ValueError(
                f"{len(self._unreadable)} of the {len(self.image_ids)} training images are unreadable, more than "
                f"--max-unreadable {limit} of them: fix or remove them (--verify-images lists them all up front)"
            )


class CaptionStream(torch.utils.data.IterableDataset):
    """The (image, caption) pairs of a streamed dataset (`datasets.IterableDataset`, e.g. WebDataset shards) that
    one process reads: its own shards (`shard(num_processes, rank)`, one reader each), shuffled through a buffer.

    Each DataLoader worker reads its own part of the process's shards (`datasets` splits them), so every pair is read
    once per epoch by one worker of one process. The order is a pure function of (seed, epoch, processes, workers):
    the shard order and the shuffle buffer are seeded by seed + epoch (`set_epoch`).

    Args:
        rows: The streamed rows (`image_id`, `image` bytes, `captions`, `shard`).
        num_pairs: Pairs in the whole stream (every process's together): an epoch's length.
        rank: This process's index.
        num_processes: How many processes read the stream.
        seed: The run's seed.
        buffer_size: Pairs in the shuffle buffer (1: no shuffling beyond the shard order).

    Raises:
        ValueError: fewer shards than processes (a process would read nothing).
    """

    def __init__(
        self,
        rows,
        *,
        num_pairs: int,
        rank: int = 0,
        num_processes: int = 1,
        seed: int = 0,
        buffer_size: int = 1000,
    ) -> None:
        if rows.n_shards < num_processes:
            raise ValueError(
                f"the stream has {rows.n_shards} shard(s) for {num_processes} processes: each process reads its own "
                "shards, so write at least as many shards as processes (e.g. itune make-shards --shard-size)"
            )
        self.rows = rows.shard(num_processes, rank, contiguous=False) if num_processes > 1 else rows
        self.stream = self.rows.shuffle(seed=seed, buffer_size=buffer_size) if buffer_size > 1 else self.rows
        self.num_pairs = num_pairs
        splits = rows.info.splits
        lengths = splits["train"].shard_lengths if splits and "train" in splits else None
        largest = max(sum(lengths[r::num_processes]) for r in range(num_processes)) if lengths else None
        #: pairs as many processes would read as the one with the most (the others pad with repeats)
        self.padded_length = largest * num_processes if largest is not None else num_pairs

    def __len__(self) -> int:
        return self.num_pairs

    @property
    def num_images(self) -> int:
        """The images the pairs come from (one caption each in img2dataset shards: the pairs)."""
        return self.num_pairs

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    def _items(self, rows):
        for row in rows:
            for caption in row["captions"]:
                yield {"image_id": row["image_id"], "image": row["image"], "shard": row["shard"], "caption": caption}

    def __iter__(self):
        return self._items(self.stream)

    def first_items(self, count: int) -> list[dict[str, Any]]:
        """The first `count` pairs of this process's shards, unshuffled (to measure a step on)."""
        import itertools

        return list(itertools.islice(self._items(self.rows), count))


def stream_length(rows, config: TrainingConfig, accelerator) -> int:
    """Pairs in a streamed training split: the count its loader recorded, else counted once by reading it."""
    splits = rows.info.splits
    if splits and "train" in splits and splits["train"].num_examples:
        return splits["train"].num_examples
    started = time.perf_counter()
    count = sum(len(row["captions"]) for row in rows.select_columns(["captions"]))
    accelerator.print(f"{config.data}: counted {count:,} pairs in {time.perf_counter() - started:.1f}s")
    return count


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


class StreamCollator(CaptionCollator):
    """A `CaptionCollator` for streamed items: decodes each item's `image` bytes first (in the DataLoader worker);
    an image that does not decode is reported (`BadShardWarning`, shard and key) and left out of its batch. A model
    that reads precomputed regions gets no image decoded."""

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        from .data.webdataset import BadShardWarning, decode_image
        from .models._shared.images import ImageError

        if self.visual.source == "regions":
            return super().__call__(items)

        decoded = []
        for item in items:
            try:
                decoded.append({**item, "image": decode_image(item)})
            except ImageError as error:
                warnings.warn(BadShardWarning(f"{error}; skipped"), stacklevel=2)
        if not decoded:
            from .data import DataError

            raise DataError(f"no image of a batch decodes (shards {sorted({item['shard'] for item in items})})")
        return super().__call__(decoded)


class StreamLoader:
    """Batches of a `CaptionStream` for the training loop: on the process's device, the same number on every process.

    Processes read different shards, so their epochs end at different batches; under DDP every process must take as
    many steps. A process whose stream ends first starts it over (its first batches again, as `DistributedSampler`
    pads with repeats) until every process's has ended: one all-reduce of a flag per batch.

    Args:
        loader: The `DataLoader` over the `CaptionStream`.
    """

    def __init__(self, loader: DataLoader) -> None:
        self.loader, self.accelerator = loader, None

    def prepare(self, accelerator) -> StreamLoader:
        """Use `accelerator`'s device and processes (instead of `accelerator.prepare`, which would re-split the
        stream)."""
        self.accelerator = accelerator
        return self

    def set_epoch(self, epoch: int) -> None:
        self.loader.dataset.set_epoch(epoch)

    def __iter__(self):
        return self.batches()

    def batches(self, skip: int = 0):
        """The epoch's batches after the first `skip` (read, collated and dropped: a resume lands on the same pair
        as the run it continues, at the cost of reading what it skips again)."""
        from accelerate.utils import send_to_device

        accelerator = self.accelerator
        several = accelerator is not None and accelerator.num_processes > 1
        iterator, finished, done = iter(self.loader), False, 0
        while True:
            batch = next(iterator, None)
            if batch is None:
                if not several:
                    return
                finished, iterator = True, iter(self.loader)  # pad with this process's first batches again
                batch = next(iterator, None)
                if batch is None:
                    raise ValueError("this process's shards hold no usable pairs")
            if several:
                flag = torch.tensor([0.0 if finished else 1.0], device=accelerator.device)
                if accelerator.reduce(flag, "sum").item() == 0:  # every process's stream has ended
                    return
            done += 1
            if done > skip:
                yield send_to_device(batch, accelerator.device) if accelerator is not None else batch


def prepare_loader(accelerator, loader):
    """`accelerator.prepare` for a map-style loader; a `StreamLoader` only learns the device and processes."""
    return loader.prepare(accelerator) if isinstance(loader, StreamLoader) else accelerator.prepare(loader)


def skip_batches(accelerator, loader, count: int):
    """The loader's epoch after its first `count` batches (a resumed epoch)."""
    if isinstance(loader, StreamLoader):
        return loader.batches(count)
    return accelerator.skip_first_batches(loader, count) if count else loader


def load_splits(config: TrainingConfig):
    """The training and validation splits named by the config (validation None when disabled, or when the data has
    no such split: then a warning says validation is skipped).

    Missing images are dropped (or refused) per `on_missing`, undecodable ones too with `verify_images`; when more
    than `max_unreadable` of the data is unusable, training refuses to start (ValueError naming the count).
    """
    from .data import load_captions

    options = {"exclude_coco_split": config.exclude_coco_split} if config.exclude_coco_split else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_captions(config.data, config.image_root, on_missing=config.on_missing, **options)
    for warning in caught:  # shown as usual; the reports of skipped images are counted below
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if config.train_split not in loaded:
        raise ValueError(
            f"{config.data} has no {config.train_split!r} split (it has {', '.join(loaded)}); pass --train-split NAME"
        )
    eval_split = config.eval_split
    if eval_split and eval_split not in loaded:
        print(
            f"warning: {config.data} has no {eval_split!r} split (it has {', '.join(loaded)}): training without "
            "validation; pass --eval-split none to say so, or --eval-split NAME",
            file=sys.stderr,
        )
        eval_split = None
    splits = {name: loaded[name] for name in (config.train_split, eval_split) if name}
    problems = [problem for w in caught if getattr(w.message, "report", None) for problem in w.message.report.problems]
    _refuse_unreadable(config, loaded, splits, problems)
    return splits[config.train_split], (splits[eval_split] if eval_split else None)


def _refuse_unreadable(config: TrainingConfig, loaded, splits: dict, problems: list) -> None:
    """Verify the splits' images (`verify_images`, in place) and refuse data more than `max_unreadable` unusable."""
    if not all(hasattr(part, "__len__") for part in loaded.values()):
        return  # streamed shards: bad samples are reported and skipped as they stream
    total = sum(len(part) for part in loaded.values()) + len(problems)
    if config.verify_images:
        from .data import verify_images

        for name in splits:
            splits[name], report = verify_images(splits[name], on_error=config.on_missing, source=config.data)
            problems += report.problems
    if total and len(problems) / total > config.max_unreadable:
        path, reason = problems[0]
        raise ValueError(
            f"{len(problems)} of the {total} images of {config.data} are missing or unreadable (e.g. {path}: "
            f"{reason}), more than --max-unreadable {config.max_unreadable} of them: fix the data (or raise "
            "--max-unreadable)"
        )


def training_pairs(
    config: TrainingConfig, rows, cache, accelerator, visual: VisualInputs | None = None
) -> CaptionPairs | CaptionStream:
    """The training split's (image, caption) pairs; with a feature cache, only those of the images it holds. A
    streamed split (`datasets.IterableDataset`, e.g. WebDataset shards) gives this process's `CaptionStream`.

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
    from .errors import InputError

    visual = visual if visual is not None else VisualInputs(feature_cache=cache)
    if getattr(rows.info, "description", None):
        accelerator.print(rows.info.description)  # what the loader counted or dropped
    from datasets import IterableDataset

    if isinstance(rows, IterableDataset):
        return _stream_pairs(config, rows, cache, accelerator, visual)
    if len(rows) == 0 or not any(rows["captions"]):
        raise InputError(
            f"{config.data} ({config.train_split} split): no training images with captions (any unusable images are "
            "reported above); check --data, --image-root and --train-split"
        )
    used = rows.select(range(min(config.max_train_images, len(rows)))) if config.max_train_images else rows
    visual.check_rows(used, f"{config.data} ({config.train_split} split)")
    pairs = CaptionPairs(rows, config.max_train_images, boxes=visual.source == "boxes")
    if cache is not None:
        usable = [i for i, (row, _) in enumerate(pairs.pairs) if pairs.image_ids[row] in cache]
        if not usable:
            raise InputError(
                f"--feature-cache {config.feature_cache}: holds none of the {len(set(pairs.image_ids))} training "
                f"images of {config.data} ({config.train_split} split), so there is nothing to train on; build the "
                f"cache from this data: itune cache-features --data {config.data} --output-dir DIR"
            )
        if len(usable) < len(pairs):
            pairs.pairs = [pairs.pairs[i] for i in usable]
            accelerator.print(
                f"{len(pairs.image_ids) - len(set(pairs.image_ids) & set(cache.image_ids()))} training "
                f"images are not in the feature cache (unreadable when it was built) and are skipped"
            )
    return pairs


def _stream_pairs(config: TrainingConfig, rows, cache, accelerator, visual: VisualInputs) -> CaptionStream:
    where = f"{config.data} ({config.train_split} split)"
    if cache is not None:
        raise ValueError(f"--feature-cache: {where} is streamed (shards); a feature cache needs map-style data")
    if config.max_train_images:
        raise ValueError(f"--max-train-images: {where} is streamed (shards); name fewer shards in --data instead")
    if visual.source != "regions":  # region features are looked up batch by batch
        visual.check_rows(rows, where)
    return CaptionStream(
        rows,
        num_pairs=stream_length(rows, config, accelerator),
        rank=accelerator.process_index,
        num_processes=accelerator.num_processes,
        seed=config.seed,
        buffer_size=config.shuffle_buffer,
    )


def get_collator(config: TrainingConfig, pairs, processor, cache, visual: VisualInputs | None = None):
    """The collator of `pairs`: a `StreamCollator` (decodes the streamed bytes) or a `CaptionCollator`."""
    collator = StreamCollator if isinstance(pairs, CaptionStream) else CaptionCollator
    return collator(processor, cache, training_family(config).vision_states_input, visual=visual)


def get_dataloader(
    config: TrainingConfig, pairs: CaptionPairs | CaptionStream, processor, cache, visual: VisualInputs | None = None
) -> DataLoader | StreamLoader:
    """Micro-batches of `config.batch_size` pairs, in an order fixed by (seed, epoch): call `set_epoch` every epoch.
    A `CaptionStream` gives a `StreamLoader` (hand it to `prepare_loader`, not `accelerator.prepare`).

    Args:
        config: The run's settings.
        pairs: The training pairs.
        processor: The model's processor.
        cache: The feature cache, or None.
        visual: What the model reads (`VisualInputs`; default: images or the cache).
    """
    # The loader draws its workers' base seed from its own generator: creating an iterator (again after a resume)
    # must not consume the global RNG that dropout uses, or a resumed run would diverge.
    streamed = isinstance(pairs, CaptionStream)
    loader = DataLoader(
        pairs,
        batch_size=config.batch_size,
        sampler=None if streamed else EpochPermutation(len(pairs), config.seed),
        num_workers=config.num_workers,
        collate_fn=get_collator(config, pairs, processor, cache, visual),
        drop_last=False,
        generator=torch.Generator().manual_seed(config.seed),
    )
    return StreamLoader(loader) if streamed else loader


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
    from .models import DEFAULT_FAMILY, get_family
    from .presets import get_preset

    if config.preset:
        family = get_preset(config.preset).family
        if config.family and config.family != family.name:
            raise ValueError(f"--family {config.family} does not match the preset {config.preset} ({family.name})")
        return family
    return get_family(config.family or DEFAULT_FAMILY)


def build_training_model(config: TrainingConfig):
    """What the run trains, built by its model family: the model (only what learns requires grad), the base it
    wraps, the processor and the family's settings (an `itune_hf.models.TrainingModel`).

    Raises:
        ValueError: for options of another model family (e.g. `--num-heads`, an I-Tuning setting, for XGPT).
    """
    family = training_family(config)
    if config.preset and config.vision_model and not family.takes_vision_model:
        from .models import families

        takers = " or ".join(f.title for f in families().values() if f.takes_vision_model)
        raise ValueError(
            f"--vision-model {config.vision_model} with --preset {config.preset}: only {takers} presets take other "
            f"weights for their vision tower ({config.preset} is {family.title}); drop one of them"
        )
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
# Validation
# ----------------------------------------------------------------------------------------------------------------
class BestModel:
    """Validation during training, keeping the model with the best CIDEr (and its card) in the output directory: the
    adapter for families saved as adapters, the whole checkpoint for the others.

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
        """The model (as its family saves it), processor and a card reporting `scores`, into the output directory (by
        the main process)."""
        if self.accelerator.is_main_process:
            from .cards import training_card
            from .hub import save_captioner

            save_captioner(
                self.accelerator.unwrap_model(model),
                Path(self.config.output_dir),
                processor=self.processor,
                card=training_card(self.card_config, self.facts, scores, step),
            )


#: The former name of `BestModel` (it also keeps full checkpoints), kept for existing imports.
BestAdapter = BestModel


# ----------------------------------------------------------------------------------------------------------------
# The training function
# ----------------------------------------------------------------------------------------------------------------


def train(config: TrainingConfig) -> dict[str, Any]:
    """Train a captioner of any family (an I-Tuning adapter, an XGPT model, a baseline); returns the summary also
    written to `train_summary.json`.

    Args:
        config: The run's settings.
    """
    from accelerate.utils import set_seed

    output_dir = Path(config.output_dir)
    accelerator, precision, runtime_note = _make_accelerator(config)
    checkpointer = Checkpointer(accelerator, output_dir, keep=config.keep_checkpoints)
    resume_from = prepare_output_dir(config, accelerator, checkpointer)
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
    if visual.reads_images and isinstance(pairs, CaptionPairs):  # an unreadable image is skipped, not fatal
        pairs.read_images(processor, config.max_unreadable)
    loader = get_dataloader(config, pairs, processor, cache, visual)
    epoch_length = EpochLength.of(config, pairs.padded_length, accelerator.num_processes)
    max_steps = config.max_steps or math.ceil(config.num_epochs * epoch_length.steps)
    optimizer = _make_optimizer(config, model)
    objective = _pretraining_objective(config, processor)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = prepare_loader(accelerator, loader)
    accelerator.print(f"runtime: {runtime_note}")

    if resume_from is not None:
        state = checkpointer.progress(resume_from, total_steps=max_steps)
    else:
        steps = _steps_for_run(config, model, pairs, processor, visual, accelerator, optimizer, max_steps, objective)
        state = TrainingState(total_steps=steps)
    scheduler = accelerator.prepare(_make_scheduler(config, optimizer, state.total_steps))
    checkpointer.save_only_trainable(model)
    if resume_from is not None:
        checkpointer.resume(resume_from)
        accelerator.print(f"resumed from {resume_from} (step {state.step}, epoch {state.epoch})")
    _record_settings(config, accelerator)
    accelerator.print(
        f"training {trainable:,} {facts.description} on {len(pairs):,} captions of {pairs.num_images:,} images; "
        f"{epoch_length.steps} steps per epoch, {state.total_steps} steps, {accelerator.num_processes} process(es)"
    )

    best = BestModel(
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
        atomic_write_json(output_dir / "train_summary.json", summary)
    prepared_model = weakref.ref(model)
    model = None  # this was the last reference to the prepared (DDP) model: it must be freed before the teardown
    _end_training(accelerator, prepared_model)
    if checkpointer.lock is not None:
        checkpointer.lock.release()
    return summary


def _steps_for_run(config: TrainingConfig, model, pairs, processor, visual, accelerator, optimizer, max_steps: int,
                   objective) -> int:  # fmt: skip
    """A new run's length: `max_steps`, or under `--time-budget` as many steps as fit, from a step measured on the
    first captions (one pass per pre-training task)."""
    if config.time_budget is None:
        return max_steps
    batch = get_collator(config, pairs, processor, None, visual)(pairs.first_items(config.batch_size))
    tasks = len(objective.tasks) if objective is not None else 1
    return _steps_for_budget(config, model, batch, accelerator, optimizer, max_steps, tasks)


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
        batches = skip_batches(accelerator, loader, state.batch_in_epoch)
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
    unused = config.pretraining or training_family(config).unused_parameters
    _forget_earlier_precision(precision)
    accelerator = Accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=unused)],
        mixed_precision=precision,
        log_with=None if config.report_to == "none" else config.report_to,
        project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "logs")),
    )
    return accelerator, precision, runtime_note


def _forget_earlier_precision(precision: str) -> None:
    """Let a run choose its mixed precision in a process where an earlier run (a `Trainer`, another `train()`, a
    notebook cell) chose another: Accelerate keeps that choice process-wide and refuses any other ("restart your
    runtime"). A single process starts Accelerate's state afresh (its device and process group are kept); a launched
    multi-process run keeps Accelerate's refusal, which names the flag."""
    from accelerate.state import AcceleratorState, PartialState

    state = AcceleratorState._shared_state
    earlier = state.get("_mixed_precision") if AcceleratorState._shared_state != PartialState._shared_state else None
    if earlier is not None and earlier != precision and PartialState._shared_state.get("num_processes", 1) == 1:
        AcceleratorState._reset_state(reset_partial_state=False)


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
        atomic_write_json(output_dir / "training_config.json", dataclasses.asdict(config))
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
    "BestAdapter", "BestModel", "CaptionCollator", "CaptionPairs", "CaptionStream", "Checkpointer", "EpochLength",
    "EpochPermutation", "StreamCollator", "StreamLoader", "TimeBudget", "TrainingConfig", "TrainingState",
    "build_training_model", "generate_captions", "get_dataloader", "launch_device", "load_splits",
    "measure_step_seconds", "prepare_loader", "score", "steps_within_budget", "train", "training_pairs",
]  # fmt: skip
