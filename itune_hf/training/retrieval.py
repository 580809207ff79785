"""Retrieval augmentation in training (`itune train --retrieval train|DIR`): each image's prompt is the captions of
its nearest datastore images (`itune_hf.vision.datastore`), never its own or its near-duplicate group's."""

from __future__ import annotations

import dataclasses

from .config import TrainingConfig
from .model import training_family


def retrieval_inputs(config: TrainingConfig, visual, processor, cache, train_rows, eval_rows, log=print):
    """`visual` with every training and validation image's retrieval prompt, and the datastore they came from
    (None, unchanged `visual`, without `--retrieval`).

    Args:
        config: The run's settings (`retrieval`, `retrieval_k`, `feature_cache`, `data`).
        visual: The run's `VisualInputs`.
        processor: The model's processor (the prompts' token budget).
        cache: The run's `FeatureCache` (pooled tower features are the keys and queries).
        train_rows: The training split (map-style).
        eval_rows: The validation split, or None.
        log: Prints the line saying what the prompts retrieve from (the main process's `accelerator.print`).

    Raises:
        ValueError: retrieval asked of a family whose LM reads no prompt, without a feature cache, or on streamed
            shards; a datastore made by another tower.
    """
    if config.retrieval is None:
        return visual, None
    from ..data.karpathy import read_groups
    from ..vision.datastore import CaptionDatastore, prompt_token_budget

    family = training_family(config)
    if not family.retrieval_prompts:
        raise ValueError(
            f"--retrieval: retrieval augmentation gives I-Tuning's LM the retrieved captions as a prompt; the "
            f"{family.title} family reads none. Train an I-Tuning preset, or drop --retrieval"
        )
    if cache is None:
        raise ValueError(
            "--retrieval compares pooled vision-tower features, read from a feature cache: pass --feature-cache "
            "(itune cache-features --preset P --data D --output-dir CACHE makes one)"
        )
    if not hasattr(train_rows, "column_names"):
        raise ValueError(f"--retrieval: {config.data} is streamed (shards); retrieval needs map-style data")
    groups = read_groups(config.data)
    if config.retrieval == "train":
        ids = list(train_rows["image_id"])
        store = CaptionDatastore.from_cache(
            cache, ids, train_rows["captions"], [groups.get(i) for i in ids],
            tower={"feature_cache": str(config.feature_cache), **cache.fingerprint, "data": str(config.data)},
            k=config.retrieval_k,
        )  # fmt: skip
    else:
        store = dataclasses.replace(CaptionDatastore.load(config.retrieval), k=config.retrieval_k)
    ids = list(train_rows["image_id"]) + (list(eval_rows["image_id"]) if eval_rows is not None else [])
    prompts = store.prompts(cache, ids, groups=[groups.get(i) for i in ids])
    visual = dataclasses.replace(visual, prompts=prompts, prompt_tokens=prompt_token_budget(processor, prompts))
    log(f"retrieval: {store.k} captions per prompt from a datastore of {len(store):,} images (not their own group)")
    return visual, store


__all__ = ["retrieval_inputs"]
