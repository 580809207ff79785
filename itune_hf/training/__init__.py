"""Training captioners with Accelerate: one CPU, one GPU, DDP, FSDP or several nodes.

What trains is the family's choice (`ModelFamily.build_for_training`): I-Tuning's modules (both backbones frozen),
XGPT whole but its vision tower, a baseline's mapper or cross-attention. The loop follows the Accelerate examples:
`get_dataloader` -> one `prepare()` -> `accumulate` / `backward` / clip / step, validation gathered across ranks with
the best model saved through `unwrap_model` on the main process, checkpoints through `save_state` (trainable weights,
optimizer, scheduler, every rank's RNG states). Data order is a pure function of (seed, epoch), so `--resume`
continues bit-for-bit where a run stopped. One concern per file:

* `loop.py`: `train()`, read top to bottom.
* `data.py`: caption pairs and streams, collators, loaders, the epoch's length.
* `model.py`: what the run trains, built by its family; the feature cache it reads.
* `validation.py`: `BestModel`, validation and the kept best model.
* `accelerator.py`: the `Accelerator`, optimizer, schedule, recorded settings, summary and the run's end.
* `budget.py`: `--time-budget` (a measured step sizes the run; a running run stops in time).
* `peers.py`: the run's processes: a rank gone named in one line (`PeerLost`), an elastic restart resuming.

Output directory::

    adapter_config.json, adapter_model.safetensors, config.json, processor files, README.md   the best model
    training_config.json, train_summary.json                                                  settings, results
    backbones/<vision|text>/         frozen backbones without a reference (e.g. the demo's random vision tower)
    checkpoints/step-0000200/        resumable state (only trainable weights are stored)
    logs/                            TensorBoard

Names are imported on first use: `from itune_hf.training import train` imports the loop, not every file.
"""

from __future__ import annotations

from ..utils.lazy import lazy_exports

_EXPORTS = {
    "BestAdapter": "validation",
    "BestModel": "validation",
    "CaptionCollator": "data",
    "CaptionPairs": "data",
    "CaptionStream": "data",
    "EpochLength": "data",
    "EpochPermutation": "data",
    "LengthGroupedPermutation": "data",
    "StreamCollator": "data",
    "StreamLoader": "data",
    "get_dataloader": "data",
    "load_splits": "data",
    "prepare_loader": "data",
    "training_pairs": "data",
    "build_training_model": "model",
    "training_family": "model",
    "train": "loop",
    "launch_device": "accelerator",
    "PeerLost": "peers",
    "TimeBudget": "budget",
    "measure_step_seconds": "budget",
    "steps_within_budget": "budget",
    # defined elsewhere, also importable from here
    "Checkpointer": "checkpoints",
    "TrainingState": "checkpoints",
    "TrainingConfig": "config",
    "MIXED_PRECISION": "config",
    "SCHEDULES": "config",
    "generate_captions": "itune_hf.evaluation",
    "score": "itune_hf.evaluation",
}
__all__ = sorted(name for name in _EXPORTS if name not in ("MIXED_PRECISION", "SCHEDULES"))

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
