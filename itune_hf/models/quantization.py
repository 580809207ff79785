"""The frozen LM in 8 or 4 bits, for LMs too big to hold in full precision (`itune train --load-in 8bit|4bit`,
`itune caption/eval --load-in`, `load_captioner(..., load_in=...)`, `quantize_frozen_lm(model, "8bit")`).

bitsandbytes (`pip install 'itune_hf[quant]'`) does the work, on CPU (AVX2 suffices) and on CUDA GPUs:

* `"8bit"`: LLM.int8() (`bnb.nn.Linear8bitLt`, outlier threshold 6.0 as in transformers): int8 weights with one
  scale per output channel, about 4x fewer bytes than float32.
* `"4bit"`: NF4 (`bnb.nn.Linear4bit`, blocks of 64 weights, their scales quantised again): about 7.7x fewer bytes.

What is quantised: every `nn.Linear` and GPT-2 `Conv1D` of the frozen LM (attention and feed-forward projections).
What is not: the LM head and the embeddings (kept as they are: the head decides between near-tied tokens, and a
tied head shares its weight with the embeddings), the vision tower, and the I-Tuning modules and anything else that
trains (full precision). Training backpropagates through the quantised layers to the modules; their weights get no
gradient. The quantised layers compute in the LM's own dtype (float32, or what `dtype`/autocast gives).

Memory: the LM is loaded as usual (transformers memory-maps a safetensors file), then quantised layer by layer, each
float weight dropped as its layer is replaced; the weights' bytes shrink about 4x (8-bit) or 7.7x (4-bit). On CPU,
bitsandbytes' 8-bit path keeps each quantised layer's input for the backward pass, so a training step's activations
grow, and at a small LM they can outweigh what the weights save (benchmarks/RESULTS.md, "Frozen LM in 8 and 4 bits").

Saving: an adapter stays adapter-only. A frozen LM saved with it (a random backbone without a reference) is written
in full precision (the quantised weights dequantised), and `frozen_lm.json` beside the adapter records the
quantisation, so that `load_captioner` (and so `itune caption/eval/explain`) loads the LM the same way unless told
otherwise (`load_in=None`, `--load-in none`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..utils.files import atomic_write_json, read_json

if TYPE_CHECKING:  # torch is imported where a function needs it: the option's choices and checks import none
    import torch
    from torch import nn

#: The ways a frozen LM can be loaded quantised.
LOAD_IN = ("8bit", "4bit")
#: What a saved run records about its frozen LM's quantisation, beside its adapter.
RECORD_NAME = "frozen_lm.json"
#: The option's word for full precision (`--load-in none`): what a recorded quantisation is overridden with.
NONE = "none"
#: Where a saved captioner loads (`load_captioner`, `itune caption/eval --load-in`): its frozen LM as its run recorded.
RECORDED = "recorded"
INSTALL_HINT = "pip install 'itune_hf[quant]' (bitsandbytes)"
LLM_INT8_THRESHOLD = 6.0  # LLM.int8()'s outlier threshold, transformers' default
NF4_BLOCKSIZE = 64


@dataclass(frozen=True)
class QuantizedLM:
    """What `quantize_frozen_lm` did, recorded beside a saved adapter (`frozen_lm.json`).

    Args:
        load_in: `"8bit"` or `"4bit"`.
        method: The quantisation, `"LLM.int8()"` or `"NF4"`.
        library: The library and its version, e.g. `"bitsandbytes 0.50.2"`.
        layers: How many linear layers were quantised.
        bytes_before: Bytes of the LM's parameters and buffers in the dtype it was loaded in.
        bytes_after: The same once quantised (the quantisation's scales included).
    """

    load_in: str
    method: str
    library: str
    layers: int
    bytes_before: int
    bytes_after: int

    def describe(self) -> str:
        """One line for logs: e.g. `frozen LM in 8bit (LLM.int8(), bitsandbytes 0.50.2): 210 linear layers
        quantised, 538.1 MB -> 162.0 MB of parameters`."""
        return (
            f"frozen LM in {self.load_in} ({self.method}, {self.library}): {self.layers} linear layers quantised, "
            f"{self.bytes_before / 1e6:.1f} MB -> {self.bytes_after / 1e6:.1f} MB of parameters"
        )


def check_load_in(load_in: str | None) -> str | None:
    """`load_in` checked: `"8bit"`, `"4bit"`, or None (full precision; `"none"` reads as None).

    Args:
        load_in: The value given (`--load-in`, a recipe's `load_in`, a keyword).

    Raises:
        ValueError: for any other value, naming the choices.
    """
    if load_in is None or load_in.strip().lower() == NONE:
        return None
    if load_in not in LOAD_IN:
        raise ValueError(f"load_in must be one of {', '.join(LOAD_IN)} (or none), got {load_in!r}")
    return load_in


def _bitsandbytes(load_in: str):
    """The bitsandbytes module, or an `InputError` saying how to install it."""
    try:
        import bitsandbytes
    except ImportError as error:
        raise InputError(
            f"--load-in {load_in}: quantising the frozen LM needs bitsandbytes, which is not installed here "
            f"({error}); {INSTALL_HINT}, or drop --load-in to load it in full precision"
        ) from error
    return bitsandbytes


def frozen_linear_layers(language_model: nn.Module, *, include_head: bool = False) -> list[tuple[nn.Module, str]]:
    """`(parent, attribute)` of every `nn.Linear` and `Conv1D` of an LM (not subclasses: quantised layers are
    skipped), outside I-Tuning modules (PEFT puts those inside the LM).

    Args:
        language_model: The causal LM.
        include_head: Also its output embeddings (the LM head).
    """
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    from .ituning.modeling_ituning import ITuningModule

    skipped = {id(sub) for module in language_model.modules() if isinstance(module, ITuningModule)
               for sub in module.modules()}  # fmt: skip
    head = language_model.get_output_embeddings() if hasattr(language_model, "get_output_embeddings") else None
    if head is not None and not include_head:
        skipped.add(id(head))
    return [
        (parent, name)
        for parent in language_model.modules()
        if id(parent) not in skipped
        for name, child in parent.named_children()
        if type(child) in (nn.Linear, Conv1D) and id(child) not in skipped
    ]


def quantize_frozen_lm(model: Any, load_in: str) -> QuantizedLM:
    """Quantise the frozen LM of an I-Tuning captioner in place (see the module's docstring for what is quantised).

    Args:
        model: An `ITuningForCaptioning`, a `PeftModel` around one, or a bare causal LM.
        load_in: `"8bit"` or `"4bit"`.

    Returns:
        What was done (`QuantizedLM`); also kept as the LM's `itune_quantization` attribute.

    Raises:
        InputError: bitsandbytes is missing.
        ValueError: `load_in` is not one of `LOAD_IN`; the LM is already quantised; a layer of it trains.
    """
    load_in = check_load_in(load_in)
    if load_in is None:
        raise ValueError("quantize_frozen_lm: pass load_in='8bit' or '4bit'")
    bnb = _bitsandbytes(load_in)
    language_model = language_model_of(model)
    done = getattr(language_model, "itune_quantization", None)
    if done is not None:
        raise ValueError(f"load_in={load_in!r}: this LM is already loaded in {done.load_in}; load it again instead")
    layers = frozen_linear_layers(language_model)
    training = sum(any(p.requires_grad for p in getattr(parent, name).parameters()) for parent, name in layers)
    if training:
        raise ValueError(
            f"load_in={load_in!r}: {training} linear layers of the LM train; only a frozen LM is quantised: freeze "
            "it (requires_grad_(False)) or load it in full precision"
        )
    before = parameter_bytes(language_model)
    for parent, name in layers:
        setattr(parent, name, _quantized_layer(getattr(parent, name), load_in, bnb))
    method = "LLM.int8()" if load_in == "8bit" else "NF4"
    done = QuantizedLM(load_in, method, f"bitsandbytes {bnb.__version__}", len(layers), before,
                       parameter_bytes(language_model))  # fmt: skip
    language_model.itune_quantization = done
    return done


def language_model_of(model: Any) -> nn.Module:
    """The causal LM of a captioner (`language_model`, also through a `PeftModel`), or `model` itself."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "language_model", base)


def _quantized_layer(layer: nn.Module, load_in: str, bnb) -> nn.Module:
    """The bitsandbytes layer computing what `layer` (an `nn.Linear`, or a `Conv1D` with its weight transposed)
    computes, quantised on the layer's device; the float weight is not kept."""
    import torch
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    weight = layer.weight.detach()
    if isinstance(layer, Conv1D):
        weight = weight.t()
    out_features, in_features = weight.shape
    has_bias = layer.bias is not None
    with torch.device("meta"):  # no float weight is allocated for the new layer
        if load_in == "8bit":
            new = bnb.nn.Linear8bitLt(in_features, out_features, has_bias, has_fp16_weights=False,
                                      threshold=LLM_INT8_THRESHOLD)  # fmt: skip
        else:
            new = bnb.nn.Linear4bit(in_features, out_features, has_bias, compute_dtype=weight.dtype,
                                    compress_statistics=True, quant_type="nf4")  # fmt: skip
    if load_in == "8bit":
        new.weight = bnb.nn.Int8Params(weight.contiguous(), requires_grad=False, has_fp16_weights=False)
    else:
        new.weight = bnb.nn.Params4bit(weight.contiguous(), requires_grad=False, blocksize=NF4_BLOCKSIZE,
                                       compress_statistics=True, quant_type="nf4")  # fmt: skip
    if has_bias:
        new.bias = nn.Parameter(layer.bias.detach(), requires_grad=False)
    new.itune_source = type(layer).__name__  # a Conv1D's weight is transposed back when dequantised
    new.itune_dtype = weight.dtype  # and restored in the dtype it had
    return new.to(weight.device)  # bitsandbytes quantises a float weight as it moves it


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers, with the scales bitsandbytes keeps beside quantised weights.

    Args:
        module: Any module (e.g. an LM, quantised or not).
    """
    import torch

    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    for sub in module.modules():
        weight = getattr(sub, "weight", None)
        state = getattr(weight, "quant_state", None)  # 4bit: the block scales (and their own scales)
        for part in (state, getattr(state, "state2", None)):
            for name in ("absmax", "code"):
                tensor = getattr(part, name, None)
                if isinstance(tensor, torch.Tensor):
                    tensors[id(tensor)] = tensor
        scales = getattr(weight, "SCB", None)  # 8bit: a scale per output channel, on the weight or the layer state
        if scales is None:
            scales = getattr(getattr(sub, "state", None), "SCB", None)
        if isinstance(scales, torch.Tensor):
            tensors[id(scales)] = scales
    return sum(t.numel() * t.element_size() for t in tensors.values())


def full_precision_state_dict(module: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (a state dict of `module`) with each quantised layer's weight dequantised under its own name (a
    `Conv1D`'s transposed back) and bitsandbytes' extra entries dropped: what the LM's own class loads.

    Args:
        module: The module `state` was taken from (e.g. a quantised LM).
        state: Its state dict, possibly with names rewritten after the layer's prefix (PEFT's `.base_layer.`).
    """
    from transformers.integrations.bitsandbytes import dequantize_bnb_weight

    quantised = {name: sub for name, sub in module.named_modules() if hasattr(sub, "itune_source")}
    if not quantised:
        return state
    prefixes = {name.replace(".base_layer.", ".") + ".": sub for name, sub in quantised.items()}
    kept = {key: tensor for key, tensor in state.items() if not key.startswith(tuple(prefixes))}
    for prefix, layer in prefixes.items():
        weight = dequantize_bnb_weight(layer.weight, state=getattr(layer, "state", None)).to(layer.itune_dtype)
        kept[prefix + "weight"] = (weight.t() if layer.itune_source == "Conv1D" else weight).contiguous()
        if layer.bias is not None:  # in the LM's dtype: bitsandbytes casts a bias to its input's (bf16 under autocast)
            kept[prefix + "bias"] = layer.bias.detach().to(layer.itune_dtype)
    return kept


def write_record(model: Any, directory: str | os.PathLike) -> None:
    """Write `frozen_lm.json` into a saved checkpoint's `directory` when `model`'s LM is quantised (else nothing).

    Args:
        model: The captioner that was saved (native or a `PeftModel`).
        directory: The checkpoint directory.
    """
    done = getattr(language_model_of(model), "itune_quantization", None)
    if done is not None:
        atomic_write_json(Path(directory) / RECORD_NAME, asdict(done))


def recorded_load_in(directory: str | os.PathLike) -> str | None:
    """How a saved run loaded its frozen LM (`"8bit"`, `"4bit"`), from its `frozen_lm.json`; None without one.

    Args:
        directory: A checkpoint directory (anything else, e.g. a Hub id, records nothing here).

    Raises:
        InputError: the record is damaged, naming it.
    """
    path = Path(directory) / RECORD_NAME
    if not path.is_file():
        return None
    record = read_json(path, "the frozen LM's quantisation record")
    load_in = record.get("load_in") if isinstance(record, dict) else None
    if load_in not in LOAD_IN:
        raise InputError(
            f"{path}: load_in must be one of {', '.join(LOAD_IN)}, got {load_in!r}; fix or delete the file (deleted: "
            "the LM loads in full precision)"
        )
    return load_in


__all__ = [
    "LOAD_IN",
    "RECORDED",
    "RECORD_NAME",
    "QuantizedLM",
    "check_load_in",
    "frozen_linear_layers",
    "full_precision_state_dict",
    "language_model_of",
    "parameter_bytes",
    "quantize_frozen_lm",
    "recorded_load_in",
    "write_record",
]
