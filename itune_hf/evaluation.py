"""Captioning a split and scoring the captions: used by `itune eval`, the demo and validation during training.

`generate_captions` shards the images over Accelerate's processes and gathers the captions on every rank; `score` runs
the coco-caption metrics (`itune_hf.metrics`) against the split's references; `shuffled_control` scores the same
captions against the references (and scenes) of other images, to show how much of a score depends on the image.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import torch


def decoding(num_beams: int | None) -> dict[str, int]:
    """The `generate` keywords of a beam size chosen by a user, or none: the model's generation config then decides
    (each family's is its paper's test setting: 5 beams for I-Tuning, ClipCap and cross-attention, 2 for XGPT).

    Args:
        num_beams: Beam size, or None for the model's own.
    """
    return {} if num_beams is None else {"num_beams": num_beams}


def caption_length(max_new_tokens: int | None) -> dict[str, int]:
    """The `generate` keywords of a caption length chosen by a user, or none: the model's generation config then
    decides (`max_new_tokens=None` given to `generate` would unset it, leaving transformers' 20 tokens in all).

    Args:
        max_new_tokens: Longest caption, or None for the model's own.
    """
    return {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}


def check_caption_length(
    model, max_new_tokens: int | None, flag: str = "--max-new-tokens", prompt_tokens: int = 1
) -> None:
    """Refuse, before decoding, a caption longer than the positions the model's LM has (every family: the LM's
    `n_positions` / `max_position_embeddings`, less the prompt, the start token at least, and a ClipCap prefix).

    Args:
        model: The captioner.
        max_new_tokens: The longest caption asked for (None: the model's generation config).
        flag: The option that asked for it.
        prompt_tokens: The decoder's tokens before the caption (`decoder_input_ids`' width: the start token and any
            prompt).

    Raises:
        InputError: naming `flag`, the value and the longest caption the model can give.
    """
    from .errors import InputError

    if max_new_tokens is None:
        max_new_tokens = getattr(getattr(model, "generation_config", None), "max_new_tokens", None)
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    positions = getattr(text, "n_positions", None) or getattr(text, "max_position_embeddings", None)
    if max_new_tokens is None or not isinstance(positions, int):
        return
    taken = prompt_tokens + int(getattr(model.config, "prefix_length", 0) or 0)  # (and a ClipCap prefix)
    if max_new_tokens + taken > positions:
        raise InputError(
            f"{flag} {max_new_tokens}: the captioner's language model has {positions} positions ({taken} taken "
            f"before the caption), so a caption has at most {positions - taken} tokens; ask for at most that"
        )


def generate_captions(
    model,
    processor,
    rows,
    *,
    batch_size: int = 32,
    num_beams: int | None = 1,
    max_new_tokens: int | None = None,
    feature_cache=None,
    accelerator=None,
    progress: bool = True,
    region_features=None,
    skipped: list[dict[str, str]] | None = None,
    prompts: Mapping[str, str] | None = None,
    num_return_sequences: int = 1,
    generate: Callable[..., torch.Tensor] | None = None,
) -> dict[str, str] | dict[str, list[str]]:
    """Caption every image of `rows` (split across ranks under Accelerate, gathered on every rank).

    An image that cannot be read (missing, undecodable, truncated, refused by the size limits of `open_image`) is
    skipped, not fatal: it gets no caption, and is listed in `skipped` (or warned about when `skipped` is None).

    The model's `visual_source` (XGPT) says what it reads (`itune_hf.vision.inputs`): images (or their cached vision
    states), plus each row's `boxes` for `"boxes"`, or `region_features` for `"regions"`.

    Args:
        model: A captioning model (`ITuningForCaptioning`, `XGPTForCaptioning`) or a PEFT model wrapping one (already
            unwrapped from DDP).
        processor: Its processor.
        rows: Dataset rows with `image_id` and `image_path` (and `boxes` for a model that pools in boxes).
        batch_size: Images per `generate` call.
        num_beams: Beam size (1: greedy; None: the model's generation config, its family's paper setting).
        max_new_tokens: Longest caption (None: the model's generation config).
        feature_cache: Use cached vision states instead of images when given.
        accelerator: Shard the work over its processes and gather the captions.
        progress: Show a progress bar on the main process.
        region_features: The `RegionFeatures` a model with `visual_source="regions"` reads (required for it).
        skipped: A list that receives `{image_id, image_path, reason}` for every image skipped (on every rank).
        prompts: Image id -> the prompt its caption continues (a retrieval-augmented model's retrieved captions,
            `vision.datastore`); the returned captions leave the prompt out.
        num_return_sequences: Captions kept per image (at most `num_beams` under beam search): above 1, each image
            gets the list of its beam's finished captions, best first (an n-best list, e.g. for reranking).
        generate: How a batch is decoded, called as `generate(model, **generate_kwargs)`; default `model.generate`.
            `itune eval` passes the decoding path `--decoding` chooses (`itune_hf.inference.fast_generate`).

    Returns:
        Image id -> caption (or its n-best list, when `num_return_sequences` is above 1), for the images that could
        be read.

    Raises:
        ValueError: the inputs do not fit the model's visual source (e.g. rows without boxes for `"boxes"`).
    """
    from .vision.inputs import VisualInputs

    check_caption_length(model, max_new_tokens)
    _check_return_sequences(model, num_beams, num_return_sequences)
    visual = VisualInputs.for_model(model, feature_cache=feature_cache, regions=region_features)
    if prompts is not None:
        visual = dataclasses.replace(visual, prompts=prompts)
    visual.check_rows(rows, "the rows to caption")
    items = visual.items(rows)
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    decoding_args = (generate or _generate, num_beams, max_new_tokens, num_return_sequences)
    captions, unreadable = _caption_shard(
        model, processor, visual, items[rank::world], batch_size, decoding_args, progress and rank == 0
    )
    if accelerator is not None and world > 1:
        captions, unreadable = _gather(captions, unreadable)
        order = {image_id: index for index, image_id in enumerate(rows["image_id"])}  # the rows' order, as one
        captions = dict(sorted(captions.items(), key=lambda item: order.get(item[0], len(order))))  # process gives
    _hand_over(unreadable, skipped)
    return captions


def _caption_shard(model, processor, visual, items, batch_size: int, decoding_args: tuple, progress: bool):
    """Caption this process's `items` batch by batch, the model in eval mode meanwhile; returns (image id ->
    caption or n-best list, the images that could not be read)."""
    from tqdm.auto import tqdm

    device = next(p for p in model.parameters()).device
    was_training = model.training
    model.eval()
    captions: dict[str, str | list[str]] = {}
    unreadable: list[dict[str, str]] = []
    bar = tqdm(total=len(items), desc="captioning", unit="image", disable=not progress, leave=False)
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        readable, bad = visual.open_items(processor, chunk)
        unreadable += bad
        if readable:
            texts = _caption_batch(model, processor, visual, readable, device, *decoding_args)
            captions.update(zip((item["image_id"] for item in readable), texts))
        bar.update(len(chunk))
    bar.close()
    model.train(was_training)
    return captions, unreadable


def _check_return_sequences(model, num_beams: int | None, num_return_sequences: int) -> None:
    """Refuse an n-best list longer than the beam (`num_beams` None: the model's own beam count)."""
    beams = num_beams or model.generation_config.num_beams or 1
    if num_return_sequences > beams:
        raise ValueError(
            f"num_return_sequences={num_return_sequences} needs at least as many beams (num_beams={beams}): "
            "raise num_beams"
        )


def _generate(model, **generate_kwargs) -> torch.Tensor:
    return model.generate(**generate_kwargs)


def _caption_batch(
    model,
    processor,
    visual,
    items,
    device,
    generate,
    num_beams,
    max_new_tokens: int | None,
    num_return_sequences: int = 1,
) -> list[str] | list[list[str]]:
    """The captions of one batch of readable `items`, in item order: one each, or a list of `num_return_sequences`
    each when that is above 1; a prompt (retrieval's, left-padded to one width) is cut off."""
    inputs = visual(processor, items, text=[None] * len(items))
    inputs = {k: v.to(device) for k, v in inputs.items()}
    extra = {"num_return_sequences": num_return_sequences} if num_return_sequences > 1 else {}
    with torch.no_grad():
        out = generate(model, **inputs, **decoding(num_beams), **caption_length(max_new_tokens), **extra)
    if visual.prompts is not None:
        out = out[:, inputs["decoder_input_ids"].shape[1] :]
    texts = processor.batch_decode(out)
    if num_return_sequences == 1:
        return texts
    return [texts[i : i + num_return_sequences] for i in range(0, len(texts), num_return_sequences)]


def _hand_over(unreadable: list[dict[str, str]], skipped: list | None) -> None:
    """Put the unreadable images in the caller's `skipped` list, or warn about them when it passed none."""
    if skipped is not None:
        skipped.extend(unreadable)
    elif unreadable:
        import warnings

        warnings.warn(
            f"{len(unreadable)} images could not be read and were not captioned, e.g. {unreadable[0]['image_path']}: "
            f"{unreadable[0]['reason']}",
            stacklevel=3,
        )


def _gather(captions: dict[str, str | list[str]], unreadable: list[dict[str, str]]) -> tuple[dict, list]:
    """Every rank's captions and unreadable images, on every rank."""
    from accelerate.utils import gather_object

    # Ranks take disjoint strided shards with no padding, so a plain object gather is exact (what
    # gather_for_metrics would do after dropping the duplicated samples an evenly padded loader adds).
    merged: dict[str, str | list[str]] = {}
    merged_unreadable: list[dict[str, str]] = []
    for part, bad in gather_object([(captions, unreadable)]):
        merged.update(part)
        merged_unreadable += bad
    return merged, merged_unreadable


def score(
    captions: dict[str, str], rows, metrics: Sequence[str] | None = None, scenes: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """coco-caption scores (unscaled, coco-caption key names) of `captions` against the references in `rows`.

    Args:
        captions: Image id -> caption.
        rows: Dataset rows with `image_id` and `captions` (the references).
        metrics: Metric names; by default the fast ones (`itune_hf.metrics.FAST_METRICS`: no Java), and the scene
            metrics that read the given `scenes` (`scene_metrics_for`: `Objects` for a generated world's,
            `ContentWords` for a clip-art corpus's content words).
        scenes: Image id -> recorded scene (`itune_hf.data.scenes.scenes_of_data`), for the scene metrics.
    """
    from .metrics import FAST_METRICS, scene_metrics_for, score_captions

    if metrics is None:
        metrics = FAST_METRICS + scene_metrics_for(scenes)

    references = {i: list(c) for i, c in zip(rows["image_id"], rows["captions"]) if i in captions}
    return score_captions({i: captions[i] for i in references}, references, metrics=metrics, scenes=scenes)


#: The seed of the derangement `shuffled_control` scores against (fixed: every run compares the same pairs).
SHUFFLE_SEED = 0


def derangement(count: int, seed: int = SHUFFLE_SEED) -> list[int]:
    """A random permutation of `range(count)` that moves every index (Sattolo's algorithm: one cycle).

    Args:
        count: How many items (at least 2).
        seed: Seed of the permutation.

    Raises:
        ValueError: fewer than 2 items (one cannot be moved).
    """
    if count < 2:
        raise ValueError(f"a derangement needs at least 2 items; got {count}")
    order, rng = list(range(count)), random.Random(seed)
    for index in range(count - 1, 0, -1):
        other = rng.randrange(index)
        order[index], order[other] = order[other], order[index]
    return order


def shuffled_control(
    captions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    metrics: Sequence[str],
    scenes: Mapping[Hashable, Any] | None = None,
    seed: int = SHUFFLE_SEED,
) -> dict[str, float | str]:
    """Scores of `captions` against the references and scenes of other images: image `i`'s caption is scored
    against those of image `derangement(...)[i]`. A captioner that ignores its image scores as well here.

    Args:
        captions: Image id -> caption.
        references: Image id -> reference captions (every captioned image).
        metrics: Metric names.
        scenes: Image id -> recorded scene, moved with the references; None: none.
        seed: Seed of the derangement.
    """
    from .metrics import score_captions

    ids = list(captions)
    other = {key: ids[index] for key, index in zip(ids, derangement(len(ids), seed))}
    moved_scenes = None if scenes is None else {key: scenes[other[key]] for key in ids if other[key] in scenes}
    moved = {key: references[other[key]] for key in ids}
    return score_captions(dict(captions), moved, metrics=metrics, scenes=moved_scenes)


#: The grounded metrics `constant_caption_floor` chooses a caption by: metric -> the floor's key for that caption
#: (its test scores under the same key + `_scores`).
GROUNDED_CAPTIONS: dict[str, str] = {"Objects": "object_caption", "ContentWords": "words_caption"}


def constant_caption_floor(
    train: Mapping[Hashable, Sequence[str]],
    test: Mapping[Hashable, Sequence[str]],
    *,
    scenes: Mapping[Hashable, Any] | None = None,
    candidates: int = 300,
) -> dict[str, Any]:
    """What a captioner that ignores its image scores: of the `candidates` most frequent training captions, the one
    with the best CIDEr-D on the training split, written for every test image, and its test scores; given `scenes`,
    also the one with the best grounded F1 on the training split, by the scene metric that reads them
    (`scene_metrics_for`): `object_caption` (best object F1; a generated world's scenes) or `words_caption` (best
    content-word F1; a clip-art corpus's content words), with its test scores (`object_caption_scores`,
    `words_caption_scores`). Where that metric is unavailable on the training split (an image without a record), no
    caption is chosen by it: the caption is None and its scores hold the reason.

    Args:
        train: Image id -> reference captions of the training split (the constants are chosen there).
        test: Image id -> reference captions of the split it is scored on.
        scenes: Image id -> recorded scene (or content words), for both splits; None: CIDEr-D only.
        candidates: How many of the most frequent training captions are tried.
    """
    from collections import Counter

    from .metrics import CaptionScorer, get_metric, scene_metrics_for, tokenize_captions

    grounded = [name for name in scene_metrics_for(scenes) if name in GROUNDED_CAPTIONS]
    metrics = ["CIDEr", *grounded]
    tokenized = {name: _tokenized(refs, tokenize_captions) for name, refs in (("train", train), ("test", test))}
    pool = [c for c, _ in Counter(c for refs in train.values() for c in refs).most_common(candidates)]
    pool_tokens = dict(zip(pool, tokenize_captions(pool)))
    with CaptionScorer(metrics, tokenized=True) as scorer:

        def scores(caption: str, split: str) -> dict[str, Any]:
            refs = tokenized[split]
            return scorer.score(dict.fromkeys(refs, pool_tokens[caption]), refs, scenes=scenes).scores

        on_train = {caption: scores(caption, "train") for caption in pool}
        best = max(pool, key=lambda c: on_train[c]["CIDEr"])
        floor = {"caption": best, **scores(best, "test")}
        for name in grounded:
            key, field = get_metric(name).card_key, GROUNDED_CAPTIONS[name]
            reason = on_train[pool[0]][key]
            if isinstance(reason, str):  # "unavailable: <reason>" on the training split
                floor[field], floor[f"{field}_scores"] = None, {key: reason}
                continue
            chosen = max(pool, key=lambda c, key=key: on_train[c][key])
            floor[field], floor[f"{field}_scores"] = chosen, scores(chosen, "test")
    return floor


def _tokenized(references: Mapping[Hashable, Sequence[str]], tokenize) -> dict[Hashable, list[str]]:
    """Each image's references, PTB-tokenised in one call."""
    flat = iter(tokenize([r for refs in references.values() for r in refs]))
    return {key: [next(flat) for _ in refs] for key, refs in references.items()}


__all__ = [
    "GROUNDED_CAPTIONS",
    "SHUFFLE_SEED",
    "constant_caption_floor",
    "derangement",
    "generate_captions",
    "score",
    "shuffled_control",
]
