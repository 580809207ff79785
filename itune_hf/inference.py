"""Faster captioning on CPU: opt-in inference settings for a loaded `ITuningForCaptioning`.

`optimize_for_inference(model, int8=..., precision=...)` changes the model in place for `generate()` (and so for
`itune caption`, `itune eval` and the pipeline). Nothing here runs unless asked: a model that was not passed
through it computes exactly as before.

* Always (bit-exact): the LM head gets a contiguous input. transformers slices the last position of the hidden
  states for the logits (`hidden[:, -1:, :]`, a strided view); `torch.matmul` then expands the `vocab x width`
  head weight once per sequence (a batched matrix product over 80 copies at beam 5, batch 16: 17.8 s in bf16 and
  0.8 s in fp32 for one prefill step on this machine, against 0.03 s for the same product on a contiguous input).
* `int8=True`: every linear layer of the frozen LM, its LM head included, becomes an `Int8Linear`: weights int8
  per output channel, activations quantised per token at run time, products in int8 (`torch._int_mm`). Per-token
  activation scales matter: Llama-family LMs put a massive activation on the first position, and per-tensor
  activation scales (`torch.ao.quantization.quantize_dynamic`) then flatten every other token (0 of 16 captions of
  the demo model unchanged, against 9 of 16 per token). The I-Tuning modules (small, trained) and the vision tower
  stay in float; GPT-2's `Conv1D` layers are quantised like `nn.Linear`. CPU only.
* `precision="bf16"`: the vision tower and the LM in bfloat16 (the I-Tuning modules stay float32). Only where the
  hardware computes bf16 natively (AVX512-BF16 or AMX on CPU): elsewhere it is emulated and several times slower
  than fp32, so it is refused. `precision="auto"` picks bf16 where native and fp32 elsewhere.

The result is for inference only: do not train it or save it (save the original checkpoint instead).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from .models.ituning.modeling_ituning import ITuningForCaptioning, ITuningModule
from .runtime import native_bf16

PRECISIONS = ("fp32", "bf16", "auto")


class Int8Linear(nn.Module):
    """A frozen linear layer in int8: weights quantised per output channel, inputs per token at run time.

    `y = (round(x / s_x) @ round(W / s_w)^T) * s_x * s_w + b`, with symmetric scales `s_x` (one per row of `x`) and
    `s_w` (one per output feature), the product in int8 with int32 accumulation.

    Args:
        weight: `(out_features, in_features)` float weight.
        bias: `(out_features,)` float bias or `None`.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        weight = weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        quantised = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight_int8", quantised.t().contiguous())  # (in, out): what torch._int_mm takes
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @classmethod
    def from_float(cls, layer: nn.Module) -> Int8Linear:
        """Quantise an `nn.Linear` or a transformers `Conv1D` (GPT-2's linear layers, weight stored transposed).

        Args:
            layer: The float layer.
        """
        weight = layer.weight.t() if isinstance(layer, Conv1D) else layer.weight
        return cls(weight, layer.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.reshape(-1, self.in_features).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        quantised = torch.round(rows / scale).to(torch.int8)
        output = torch._int_mm(quantised, self.weight_int8).float() * (scale * self.weight_scale)
        if self.bias is not None:
            output = output + self.bias
        return output.reshape(*hidden_states.shape[:-1], self.out_features).to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _quantisable_layers(language_model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """`(parent, attribute, layer)` for every `nn.Linear`/`Conv1D` of the LM outside I-Tuning modules (PEFT puts
    those inside the LM)."""
    inside_ituning = {
        id(sub) for module in language_model.modules() if isinstance(module, ITuningModule) for sub in module.modules()
    }
    found = []
    for parent in language_model.modules():
        if id(parent) in inside_ituning:
            continue
        for name, child in parent.named_children():
            if type(child) in (nn.Linear, Conv1D) and id(child) not in inside_ituning:
                found.append((parent, name, child))
    return found


def _quantise_language_model(model: ITuningForCaptioning) -> int:
    """Replace the frozen LM's linear layers with `Int8Linear`; returns how many were replaced."""
    layers = _quantisable_layers(model.language_model)
    for parent, name, layer in layers:
        setattr(parent, name, Int8Linear.from_float(layer))
    return len(layers)


def _contiguous_head_input(model: ITuningForCaptioning) -> None:
    head = model.language_model.get_output_embeddings()
    if head is None or getattr(head, "_itune_contiguous_input", False):
        return
    head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))
    head._itune_contiguous_input = True


def _resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "bf16" and not native_bf16(device):
        raise ValueError(
            f"precision='bf16' was asked for, but {device.type} here has no native bf16 (on CPU: AVX512-BF16 or AMX); "
            "emulated bf16 is several times slower than fp32. Use precision='fp32', or 'auto' to use bf16 only "
            "where it is native"
        )
    return precision


def optimize_for_inference(model: ITuningForCaptioning, *, int8: bool = False, precision: str = "fp32"):
    """Make captioning faster, in place; returns `model` (in eval mode) for chaining.

    With the defaults the outputs are bit-identical to the model's own (only the LM head's input is made
    contiguous). `int8` and `bf16` change the numbers slightly; `benchmarks/RESULTS.md` measures how often the
    captions change and by how much.

    Args:
        model: A loaded `ITuningForCaptioning` (on the device it will run on).
        int8: Quantise the frozen LM's linear layers (LM head included) to int8 with per-token activation scales.
            The I-Tuning modules and the vision tower stay in float. CPU only.
        precision: `"fp32"` (default), `"bf16"` (vision tower and LM in bfloat16, I-Tuning modules in float32;
            refused where bf16 is not native) or `"auto"` (bf16 where native, else fp32).

    Raises:
        ValueError: An unknown precision, bf16 without native support, or int8 on a non-CPU device.
    """
    if not isinstance(model, ITuningForCaptioning):
        raise TypeError(f"optimize_for_inference takes an ITuningForCaptioning, got {type(model).__name__}")
    device = next(model.language_model.parameters()).device
    resolved = _resolve_precision(precision, device)
    if int8 and device.type != "cpu":
        raise ValueError(f"int8=True is for CPU, but the model is on {device}; on a GPU use precision='bf16'")
    model.eval()
    _contiguous_head_input(model)
    if resolved == "bf16":
        model.vision_model.to(torch.bfloat16)
        model.language_model.to(torch.bfloat16)  # the I-Tuning modules (model.ituning) stay float32
    if int8:
        _quantise_language_model(model)
    model._itune_inference = {"int8": int8, "precision": resolved}
    return model


__all__ = ["PRECISIONS", "Int8Linear", "native_bf16", "optimize_for_inference"]
