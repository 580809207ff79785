"""XGPT (Xia et al., "XGPT: Cross-modal Generative Pre-Training for Image Captioning"): one Transformer, shared by
encoder and decoder, over image regions (from a frozen vision tower's patch tokens, or precomputed), trained whole
apart from the vision tower.

* `settings.py`: `XGPTSettings`, the architecture switches the paper ablates (pure Python).
* `configuration_xgpt.py`, `modeling_xgpt.py`, `processing_xgpt.py`: the transformers model; they import only torch,
  transformers and each other (they are the remote code of full checkpoints), with copies of the shared files they
  need (`images.py`, `backbones.py`, `generation.py`, `text_inputs.py`, generated from `../_shared/`).
* How `itune train` builds it (the whole model from a preset; saved as a full checkpoint) and what its cards say
  live in `itune_hf/families/xgpt/`, named below by import path: this package never imports them.

Names are imported on first use: importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from ...utils.lazy import lazy_exports
from .._shared import share_module
from ..registry import ModelFamily, register_family

share_module(__name__, "images")  # one ImageError for every family's processor (remote code keeps its own copy)

FAMILY = register_family(
    ModelFamily(
        name="xgpt",
        model_type="xgpt",
        description="XGPT: one Transformer shared by encoder and decoder over image regions, trained whole",
        config_class=f"{__name__}.configuration_xgpt:XGPTConfig",
        model_class=f"{__name__}.modeling_xgpt:XGPTForCaptioning",
        processor_class=f"{__name__}.processing_xgpt:XGPTProcessor",
        settings_class=f"{__name__}.settings:XGPTSettings",
        build_for_training="itune_hf.families.xgpt.training:build_for_training",
        saves="full",
        display_name="XGPT",
        card="itune_hf.families.xgpt.card:CARD",
        describe_preset="itune_hf.families.xgpt.card:describe_preset",
        vision_states_input="vision_hidden_states",
        explains="regions",
        unused_parameters=True,
        onnx_graphs="itune_hf.onnx.graphs:XGPT_GRAPHS",  # the encoder (regions -> memory keys/values), the decoder step
        # the paper's optimizer (section 5.4): "Adam with beta1 = 0.9, beta2 = 0.98", no weight decay named
        training_defaults={"adam_beta2": 0.98, "weight_decay": 0.0},
    )
)

_EXPORTS = {
    "XGPTSettings": "settings",
    "XGPTConfig": "configuration_xgpt",
    "XGPTModel": "modeling_xgpt",
    "XGPTForCaptioning": "modeling_xgpt",
    "XGPTProcessor": "processing_xgpt",
}
__all__ = ["FAMILY", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
