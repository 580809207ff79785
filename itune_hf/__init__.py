"""itune_hf: lightweight image captioning with I-Tuning on frozen vision and language backbones.

Importing the package registers the I-Tuning adapter type in PEFT.
"""

from .adapter import ITuningAdapterConfig, ITuningLayer, ITuningTuner
from .auto import register_auto_classes
from .configuration_ituning import ITuningConfig
from .modeling_ituning import ITuningForCaptioning, ITuningModule
from .pipelines import ImageToTextPipeline, register_image_to_text_pipeline
from .presets import build_model, build_processor, get_preset, list_presets
from .processing_ituning import ITuningProcessor

register_auto_classes()
register_image_to_text_pipeline()

__version__ = "0.1.0"

__all__ = [
    "ITuningAdapterConfig",
    "ITuningConfig",
    "ITuningForCaptioning",
    "ITuningLayer",
    "ITuningModule",
    "ITuningProcessor",
    "ITuningTuner",
    "ImageToTextPipeline",
    "build_model",
    "build_processor",
    "get_preset",
    "list_presets",
]
