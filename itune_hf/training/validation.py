"""Validation during training: captions of the validation split scored across processes, the best model kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..data.scenes import scenes_of_data
from ..evaluation import generate_captions, score
from ..metrics.registry import PRIMARY_METRIC
from ..vision.inputs import VisualInputs
from . import sharding
from .checkpoints import TrainingState


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
        prompts: Image id -> retrieval prompt of a retrieval-augmented run (`training.retrieval`), or None.
        datastore: Its `CaptionDatastore`, saved with the model (under `datastore/`), or None.

    Raises:
        ValueError: naming the data, when the validation rows lack boxes or region features the model reads.
    """

    def __init__(
        self, config, accelerator, processor, rows, cache, *, facts, precision: str, regions=None, prompts=None,
        datastore=None,
    ) -> None:  # fmt: skip
        if rows is not None and config.eval_max_images:
            rows = rows.select(range(min(config.eval_max_images, len(rows))))
        if rows is not None:
            visual = VisualInputs.for_model(facts.config, feature_cache=cache, regions=regions)
            visual.check_rows(rows, f"{config.data} ({config.eval_split} split)")
        self.config, self.accelerator, self.processor = config, accelerator, processor
        self.rows, self.cache, self.regions = rows, cache, regions
        # a generated world's scenes: the scene metrics are validated (and on the card) beside CIDEr
        self.scenes = scenes_of_data(config.data) if rows is not None else None
        self.card_config = dataclasses.replace(config, mixed_precision=precision)
        self.facts = facts
        self.prompts, self.datastore = prompts, datastore

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
            prompts=self.prompts,
        )
        return score(captions, self.rows, scenes=self.scenes)

    def record(self, state: TrainingState, scores: dict[str, Any] | None) -> bool:
        """Record `scores` in `state` (history, best step) and log them; return whether the model is to be saved:
        they are the best so far, or, without scores, the run is done."""
        if scores is None:
            return state.done
        self.accelerator.log({f"val/{k}": v for k, v in scores.items() if isinstance(v, float)}, step=state.step)
        state.history.append({"step": state.step, "val": scores})
        metric = scores[PRIMARY_METRIC]
        self.accelerator.print(f"step {state.step}: validation {PRIMARY_METRIC} {metric:.4f}")
        if state.best_metric is None or metric > state.best_metric:
            state.best_metric, state.best_step = metric, state.step
            return True
        return False

    def save(self, model, step: int, scores: dict[str, Any] | None) -> None:
        """The model (as its family saves it), processor and a card reporting `scores`, into the output directory (by
        the main process; call it on every rank: under FSDP they gather the shards first)."""
        whole = {"state_dict": sharding.gathered_state_dict(model)} if sharding.is_fsdp(self.accelerator) else {}
        if self.accelerator.is_main_process:
            from ..hub import save_captioner
            from ..hub.cards import training_card

            save_captioner(
                self.accelerator.unwrap_model(model),
                Path(self.config.output_dir),
                processor=self.processor,
                card=training_card(self.card_config, self.facts, scores, step, self.accelerator.num_processes),
                **whole,
            )
            if self.datastore is not None:  # the model reads its prompts from it: it travels with the model
                from ..vision.datastore import DATASTORE_DIR

                self.datastore.save(Path(self.config.output_dir) / DATASTORE_DIR)


#: Another name for `BestModel` (it also keeps full checkpoints), for code that imports it by this name.
BestAdapter = BestModel


# ----------------------------------------------------------------------------------------------------------------
# The training function
