"""itune_hf: lightweight image captioning with I-Tuning on frozen vision and language backbones, and XGPT.

`import itune_hf` is cheap: it imports neither torch, transformers nor PEFT. The public names below are imported on
first use (`from itune_hf import ITuningForCaptioning`), and the I-Tuning classes are registered with transformers
(Auto classes, the `image-to-text` pipeline) and PEFT (the adapter type) as soon as those libraries are imported,
before or after `import itune_hf` (see `itune_hf/_registration.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _registration
from .utils import versions as _versions
from .utils.lazy import lazy_exports
from .utils.versions import __version__

if TYPE_CHECKING:
    from .adapter import ITuningAdapterConfig, ITuningLayer, ITuningTuner
    from .adapter.callback import AdapterCheckpoints
    from .adapter.convert import save_adapter
    from .models.ituning.configuration_ituning import ITuningConfig
    from .models.ituning.modeling_ituning import ITuningForCaptioning, ITuningModule
    from .models.ituning.processing_ituning import ITuningProcessor
    from .models.ituning.settings import ITuningSettings
    from .models.xgpt.configuration_xgpt import XGPTConfig
    from .models.xgpt.modeling_xgpt import XGPTForCaptioning, XGPTModel
    from .models.xgpt.processing_xgpt import XGPTProcessor
    from .models.xgpt.settings import XGPTSettings
    from .pipelines import ImageToTextPipeline
    from .presets import build_model, build_processor, get_preset, list_presets


# public name -> submodule defining it, imported on first access
_EXPORTS: dict[str, str] = {
    "AdapterCheckpoints": "adapter.callback",
    "ITuningAdapterConfig": "adapter",
    "ITuningConfig": "models.ituning.configuration_ituning",
    "ITuningForCaptioning": "models.ituning.modeling_ituning",
    "ITuningLayer": "adapter",
    "ITuningModule": "models.ituning.modeling_ituning",
    "ITuningProcessor": "models.ituning.processing_ituning",
    "ITuningSettings": "models.ituning.settings",
    "ITuningTuner": "adapter",
    "ImageToTextPipeline": "pipelines",
    "XGPTConfig": "models.xgpt.configuration_xgpt",
    "XGPTForCaptioning": "models.xgpt.modeling_xgpt",
    "XGPTModel": "models.xgpt.modeling_xgpt",
    "XGPTProcessor": "models.xgpt.processing_xgpt",
    "XGPTSettings": "models.xgpt.settings",
    "build_model": "presets",
    "build_processor": "presets",
    "get_preset": "presets",
    "list_presets": "presets",
    "save_adapter": "adapter.convert",
}
# also importable from the package, but not part of `__all__`
_EXTRA_EXPORTS: dict[str, str] = {
    "register_auto_classes": "models.auto",
    "register_image_to_text_pipeline": "pipelines",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, {**_EXPORTS, **_EXTRA_EXPORTS}, globals(), submodules=True)

_versions.warn_if_untested()
_registration.install()
