"""What each family's ONNX graphs compute (`itune_hf.onnx.export` exports them, `itune_hf.onnx.runtime` runs them).

Every family exports two graphs with one contract, so that one runtime decodes them all:

- the **image graph**: `pixel_values (B, 3, H, W)` -> the tensors the decoder reads of each image (its
  `image_outputs`, batch first), computed once per image;
- the **decoder step**: `input_ids (B, T)`, `attention_mask (B, P + T)`, the image graph's outputs, `past_keys` and
  `past_values` `(layers, B, kv_heads, P, head_dim)` -> `logits (B, vocab)` of the last position and
  `present_keys`/`present_values` `(layers, B, kv_heads, P + T, head_dim)`.

I-Tuning: the image graph is the vision tower as the LM reads it (`vision_states (B, N, d_v)`); the decoder step
runs the LM with its I-Tuning modules, which read those states at every step.

XGPT: the image graph is the vision tower, the grid regions and the encoder stack (regions -> memory), and then the
memory's keys and values as each decoder layer projects them (`memory_keys`/`memory_values`
`(B, layers, heads, N, head_dim)`, with the memory's padding mask `memory_mask (B, N)`), so that a step never
projects the memory again (`generate` caches them the same way at its first step); the decoder step runs the shared
stack (or `encdec`'s own layers) over the caption with its self-attention cache, reading the memory's keys and values
as the prefilled cross-attention part of an `EncoderDecoderCache`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

VISION_FILE, ENCODER_FILE = "vision.onnx", "encoder.onnx"


@dataclass(frozen=True)
class FamilyGraphs:
    """How one family's captioner becomes the two graphs.

    Args:
        image_file: The image graph's file name.
        image_outputs: The names of its outputs, which the decoder step takes after `attention_mask`.
        image: `image(model)`: the image graph as a module of `pixel_values`.
        decoder: `decoder(model, num_layers)`: the decoder step as a module.
        cache_shape: `cache_shape(model, image_outputs, start)`: `(layers, kv_heads, head_dim)` of the self-attention
            cache (`start`: the start token's id).
    """

    image_file: str
    image_outputs: tuple[str, ...]
    image: Callable[[nn.Module], nn.Module]
    decoder: Callable[[nn.Module, int], nn.Module]
    cache_shape: Callable[[nn.Module, tuple, int], tuple[int, int, int]]


def _stacked_self_cache(past_keys: torch.Tensor, past_values: torch.Tensor, num_layers: int):
    """A `DynamicCache` holding the stacked `(layers, B, heads, P, head_dim)` keys and values."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer in range(num_layers):
        cache.update(past_keys[layer], past_values[layer], layer)
    return cache


def _stacked(cache, num_layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of a `DynamicCache`, stacked over its layers."""
    keys, values = zip(*(_layer_cache(cache, layer) for layer in range(num_layers)))
    return torch.stack(keys), torch.stack(values)


def _layer_cache(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of one layer of a `DynamicCache` (its `layers` from transformers 4.56 on)."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


# ------------------------------------------------------------------------------------------------------------------
# I-Tuning
# ------------------------------------------------------------------------------------------------------------------
class _ITuningImage(nn.Module):
    """The vision tower as the LM reads it (`encode_images`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.encode_images(pixel_values).last_hidden_state


class _ITuningDecoderStep(nn.Module):
    """One decoding step of the LM with its I-Tuning modules, the KV cache stacked over layers."""

    def __init__(self, model: nn.Module, num_layers: int) -> None:
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, attention_mask, vision_states, past_keys, past_values):
        cache = _stacked_self_cache(past_keys, past_values, self.num_layers)
        outputs = self.model(
            encoder_outputs=vision_states,
            decoder_input_ids=input_ids,
            decoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            return_dict=True,
        )
        return outputs.logits[:, -1], *_stacked(cache, self.num_layers)


def _ituning_cache_shape(model: nn.Module, image_outputs: tuple, start: int) -> tuple[int, int, int]:
    """`(layers, kv_heads, head_dim)` of the LM's KV cache, read from one step of the model itself."""
    from ..models._shared.generation import output_cache

    (vision_states,) = image_outputs
    step = torch.full((vision_states.shape[0], 1), start, dtype=torch.long)
    with torch.no_grad():
        outputs = model(encoder_outputs=vision_states, decoder_input_ids=step, use_cache=True, return_dict=True)
    cache = output_cache(outputs)
    cache = getattr(cache, "self_attention_cache", cache)
    num_layers = len(cache.layers) if hasattr(cache, "layers") else len(cache.key_cache)
    keys, _ = _layer_cache(cache, 0)
    return num_layers, keys.shape[1], keys.shape[3]


# ------------------------------------------------------------------------------------------------------------------
# XGPT
# ------------------------------------------------------------------------------------------------------------------
class _XGPTImage(nn.Module):
    """Regions -> memory -> each decoder layer's keys and values of it (what `generate` caches at its first step)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        core = self.model.model
        encoded = core.encoder(pixel_values=pixel_values, return_dict=True)
        keys, values = [], []
        for index, layer in enumerate(core.decoder_layers):
            attention = layer.cross_attention if layer.cross_attention is not None else layer.attention
            layer_keys, layer_values = attention.keys_values(core._layer_memory(encoded, index), memory=True)
            keys.append(layer_keys)
            values.append(layer_values)
        return encoded.memory_mask, torch.stack(keys, dim=1), torch.stack(values, dim=1)


class _XGPTDecoderStep(nn.Module):
    """One decoding step of XGPT: the memory's keys and values as the prefilled cross-attention cache."""

    def __init__(self, model: nn.Module, num_layers: int) -> None:
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, attention_mask, memory_mask, memory_keys, memory_values, past_keys, past_values):
        from transformers import DynamicCache, EncoderDecoderCache

        from ..models.xgpt.modeling_xgpt import XGPTEncoderOutput

        memory_cache = DynamicCache()
        for layer in range(self.num_layers):
            memory_cache.update(memory_keys[:, layer], memory_values[:, layer], layer)
        cache = EncoderDecoderCache(_stacked_self_cache(past_keys, past_values, self.num_layers), memory_cache)
        cache.is_updated.update(dict.fromkeys(range(self.num_layers), True))  # the memory is projected: read it
        batch, regions = memory_mask.shape
        hidden = self.model.config.hidden_size
        # the memory's states are not read again (its keys and values are cached); zeros of its shape stand in
        memory = memory_keys.new_zeros(batch, regions, hidden)
        per_layer = memory_keys.new_zeros(batch, self.num_layers, regions, hidden)
        encoded = XGPTEncoderOutput(last_hidden_state=memory, memory_mask=memory_mask, memory_per_layer=per_layer)
        outputs = self.model(
            encoder_outputs=encoded,
            decoder_input_ids=input_ids,
            decoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=True,
            return_dict=True,
        )
        return outputs.logits[:, -1], *_stacked(cache.self_attention_cache, self.num_layers)


def _xgpt_cache_shape(model: nn.Module, image_outputs: tuple, start: int) -> tuple[int, int, int]:
    """`(layers, heads, head_dim)`: the memory's keys have the self-attention's heads and width."""
    _, memory_keys, _ = image_outputs
    return memory_keys.shape[1], memory_keys.shape[2], memory_keys.shape[4]


ITUNING_GRAPHS = FamilyGraphs(VISION_FILE, ("vision_states",), _ITuningImage, _ITuningDecoderStep, _ituning_cache_shape)
XGPT_GRAPHS = FamilyGraphs(
    ENCODER_FILE, ("memory_mask", "memory_keys", "memory_values"), _XGPTImage, _XGPTDecoderStep, _xgpt_cache_shape
)


def graphs_for(model: Any) -> FamilyGraphs:
    """The graphs of a captioner's family (its `ModelFamily.onnx_graphs`).

    Args:
        model: A captioner of a family that exports ONNX (`itune_hf.onnx.export.check_exportable`).
    """
    from ..models import family_of

    return family_of(model).load("onnx_graphs")


__all__ = ["ENCODER_FILE", "ITUNING_GRAPHS", "VISION_FILE", "XGPT_GRAPHS", "FamilyGraphs", "graphs_for"]
