"""ClipCap (Mokady et al. 2021), "frozen GPT-2" variant, as a baseline family: a trainable mapping network (MLP or
transformer) turns the frozen vision tower's image embedding into a prefix of embeddings for a frozen causal LM.

* `configuration_clipcap.py`, `modeling_clipcap.py`: the transformers model; they import only torch, transformers and
  each other (the remote code of full checkpoints). The processor is I-Tuning's (`ITuningProcessor`: the same image
  processing, BOS-first captions and aligned labels).
* How `itune train` builds it (the mapper trains; saved as a full checkpoint) and what its cards say live in
  `itune_hf/families/clipcap/`, named below by import path.

The mapper is chosen by the preset (`clipcap-mlp-*`, `clipcap-transformer-*`). Names are imported on first use:
importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from ...utils.lazy import lazy_exports
from ..registry import ModelFamily, register_family

FAMILY = register_family(
    ModelFamily(
        name="clipcap",
        model_type="clipcap",
        description="ClipCap baseline: frozen vision tower + frozen causal LM, a trainable mapper making a prefix",
        config_class=f"{__name__}.configuration_clipcap:ClipCapConfig",
        model_class=f"{__name__}.modeling_clipcap:ClipCapForCaptioning",
        processor_class="itune_hf.models.ituning.processing_ituning:ITuningProcessor",
        settings_class=None,
        build_for_training="itune_hf.families.clipcap.training:build_for_training",
        saves="full",
        display_name="ClipCap",
        card="itune_hf.families.clipcap.card:CARD",
    )
)

_EXPORTS = {
    "ClipCapConfig": "configuration_clipcap",
    "ClipCapSettings": "configuration_clipcap",
    "ClipCapForCaptioning": "modeling_clipcap",
    "ClipCapMLPMapper": "modeling_clipcap",
    "ClipCapTransformerMapper": "modeling_clipcap",
}
__all__ = ["FAMILY", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
