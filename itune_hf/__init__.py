"""itune_hf: lightweight image captioning with I-Tuning on frozen vision and language backbones.

Importing the package registers the I-Tuning adapter type in PEFT.
"""

from .adapter import ITuningAdapterConfig, ITuningLayer, ITuningTuner
from .configuration_ituning import ITuningConfig
from .modeling_ituning import ITuningForCaptioning, ITuningModule
from .presets import build_model, get_preset, list_presets

__version__ = "0.1.0"

__all__ = [
    "ITuningAdapterConfig",
    "ITuningConfig",
    "ITuningForCaptioning",
    "ITuningLayer",
    "ITuningModule",
    "ITuningTuner",
    "build_model",
    "get_preset",
    "list_presets",
]
