"""Cross-attention fine-tuning in a frozen LM (VisionEncoderDecoder style) as a baseline family: a new trainable
cross-attention block (+ its layer norm) in every layer of a frozen causal LM, attending to the frozen vision
tower's last hidden state.

* `configuration_crossattn.py`, `modeling_crossattn.py`: `VisionEncoderDecoderConfig`/`VisionEncoderDecoderModel`
  under the model type `crossattn` (remote code: they import only torch, transformers and each other). The processor
  is I-Tuning's (`ITuningProcessor`).
* How `itune train` builds it (saved as a full checkpoint) and what its cards say live in
  `itune_hf/families/crossattn/`, named below by import path.

Names are imported on first use: importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from ...utils.lazy import lazy_exports
from ..registry import ModelFamily, register_family

FAMILY = register_family(
    ModelFamily(
        name="crossattn",
        model_type="crossattn",
        description="Cross-attention baseline: trainable cross-attention blocks in a frozen LM (VisionEncoderDecoder)",
        config_class=f"{__name__}.configuration_crossattn:CrossAttnConfig",
        model_class=f"{__name__}.modeling_crossattn:CrossAttnForCaptioning",
        processor_class="itune_hf.models.ituning.processing_ituning:ITuningProcessor",
        settings_class=None,
        build_for_training="itune_hf.families.crossattn.training:build_for_training",
        saves="full",
        display_name="Cross-attention fine-tuning",
        card="itune_hf.families.crossattn.card:CARD",
    )
)

_EXPORTS = {
    "CrossAttnConfig": "configuration_crossattn",
    "CrossAttnForCaptioning": "modeling_crossattn",
}
__all__ = ["FAMILY", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
