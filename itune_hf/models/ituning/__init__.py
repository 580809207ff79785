"""I-Tuning (Luo et al., ICASSP 2023): a frozen vision tower and a frozen causal LM joined by trainable
cross-attention modules in parallel to the LM's feed-forward blocks.

* `settings.py`: `ITuningSettings`, the module settings (pure Python).
* `configuration_ituning.py`, `modeling_ituning.py`, `processing_ituning.py`: the transformers model; they import only
  torch, transformers and each other (they are the remote code of full checkpoints), with copies of the shared files
  they need (`images.py`, `backbones.py`, `generation.py`, `text_inputs.py`, generated from `../_shared/`), and
  `packing.py` (padding-free batches for the caption loss; torch only, so it travels with the remote code too).
* The application half (how `itune train` builds it, its card, what the package plugs into the model's loading
  hooks) lives in `itune_hf/families/ituning/`, and the PEFT adapter type (with how an adapter is saved so that it
  loads on its own) in `itune_hf/adapter/`: named below by import path, never imported from here.

Names are imported on first use: importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from ...utils.lazy import lazy_exports
from .._shared import share_module
from ..registry import ModelFamily, register_family

share_module(__name__, "images")  # one ImageError for every family's processor (remote code keeps its own copy)

FAMILY = register_family(
    ModelFamily(
        name="ituning",
        model_type="ituning",
        description="I-Tuning: frozen vision tower + frozen causal LM, trainable cross-attention modules (adapter)",
        config_class=f"{__name__}.configuration_ituning:ITuningConfig",
        model_class=f"{__name__}.modeling_ituning:ITuningForCaptioning",
        processor_class=f"{__name__}.processing_ituning:ITuningProcessor",
        settings_class=f"{__name__}.settings:ITuningSettings",
        build_for_training="itune_hf.families.ituning.training:build_for_training",
        saves="adapter",
        save_adapter="itune_hf.adapter.saving:save_adapter",
        display_name="I-Tuning",
        card="itune_hf.families.ituning.card:CARD",
        describe_preset="itune_hf.families.ituning.card:describe_preset",
        explains="patches",
        takes_vision_model=True,
        onnx_graphs="itune_hf.onnx.graphs:ITUNING_GRAPHS",
        quantizes_frozen_lm=True,
        retrieval_prompts=True,
    )
)

_EXPORTS = {
    "ITuningSettings": "settings",
    "ITuningConfig": "configuration_ituning",
    "ITuningForCaptioning": "modeling_ituning",
    "ITuningModule": "modeling_ituning",
    "ITuningProcessor": "processing_ituning",
}
__all__ = ["FAMILY", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
