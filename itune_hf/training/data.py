"""The training data: caption pairs (map-style) and streams (shards), the collators that turn them into
batches, the loaders Accelerate prepares, and the epoch's length."""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..data.verify import EmbeddedImage, embedded_images, image_label, open_item_image
from ..vision.inputs import VisualInputs, boxes_or_whole_image
from .config import DEFAULT_EVAL_SPLIT, TrainingConfig
from .model import training_family


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
        self._embedded = embedded_images(rows)  # the images a dataset holds (save_to_disk), read when fetched
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
        from ..models._shared.images import shortest_edge_of

        self._reading = (shortest_edge_of(getattr(processor, "image_processor", None)), max_unreadable)

    def _item(self, index: int) -> dict[str, Any]:
        row, caption = self.pairs[index]
        item = {"image_id": self.image_ids[row], "image_path": self.image_paths[row], "caption": caption, "row": row}
        if self._embedded is not None:
            item["image_data"] = EmbeddedImage(self._embedded, row)
        if self.boxes is not None:
            item["boxes"] = self.boxes[row]
        return item

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._reading is None:
            return self._item(index)
        from ..models._shared.images import ImageError

        for offset in range(len(self.pairs)):
            position = (index + offset) % len(self.pairs)
            row = self.pairs[position][0]
            if row in self._unreadable:
                continue
            item = self._item(position)
            try:
                item["image"] = open_item_image(item, shortest_edge=self._reading[0])
                return item
            except ImageError as error:
                self._skip(row, error.reason)
        raise ValueError(f"none of the {len(self.image_ids)} training images could be read")

    def _label(self, row: int) -> str:
        embedded = None if self._embedded is None else EmbeddedImage(self._embedded, row)
        return image_label(
            {"image_id": self.image_ids[row], "image_path": self.image_paths[row], "image_data": embedded}
        )

    def _skip(self, row: int, reason: str) -> None:
        import sys

        self._unreadable[row] = reason
        print(f"itune train: skipping unreadable image {self._label(row)}: {reason}", file=sys.stderr)
        limit = self._reading[1]
        if len(self._unreadable) > limit * len(self.image_ids):
            raise ValueError(
                f"stopped after {len(self._unreadable)} unreadable training images of {len(self.image_ids)} (the "
                f"others not all tried yet), more than --max-unreadable {limit} of them: fix or remove them "
                "(--verify-images lists them all up front)"
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
        #: the stream's shards this process reads, by position (`shard(contiguous=False)`: every num_processes-th)
        self.shard_indices = list(range(rank, rows.n_shards, num_processes))
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


class LengthGroupedPermutation(EpochPermutation):
    """`EpochPermutation` in batches of similar caption length (`--group-by-length`, as transformers'
    `group_by_length`): the epoch's random order is cut into mega-batches of `megabatch` batches, each is sorted by
    length (longest first) and cut into batches, and the full batches are shuffled; the one short batch an epoch can
    end with stays last, so that a `DataLoader` of `batch_size` cuts exactly these batches. Depends only on (seed,
    epoch), like its parent: resumable, identical on every rank (Accelerate deals whole batches to the processes).

    Args:
        lengths: Each pair's caption length in tokens (`caption_lengths`).
        batch_size: Pairs per micro-batch.
        seed: The run's seed.
        megabatch: Batches per sorted mega-batch (transformers' default: 50).
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int, megabatch: int = 50) -> None:
        super().__init__(len(lengths), seed)
        self.lengths, self.batch_size, self.megabatch = list(lengths), batch_size, megabatch

    def __iter__(self):
        return iter([index for batch in self.batches() for index in batch])

    def batches(self) -> list[list[int]]:
        """This epoch's batches, in order."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        span = self.megabatch * self.batch_size
        batches = []
        for start in range(0, self.size, span):
            chunk = sorted(order[start : start + span], key=lambda index: -self.lengths[index])
            batches += [chunk[k : k + self.batch_size] for k in range(0, len(chunk), self.batch_size)]
        short = [batch for batch in batches if len(batch) < self.batch_size]
        full = [batch for batch in batches if len(batch) == self.batch_size]
        return [full[i] for i in torch.randperm(len(full), generator=generator).tolist()] + short

    def typical_batch(self) -> list[int]:
        """`batch_size` pairs (fewer if there are not as many) whose length is nearest the mean padded length of
        the first epoch's batches: what a grouped step costs on average, for `--time-budget` to measure."""
        batches = self.batches()
        mean = sum(len(b) * max(self.lengths[i] for i in b) for b in batches) / max(1, self.size)
        return sorted(range(self.size), key=lambda index: abs(self.lengths[index] - mean))[: self.batch_size]


def caption_lengths(processor, captions: Sequence[str]) -> list[int]:
    """Each caption's length in the processor's tokens (in characters where it has no tokenizer)."""
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None:
        return [len(caption) for caption in captions]
    return [len(ids) for ids in tokenizer(list(captions), add_special_tokens=False)["input_ids"]]


class CaptionCollator:
    """Turns caption pairs into model inputs: what the model reads of the images (pixels or cached vision states,
    plus boxes, or precomputed regions: `itune_hf.vision.inputs`) and the tokenised captions.

    Args:
        processor: The model's processor.
        feature_cache: A `FeatureCache`; without one, images are opened and processed.
        vision_states_input: The model's keyword for cached vision states (its family's `vision_states_input`).
        visual: What the model reads (a `VisualInputs`, e.g. for XGPT's boxes or regions); given, it replaces
            `feature_cache` and `vision_states_input`.
        image_rows: Add each caption's image, its row in the training split, as `image_rows` (SCST scores samples
            against the image's references).
    """

    def __init__(
        self,
        processor,
        feature_cache=None,
        vision_states_input: str = "encoder_outputs",
        visual: VisualInputs | None = None,
        image_rows: bool = False,
    ) -> None:
        self.processor, self.image_rows = processor, image_rows
        self.visual = visual if visual is not None else VisualInputs("grid", feature_cache, vision_states_input)
        self.feature_cache, self.vision_states_input = self.visual.feature_cache, self.visual.vision_states_input

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = self.visual(self.processor, items, captions=[item["caption"] for item in items])
        if self.image_rows:
            batch["image_rows"] = torch.tensor([item["row"] for item in items])
        return batch


class StreamCollator(CaptionCollator):
    """A `CaptionCollator` for streamed items: decodes each item's `image` bytes first (in the DataLoader worker);
    an image that does not decode is reported (`BadShardWarning`, shard and key) and left out of its batch. A model
    that reads precomputed regions gets no image decoded."""

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        from ..data.webdataset import BadShardWarning, decode_image
        from ..models._shared.images import ImageError

        if self.visual.source == "regions":
            return super().__call__(items)

        decoded = []
        for item in items:
            try:
                decoded.append({**item, "image": decode_image(item)})
            except ImageError as error:
                warnings.warn(BadShardWarning(f"{error}; skipped"), stacklevel=2)
        if not decoded:
            from ..data import DataError

            raise DataError(f"no image of a batch decodes (shards {sorted({item['shard'] for item in items})})")
        return super().__call__(decoded)


NO_USABLE_PAIRS = "shards hold no usable pair: every sample was skipped (the warnings above name them)"


class ShortBatch(list):
    """The items of a DataLoader worker's last micro-batch of an epoch, shorter than the batch size and not collated:
    the `StreamLoader` joins the workers' short batches into full ones."""


class CollateFullBatches:
    """A streamed loader's `collate_fn`: collates a full micro-batch (in the worker) and hands a short one back as a
    `ShortBatch`.

    Args:
        collator: The stream's collator (`StreamCollator`).
        batch_size: Items per micro-batch.
    """

    def __init__(self, collator, batch_size: int) -> None:
        self.collator, self.batch_size = collator, batch_size

    def __call__(self, items: Sequence[dict[str, Any]]):
        return ShortBatch(items) if len(items) < self.batch_size else self.collator(items)


class StreamLoader:
    """Batches of a `CaptionStream` for the training loop: on the process's device, the same number on every process.

    Each DataLoader worker reads its own shards and ends its part of the epoch with a short batch; those are joined
    into full ones (collated in the main process), so an epoch is `ceil(pairs / batch_size)` micro-batches of a
    process's stream however many workers read it, as `EpochLength` counts it.

    Processes read different shards, so their epochs end at different batches; under DDP every process must take as
    many steps. A process whose stream ends first starts it over (its first batches again, as `DistributedSampler`
    pads with repeats) until every process's has ended: one all-reduce of a flag per batch.

    Args:
        loader: The `DataLoader` over the `CaptionStream`, its `collate_fn` a `CollateFullBatches`.
    """

    def __init__(self, loader: DataLoader) -> None:
        if not isinstance(loader.collate_fn, CollateFullBatches):
            raise TypeError(f"a StreamLoader needs a DataLoader whose collate_fn is a CollateFullBatches, not "
                            f"{type(loader.collate_fn).__name__}")  # fmt: skip
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

    def _full_batches(self):
        """The loader's batches, its workers' short ones joined into full ones (and at the end one short one)."""
        collate, size = self.loader.collate_fn.collator, self.loader.collate_fn.batch_size
        held: list[dict[str, Any]] = []
        for batch in self.loader:
            if not isinstance(batch, ShortBatch):
                yield batch
                continue
            held += batch
            if len(held) >= size:
                yield collate(held[:size])
                held = held[size:]
        if held:
            yield collate(held)

    def batches(self, skip: int = 0):
        """The epoch's batches after the first `skip` (read, collated and dropped: a resume lands on the same pair
        as the run it continues, at the cost of reading what it skips again)."""
        from accelerate.utils import send_to_device

        accelerator = self.accelerator
        several = accelerator is not None and accelerator.num_processes > 1
        iterator, finished, done = self._full_batches(), False, 0
        while True:
            batch = next(iterator, None)
            if batch is None:
                if not several:
                    if done == 0:  # an empty epoch: the run would go on through empty epochs for ever
                        raise ValueError(f"the {NO_USABLE_PAIRS}")
                    return
                finished, iterator = True, self._full_batches()  # pad with this process's first batches again
                batch = next(iterator, None)
                if batch is None:
                    raise ValueError(f"this process's {NO_USABLE_PAIRS}")
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
    from ..data import load_captions
    from ..data.args import column_options

    options = {"exclude_coco_split": config.exclude_coco_split} if config.exclude_coco_split else {}
    options.update(column_options(config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_captions(config.data, config.image_root, on_missing=config.on_missing, **options)
    for warning in caught:  # shown as usual; the reports of skipped images are counted below
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    train_split, eval_split = _split_named(config.train_split, loaded), _split_named(config.eval_split, loaded)
    if train_split not in loaded:
        raise ValueError(
            f"{config.data} has no {config.train_split!r} split (it has {', '.join(loaded)}); pass --train-split NAME"
        )
    if eval_split and eval_split not in loaded:
        if eval_split != DEFAULT_EVAL_SPLIT:  # named on purpose: a typo must not turn validation off
            raise ValueError(
                f"{config.data} has no {config.eval_split!r} split (it has {', '.join(loaded)}); pass --eval-split "
                "NAME, or --eval-split none to train without validation"
            )
        print(
            f"warning: {config.data} has no {eval_split!r} split (it has {', '.join(loaded)}): training without "
            "validation; pass --eval-split none to say so, or --eval-split NAME",
            file=sys.stderr,
        )
        eval_split = None
    splits = {name: loaded[name] for name in (train_split, eval_split) if name}
    if eval_split:
        splits[eval_split] = _referenced_only(splits[eval_split], f"{config.data} ({eval_split})")
        if splits[eval_split] is None:
            eval_split = None
    problems = [problem for w in caught if getattr(w.message, "report", None) for problem in w.message.report.problems]
    _refuse_unreadable(config, loaded, splits, problems)
    return splits[train_split], (splits[eval_split] if eval_split else None)


def _referenced_only(rows, where: str):
    """The validation rows that have reference captions (None when none has: no validation); the others are
    dropped with a warning naming them (validation scores against references; it stopped at the first of them,
    without a checkpoint)."""
    if not hasattr(rows, "column_names"):
        return rows  # streamed shards: every sample carries its caption
    keep = [index for index, captions in enumerate(rows["captions"]) if captions]
    if len(keep) == len(rows):
        return rows
    dropped = [image for image, captions in zip(rows["image_id"], rows["captions"]) if not captions]
    print(
        f"warning: {where}: {len(dropped)} images have no reference caption (e.g. "
        f"{', '.join(map(repr, dropped[:3]))}); "
        + ("validation leaves them out" if keep else "training without validation"),
        file=sys.stderr,
    )
    return rows.select(keep) if keep else None


def _split_named(name: str | None, loaded) -> str | None:
    """The split `name` means among `loaded`'s: itself, or the split its alias stands for (`validation`: `val`,
    `restval`: `train`, as the loaders name them)."""
    from ..data._common import split_named

    return name if name is None or name in loaded else split_named(name)


def _refuse_unreadable(config: TrainingConfig, loaded, splits: dict, problems: list) -> None:
    """Verify the splits' images (`verify_images`, in place) and refuse data more than `max_unreadable` unusable."""
    if not all(hasattr(part, "__len__") for part in loaded.values()):  # streamed shards
        _refuse_checks_of_a_stream(config)
        return  # bad samples are reported and skipped as they stream
    total = sum(len(part) for part in loaded.values()) + len(problems)
    if config.verify_images:
        from ..data import verify_images

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


def _refuse_checks_of_a_stream(config: TrainingConfig) -> None:
    """`--verify-images` and `--max-unreadable` count a split's images before training, which a stream cannot."""
    import dataclasses

    default = next(f.default for f in dataclasses.fields(config) if f.name == "max_unreadable")
    given = [flag for flag, on in (("--verify-images", config.verify_images),
                                   ("--max-unreadable", config.max_unreadable != default)) if on]  # fmt: skip
    if given:
        raise ValueError(
            f"{', '.join(given)}: {config.data} streams (WebDataset shards), so its images are not counted before "
            "training; its bad samples are reported and skipped as they stream: drop "
            f"{'them' if len(given) > 1 else 'it'}"
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
    from ..errors import InputError

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
            _check_uncached(config, pairs, cache)
            pairs.pairs = [pairs.pairs[i] for i in usable]
            accelerator.print(
                f"{len(pairs.image_ids) - len(set(pairs.image_ids) & set(cache.image_ids()))} training "
                f"images are not in the feature cache (unreadable when it was built) and are skipped"
            )
    return pairs


def _check_uncached(config: TrainingConfig, pairs: CaptionPairs, cache) -> None:
    """Refuse training images the feature cache neither holds nor lists as unreadable (`failed.json`): it was built
    from other (or fewer) images, and training would quietly leave them out."""
    from ..errors import InputError

    known = set(cache.image_ids()) | set(cache.failed)
    missing = sorted({image_id for image_id in pairs.image_ids if image_id not in known})
    if missing:
        shown = ", ".join(map(repr, missing[:3]))
        raise InputError(
            f"--feature-cache {config.feature_cache}: lacks {len(missing)} training images of {config.data} "
            f"({config.train_split} split) that it does not list as unreadable (e.g. {shown}): it was built from "
            f"other images; add them with itune cache-features --data {config.data} --output-dir {config.feature_cache}"
        )


def _stream_pairs(config: TrainingConfig, rows, cache, accelerator, visual: VisualInputs) -> CaptionStream:
    where = f"{config.data} ({config.train_split} split)"
    if cache is not None:
        raise ValueError(f"--feature-cache: {where} is streamed (shards); a feature cache needs map-style data")
    if config.max_train_images:
        raise ValueError(f"--max-train-images: {where} is streamed (shards); name fewer shards in --data instead")
    if visual.source != "regions":  # region features are looked up batch by batch
        visual.check_rows(rows, where)
    stream = CaptionStream(
        rows,
        num_pairs=stream_length(rows, config, accelerator),
        rank=accelerator.process_index,
        num_processes=accelerator.num_processes,
        seed=config.seed,
        buffer_size=config.shuffle_buffer,
    )
    if accelerator.num_processes > 1:  # every process (on every node) says which shards are its own
        print(f"process {accelerator.process_index} of {accelerator.num_processes} reads "
              f"{_shard_names(config, stream.shard_indices, rows.n_shards)}", flush=True)  # fmt: skip
    return stream


def _shard_names(config: TrainingConfig, indices: list[int], count: int) -> str:
    """`indices` of the stream's `count` shards, by file name where `--data` names shard files."""
    from ..data.webdataset import find_shards, looks_like_shards

    files = find_shards(config.data) if looks_like_shards(config.data) else []
    names = [files[i].name for i in indices] if len(files) == count else [f"#{i}" for i in indices]
    return f"{len(indices)} of the {count} shards: {', '.join(names)}"


def get_collator(config: TrainingConfig, pairs, processor, cache, visual: VisualInputs | None = None):
    """The collator of `pairs`: a `StreamCollator` (decodes the streamed bytes) or a `CaptionCollator` (with each
    caption's image row for SCST)."""
    if isinstance(pairs, CaptionStream):
        if config.group_by_length:
            raise ValueError(
                f"--group-by-length: {config.data} is streamed (shards), read in shard order through a shuffle "
                "buffer, so its captions cannot be grouped by length; drop --group-by-length or train on map-style "
                "data (a dataset.json, a Hugging Face dataset)"
            )
        if config.objective == "scst":
            raise ValueError(
                f"--objective scst: {config.data} is streamed (shards), but SCST scores each sample against all the "
                "references of its image; train on map-style data (a dataset.json, a Hugging Face dataset)"
            )
        return StreamCollator(processor, cache, training_family(config).vision_states_input, visual=visual)
    vision_states_input = training_family(config).vision_states_input
    return CaptionCollator(processor, cache, vision_states_input, visual=visual, image_rows=config.objective == "scst")


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
    collator = get_collator(config, pairs, processor, cache, visual)
    loader = DataLoader(
        pairs,
        batch_size=config.batch_size,
        sampler=None if streamed else training_sampler(config, pairs, processor),
        num_workers=config.num_workers,
        collate_fn=CollateFullBatches(collator, config.batch_size) if streamed else collator,
        drop_last=False,
        generator=torch.Generator().manual_seed(config.seed),
    )
    return StreamLoader(loader) if streamed else loader


def training_sampler(config: TrainingConfig, pairs: CaptionPairs, processor) -> EpochPermutation:
    """The order of map-style pairs: a fresh permutation every epoch, grouped by caption length with
    `--group-by-length`."""
    if not config.group_by_length:
        return EpochPermutation(len(pairs), config.seed)
    captions = [caption for _, caption in pairs.pairs]
    return LengthGroupedPermutation(caption_lengths(processor, captions), config.batch_size, config.seed)


def measured_items(config: TrainingConfig, pairs, loader) -> list[dict[str, Any]]:
    """The micro-batch `--time-budget` times a step on: the first pairs, or under `--group-by-length` pairs of the
    mean padded length (the first pairs, of mixed lengths, are padded far more than a grouped step is on average)."""
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, LengthGroupedPermutation):
        return [pairs[index] for index in sampler.typical_batch()]
    return pairs.first_items(config.batch_size)


class EpochLength(NamedTuple):
    """An epoch's length in micro-batches (of each process) and in optimizer steps."""

    micro_batches: int
    steps: int

    @classmethod
    def of(cls, config: TrainingConfig, num_pairs: int, num_processes: int) -> EpochLength:
        micro_batches = math.ceil(num_pairs / (config.batch_size * num_processes))
        return cls(micro_batches, math.ceil(micro_batches / config.gradient_accumulation_steps))
