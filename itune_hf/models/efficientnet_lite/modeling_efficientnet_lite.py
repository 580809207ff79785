"""EfficientNet-Lite as a transformers model: a convolutional vision tower whose last hidden state is its final
feature map `(batch, head_channels, height / 32, width / 32)` (7 x 7 cells of 1,280 at 224 pixels), read by the
captioning families as a grid of tokens, like ResNet's.

The blocks are the TPU repository's mobile inverted bottlenecks without squeeze-and-excitation: an optional 1x1
expansion, a depthwise k x k convolution, a 1x1 projection, each with batch norm, ReLU6 after the first two, and the
input added back where the shape allows. Convolutions pad as TensorFlow's "SAME" does (the weights were trained so):
for a stride-2 layer on an even input, one more row and column below and right than above and left.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndNoAttention, ImageClassifierOutputWithNoAttention

from .configuration_efficientnet_lite import EfficientNetLiteConfig


class SamePadConv2d(nn.Conv2d):
    """`nn.Conv2d` padded as TensorFlow's "SAME": the output is `ceil(input / stride)`, the extra row and column of
    an odd total padding going below and to the right."""

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        pads = []
        for size, kernel, stride in zip(states.shape[-1:-3:-1], self.kernel_size[::-1], self.stride[::-1]):
            total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(states, pads))


def conv_bn(in_channels: int, out_channels: int, kernel: int, stride: int, groups: int, eps: float) -> nn.Sequential:
    """A convolution (no bias) and its batch norm."""
    conv = SamePadConv2d(in_channels, out_channels, kernel, stride=stride, groups=groups, bias=False, padding=0)
    return nn.Sequential(conv, nn.BatchNorm2d(out_channels, eps=eps, momentum=0.01))


class EfficientNetLiteBlock(nn.Module):
    """A mobile inverted bottleneck without squeeze-and-excitation.

    Args:
        in_channels, out_channels: Widths.
        kernel, stride: Of the depthwise convolution.
        expansion: Hidden width over `in_channels` (1: no expansion convolution).
        eps: Batch norm epsilon.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, expansion: int, eps: float):
        super().__init__()
        hidden = in_channels * expansion
        self.expand = conv_bn(in_channels, hidden, 1, 1, 1, eps) if expansion != 1 else None
        self.depthwise = conv_bn(hidden, hidden, kernel, stride, hidden, eps)
        self.project = conv_bn(hidden, out_channels, 1, 1, 1, eps)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        hidden = states if self.expand is None else F.relu6(self.expand(states))
        hidden = self.project(F.relu6(self.depthwise(hidden)))
        return hidden + states if self.residual else hidden


class EfficientNetLitePreTrainedModel(PreTrainedModel):
    """Weight initialisation and loading glue of EfficientNet-Lite."""

    config: EfficientNetLiteConfig
    config_class = EfficientNetLiteConfig
    base_model_prefix = "efficientnet_lite"
    main_input_name = "pixel_values"
    _no_split_modules = ["EfficientNetLiteBlock"]

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.01)
            nn.init.zeros_(module.bias)


class EfficientNetLiteModel(EfficientNetLitePreTrainedModel):
    """The tower: stem, the stages' blocks, the 1x1 head (and the tapped layers, `feature_taps`); `pooler_output` is
    the feature map's mean."""

    def __init__(self, config: EfficientNetLiteConfig):
        super().__init__(config)
        config.check_feature_taps()
        eps = config.batch_norm_eps
        self.stem = conv_bn(config.num_channels, config.stem_channels, 3, 2, 1, eps)
        blocks, width = [], config.stem_channels
        for repeats, kernel, stride, expansion, channels in config.stages:
            for index in range(repeats):
                blocks.append(
                    EfficientNetLiteBlock(width, channels, kernel, stride if index == 0 else 1, expansion, eps)
                )
                width = channels
        self.blocks = nn.ModuleList(blocks)
        self.head = conv_bn(width, config.head_channels, 1, 1, 1, eps)
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPoolingAndNoAttention | tuple:
        """The feature map of `(B, 3, H, W)` images.

        Args:
            pixel_values: The images, normalised as the processor does (mean = std = 0.5).
            output_hidden_states: Also return the stem's, every block's and the head's output (the head's without the
                tapped layers).
            return_dict: `False` returns a tuple.
        """
        if pixel_values is None:
            raise ValueError("EfficientNetLiteModel needs pixel_values (B, 3, H, W)")
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        states = F.relu6(self.stem(pixel_values))
        hidden = [states]
        for block in self.blocks:
            states = block(states)
            hidden.append(states)
        head = F.relu6(self.head(states))
        states = head
        if self.config.feature_taps:  # hypercolumns: earlier maps pooled to the head's grid, after its channels
            tapped = [F.adaptive_avg_pool2d(hidden[tap], head.shape[-2:]) for tap in self.config.feature_taps]
            states = torch.cat([head, *tapped], dim=1)
        pooled = states.mean(dim=(2, 3))
        all_states = tuple(hidden) + (head,) if output_hidden_states else None
        if not return_dict:
            return tuple(value for value in (states, pooled, all_states) if value is not None)
        return BaseModelOutputWithPoolingAndNoAttention(
            last_hidden_state=states, pooler_output=pooled, hidden_states=all_states
        )


class EfficientNetLiteForImageClassification(EfficientNetLitePreTrainedModel):
    """The tower and its classifier (ImageNet's 1,000 classes for the released weights)."""

    def __init__(self, config: EfficientNetLiteConfig):
        super().__init__(config)
        self.efficientnet_lite = EfficientNetLiteModel(config)
        self.dropout = nn.Dropout(config.dropout_rate)
        self.classifier = nn.Linear(config.head_channels, config.num_labels)
        self.post_init()

    def forward(
        self, pixel_values: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs
    ) -> ImageClassifierOutputWithNoAttention:
        """Class logits of `(B, 3, H, W)` images (and the cross-entropy loss given `labels`).

        Args:
            pixel_values: The images.
            labels: `(B,)` class indices.
        """
        outputs = self.efficientnet_lite(pixel_values, return_dict=True)
        pooled = outputs.pooler_output[:, : self.config.head_channels]  # the head's channels (before any taps)
        logits = self.classifier(self.dropout(pooled))
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return ImageClassifierOutputWithNoAttention(loss=loss, logits=logits)


__all__ = [
    "EfficientNetLiteBlock",
    "EfficientNetLiteForImageClassification",
    "EfficientNetLiteModel",
    "EfficientNetLitePreTrainedModel",
]
