"""Adapter-only `Trainer` checkpoints of a native I-Tuning model: `Trainer(..., callbacks=[AdapterCheckpoints()])`.

`Trainer` saves a native `ITuningForCaptioning` whole in every checkpoint (frozen backbones included). This callback
runs right after each checkpoint is written and replaces the model's weight files with the adapter-only files of
`save_adapter` (`adapter_config.json` + `adapter_model.safetensors`: the I-Tuning weights only), which load with
`ITuningForCaptioning.from_pretrained(checkpoint)` and `PeftModel.from_pretrained(<bare base>, checkpoint)`, plus the
same weights under the native model's key names for Trainer's `resume_from_checkpoint` (`save_trainable_index`). The
optimizer, scheduler and trainer state files are left as Trainer wrote them.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .convert import ADAPTER_WEIGHTS_NAME, load_adapter_weights, save_adapter
from .weight_files import TRAINABLE_ONLY_MARK

#: The file of a native model's trainable weights in a resumable adapter checkpoint (see `save_trainable_index`).
TRAINABLE_WEIGHTS_NAME = "model-trainable.safetensors"

#: The files in which `save_pretrained` writes a model's weights (the index names its shards).
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class AdapterCheckpoints(TrainerCallback):
    """Make every `Trainer` checkpoint of a native `ITuningForCaptioning` adapter-only.

    A `PeftModel` (from `get_peft_model`) is saved adapter-only by Trainer already and is left alone, as are
    models of families saved whole (XGPT). `Trainer.train(resume_from_checkpoint=...)` resumes from these checkpoints
    (weights, optimizer, scheduler and data position): each also holds the trainable weights under the native
    model's key names (`model-trainable.safetensors` and a `model.safetensors.index.json` marked trainable-only,
    about the adapter's size again), which Trainer loads without strictness; it logs the frozen backbones' keys as
    missing, and they are: they come from the base. `load_best_model_at_end=True` works: the best checkpoint's
    adapter is loaded into the model when training ends.

    Args:
        processor: Saved into every checkpoint when given (Trainer saves its `processing_class` itself).
        resumable: Also write the trainable weights Trainer's resume reads (default); False keeps the adapter files
            only (half the size; a resume then needs the `PeftModel` route: train `get_peft_model(base, config)`).
    """

    def __init__(self, processor: Any | None = None, resumable: bool = True) -> None:
        self.processor = processor
        self.resumable = resumable
        self._load_best_at_end = False

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: Any = None, **kwargs: Any
    ) -> TrainerControl:
        """Take over `load_best_model_at_end` for a native model: Trainer's reload reads full weights, which these
        checkpoints do not hold, so `on_train_end` loads the best checkpoint's adapter instead (Trainer still tracks
        the best checkpoint by `metric_for_best_model`, and keeps it when rotating).

        Args:
            args: The `TrainingArguments` (`load_best_model_at_end` is switched off for the run and back on after).
            state: The `TrainerState`.
            control: The `TrainerControl`, returned unchanged.
            model: The model being trained.
            **kwargs: Trainer's other callback arguments.
        """
        if args.load_best_model_at_end and _is_native_ituning(model):
            self._load_best_at_end, args.load_best_model_at_end = True, False
        return control

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: Any = None, **kwargs: Any
    ) -> TrainerControl:
        """Load the best checkpoint's adapter into the model when `load_best_model_at_end` asked for it.

        Args:
            args: The `TrainingArguments`.
            state: The `TrainerState` (its `best_model_checkpoint`).
            control: The `TrainerControl`, returned unchanged.
            model: The model being trained.
            **kwargs: Trainer's other callback arguments.
        """
        if not self._load_best_at_end:
            return control
        self._load_best_at_end, args.load_best_model_at_end = False, True
        if state.best_model_checkpoint is not None:
            load_adapter_weights(model, Path(state.best_model_checkpoint) / ADAPTER_WEIGHTS_NAME)
        return control

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: Any = None, **kwargs: Any
    ) -> TrainerControl:
        """Replace the full model weights Trainer has just written into this step's checkpoint with adapter files.

        Args:
            args: The `TrainingArguments` (their `output_dir` holds the checkpoints).
            state: The `TrainerState` (its `global_step` names the checkpoint).
            control: The `TrainerControl`, returned unchanged.
            model: The model being trained.
            **kwargs: Trainer's other callback arguments.
        """
        if not args.should_save or not _is_native_ituning(model):
            return control
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if not folder.is_dir():
            raise FileNotFoundError(
                f"AdapterCheckpoints: no checkpoint folder {folder} after Trainer saved step {state.global_step}; "
                "it expects checkpoints under TrainingArguments.output_dir (not a hyperparameter-search run folder)"
            )
        remove_full_model(folder, model)
        save_adapter(model, folder, processor=self.processor)
        if self.resumable:
            save_trainable_index(model, folder)
        return control


def save_trainable_index(model: Any, folder: Path) -> None:
    """Write the native model's trainable (I-Tuning) weights under its own key names, with a
    `model.safetensors.index.json` that lists them and is marked trainable-only (`TRAINABLE_ONLY_MARK`): Trainer's
    `resume_from_checkpoint` loads it into the native model without strictness (the frozen backbones stay as the
    base gave them; Trainer logs them as missing keys), while the package still reads the folder as adapter-only.

    Args:
        model: The native `ITuningForCaptioning` being trained.
        folder: The checkpoint folder.
    """
    state = {
        f"ituning.{layer}.{name}": tensor.detach().contiguous().cpu()
        for layer, module in model.ituning.items()
        for name, tensor in module.state_dict().items()
    }
    save_file(state, str(folder / TRAINABLE_WEIGHTS_NAME), metadata={"format": "pt"})
    index = {
        "metadata": {
            "total_size": sum(tensor.numel() * tensor.element_size() for tensor in state.values()),
            TRAINABLE_ONLY_MARK: True,
            "note": "the trainable I-Tuning weights only, for Trainer's resume_from_checkpoint; the frozen "
            "backbones come from the base (adapter_config.json)",
        },
        "weight_map": {key: TRAINABLE_WEIGHTS_NAME for key in sorted(state)},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def _is_native_ituning(model: Any) -> bool:
    ituning = getattr(model, "ituning", None)
    return ituning is not None and len(ituning) > 0 and not hasattr(model, "get_base_model")


def remove_full_model(folder: Path, model: Any) -> None:
    """Delete what `model.save_pretrained` wrote into `folder`: its weight files (single files, or an index and its
    shards), `config.json` and the model's code files (its remote code), so that only adapter files describe it.

    Args:
        folder: A checkpoint folder.
        model: The saved model (its class's folder names the code files).
    """
    for index_name in WEIGHT_INDEXES:
        index = folder / index_name
        if index.is_file():
            for shard in set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()):
                (folder / shard).unlink(missing_ok=True)
            index.unlink()
    code = {path.name for path in Path(inspect.getfile(type(model))).parent.glob("*.py")}
    for name in (*WEIGHT_FILES, "config.json", *code):
        (folder / name).unlink(missing_ok=True)


__all__ = ["AdapterCheckpoints", "remove_full_model", "save_trainable_index"]
