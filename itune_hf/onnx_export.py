"""Exporting an I-Tuning captioner to ONNX for deployment (`itune export --format onnx`, issue 31.2).

optimum's exporters describe models by their transformers architecture, and a captioner whose frozen LM carries
I-Tuning modules beside its feed-forward blocks is none of theirs; the export therefore goes through
`torch.onnx.export(..., dynamo=True)` (torch.export, then ONNX through onnxscript), which takes these models as they
are. Two graphs and the files to run them (`itune_hf.onnx_runtime` reads them):

- `vision.onnx`: `pixel_values (B, 3, H, W)` -> `vision_states (B, N, d_v)`, the tower's tokens as the LM reads them
  (a convolutional tower's feature map flattened to tokens, as `encode_images` does);
- `decoder.onnx`: one decoding step with its KV cache: `input_ids (B, T)`, `attention_mask (B, P + T)`,
  `vision_states`, `past_keys` and `past_values` `(layers, B, kv_heads, P, head_dim)` -> `logits (B, vocab)` of the
  last position and `present_keys`/`present_values` `(layers, B, kv_heads, P + T, head_dim)`. The first step passes
  an empty cache (`P = 0`); the I-Tuning modules (and `visual_tokens`/`final_norm`) run inside it;
- `onnx_config.json` (layers, cache shape, special tokens, what exported it) and the processor's files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

CONFIG_NAME = "onnx_config.json"
VISION_FILE, DECODER_FILE = "vision.onnx", "decoder.onnx"
FORMAT = "itune-onnx"
FORMAT_VERSION = 1
DECODER_INPUTS = ("input_ids", "attention_mask", "vision_states", "past_keys", "past_values")
DECODER_OUTPUTS = ("logits", "present_keys", "present_values")


def check_exportable(model: Any) -> None:
    """Refuse, naming the family, a captioner the ONNX export does not cover (only I-Tuning does so far).

    Args:
        model: A loaded captioner.

    Raises:
        ValueError: for a model of another family.
    """
    from .models import families, family_of

    family = family_of(model)
    if not family.exports_onnx:
        exported = ", ".join(f.title for f in families().values() if f.exports_onnx)
        raise ValueError(
            f"ONNX export covers {exported} captioners; {family.title} ({type(model).__name__}) is not exported yet: "
            "caption it with the torch runtime (itune caption --model DIR)"
        )


class _VisionGraph(nn.Module):
    """The vision tower as the LM reads it (`encode_images`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.encode_images(pixel_values).last_hidden_state


class _DecoderStep(nn.Module):
    """One decoding step of the captioner with its KV cache stacked over layers (see the module docstring)."""

    def __init__(self, model: nn.Module, num_layers: int) -> None:
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, attention_mask, vision_states, past_keys, past_values):
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer in range(self.num_layers):
            cache.update(past_keys[layer], past_values[layer], layer)
        outputs = self.model(
            encoder_outputs=vision_states,
            decoder_input_ids=input_ids,
            decoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            return_dict=True,
        )
        keys, values = zip(*(_layer_cache(cache, layer) for layer in range(self.num_layers)))
        return outputs.logits[:, -1], torch.stack(keys), torch.stack(values)


def _layer_cache(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of one layer of a `DynamicCache` (its `layers` from transformers 4.56 on)."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def _cache_shape(model: nn.Module, vision_states: torch.Tensor) -> tuple[int, int, int]:
    """`(layers, kv_heads, head_dim)` of the LM's KV cache, read from one step of the model itself."""
    step = torch.full((vision_states.shape[0], 1), model.config.decoder_start_token_id, dtype=torch.long)
    with torch.no_grad():
        outputs = model(encoder_outputs=vision_states, decoder_input_ids=step, use_cache=True, return_dict=True)
    from .models._shared.generation import output_cache

    cache = output_cache(outputs)
    cache = getattr(cache, "self_attention_cache", cache)
    num_layers = len(cache.layers) if hasattr(cache, "layers") else len(cache.key_cache)
    keys, _ = _layer_cache(cache, 0)
    return num_layers, keys.shape[1], keys.shape[3]


def export_onnx(model: Any, processor: Any, output_dir: str | os.PathLike, *, opset: int | None = None) -> Path:
    """Write `vision.onnx`, `decoder.onnx`, `onnx_config.json` and the processor's files of an I-Tuning captioner.

    Args:
        model: A loaded `ITuningForCaptioning`, native or with its modules built in; it is put in fp32 on the CPU
            in eval mode (in place) before the export.
        processor: Its processor (saved beside the graphs).
        output_dir: The directory to write (created if needed).
        opset: ONNX opset (default: the exporter's).

    Returns:
        The directory.

    Raises:
        ValueError: for a captioner of another family.
    """
    from torch.export import Dim

    from . import __version__
    from ._io import atomic_write_json

    check_exportable(model)
    model = model.float().cpu().eval()
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    image = _sample_pixels(processor, batch=2)
    options = {"dynamo": True, "optimize": True, "verbose": False, **({"opset_version": opset} if opset else {})}
    batch = Dim("batch")
    torch.onnx.export(
        _VisionGraph(model).eval(), (image,), str(directory / VISION_FILE), input_names=["pixel_values"],
        output_names=["vision_states"], dynamic_shapes={"pixel_values": {0: batch}}, **options,
    )  # fmt: skip
    with torch.no_grad():
        states = model.encode_images(image).last_hidden_state
    num_layers, kv_heads, head_dim = _cache_shape(model, states)
    sample = _decoder_sample(model, states, num_layers, kv_heads, head_dim)
    cache_axes = {1: batch, 3: Dim("past")}
    shapes = {
        "input_ids": {0: batch, 1: Dim("new")}, "attention_mask": {0: batch, 1: Dim("total")},
        "vision_states": {0: batch}, "past_keys": cache_axes, "past_values": cache_axes,
    }  # fmt: skip
    torch.onnx.export(
        _DecoderStep(model, num_layers).eval(), sample, str(directory / DECODER_FILE), input_names=list(DECODER_INPUTS),
        output_names=list(DECODER_OUTPUTS), dynamic_shapes=shapes, **options,
    )  # fmt: skip
    generation = model.generation_config
    atomic_write_json(
        directory / CONFIG_NAME,
        {
            "format": FORMAT, "format_version": FORMAT_VERSION, "family": "ituning",
            "num_layers": num_layers, "kv_heads": kv_heads, "head_dim": head_dim,
            "vision_tokens": int(states.shape[1]), "vision_width": int(states.shape[2]),
            "decoder_start_token_id": model.config.decoder_start_token_id,
            "eos_token_id": generation.eos_token_id, "pad_token_id": generation.pad_token_id,
            "num_beams": generation.num_beams, "max_new_tokens": generation.max_new_tokens,
            "max_positions": _positions(model.config.text_config),
            "exported_from": str(getattr(model, "name_or_path", "") or ""),
            "exported_with": {"itune_hf": __version__, "torch": torch.__version__},
        },
        indent=1,
    )  # fmt: skip
    processor.save_pretrained(directory)
    return directory


def _positions(text_config) -> int | None:
    """How many positions the LM has (None: unbounded, e.g. rotary positions without a recorded limit)."""
    positions = getattr(text_config, "n_positions", None) or getattr(text_config, "max_position_embeddings", None)
    return positions if isinstance(positions, int) else None


def _sample_pixels(processor: Any, batch: int) -> torch.Tensor:
    """`batch` grey images through the processor (their size is the processor's; batch > 1 keeps the axis free)."""
    from PIL import Image

    images = [Image.new("RGB", (64, 64), (128 + 20 * i, 128, 128)) for i in range(batch)]
    return processor(images=images, return_tensors="pt")["pixel_values"]


def _decoder_sample(model, states: torch.Tensor, num_layers: int, kv_heads: int, head_dim: int) -> tuple:
    """Inputs of one decoding step for the export: 2 new tokens after a cache of 3 (sizes above 1, so that no axis
    is specialised)."""
    batch, new, past = states.shape[0], 2, 3
    ids = torch.full((batch, new), model.config.decoder_start_token_id, dtype=torch.long)
    mask = torch.ones(batch, past + new, dtype=torch.long)
    dtype = next(model.language_model.parameters()).dtype
    cache = torch.zeros(num_layers, batch, kv_heads, past, head_dim, dtype=dtype)
    return ids, mask, states, cache, cache.clone()


__all__ = ["CONFIG_NAME", "DECODER_FILE", "FORMAT", "VISION_FILE", "check_exportable", "export_onnx"]
