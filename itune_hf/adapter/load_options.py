"""The `from_pretrained` options that a checkpoint loaded by this package (an adapter-only folder, a preset's name)
honours, read the way transformers reads them for a full
checkpoint: `dtype` (a `torch.dtype`, its name, or `"auto"`), `attn_implementation`, `device_map` (one device) and
`output_loading_info`. A full checkpoint of the same model loads the same way under the same options.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open

#: `device_map` values that ask Accelerate to place the model: one device when there is at most one accelerator.
_PLACED_BY_ACCELERATE = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass(frozen=True)
class LoadOptions:
    """What the options ask of an adapter-only load.

    Args:
        dtype: The dtype asked for, resolved (None: `"auto"` or not given: each part keeps what it was stored in).
        backbone_dtype: What the backbones' own `from_pretrained` is given (as passed: transformers resolves it).
        attn_implementation: The attention implementation asked for, or None.
        device: The one device the model goes to, or None.
        output_loading_info: Return `(model, loading_info)` as `from_pretrained` does.
    """

    dtype: torch.dtype | None = None
    backbone_dtype: Any = None
    attn_implementation: str | dict | None = None
    device: torch.device | None = None
    output_loading_info: bool = False

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any], adapter_path: str | os.PathLike) -> LoadOptions:
        """Read the options from `from_pretrained`'s keywords.

        Args:
            kwargs: The keywords (`dtype`, `attn_implementation`, `device_map`, `output_loading_info`, ...).
            adapter_path: The checkpoint, named in errors.

        Raises:
            ValueError: a `dtype` that is not a torch floating dtype, or a `device_map` over several devices.
        """
        given = kwargs.get("dtype")
        return cls(
            dtype=resolved_dtype(given, adapter_path),
            backbone_dtype=given,
            attn_implementation=_attention(kwargs),
            device=_one_device(kwargs.get("device_map"), adapter_path),
            output_loading_info=bool(kwargs.get("output_loading_info", False)),
        )

    def apply(self, model: Any) -> Any:
        """Set the attention implementation and move `model` to the device asked for (in place).

        Args:
            model: The loaded native model.
        """
        if self.attn_implementation is not None:
            model.set_attn_implementation(self.attn_implementation)
        if self.device is not None:
            model.to(self.device)
        return model

    def returned(self, model: Any) -> Any:
        """What `from_pretrained` returns: the model, or `(model, loading_info)` when asked for (every key of the
        adapter file fitted the model, or loading refused it: nothing missing, unexpected or mismatched)."""
        if not self.output_loading_info:
            return model
        return model, {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(), "error_msgs": []}


def stored_dtype(weights_path: str | os.PathLike) -> torch.dtype | None:
    """The dtype of the first floating tensor in a safetensors file (what `dtype="auto"` takes), or None.

    Args:
        weights_path: The file.
    """
    with safe_open(str(weights_path), framework="pt") as handle:
        for key in handle.keys():
            dtype = handle.get_slice(key).get_dtype()
            resolved = _SAFETENSORS_DTYPES.get(dtype)
            if resolved is not None:
                return resolved
    return None


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _attention(kwargs: dict[str, Any]) -> str | dict | None:
    """The attention implementation asked for: the keyword, or (the Auto classes move it into the config they pass
    on) the passed config's."""
    if kwargs.get("attn_implementation") is not None:
        return kwargs["attn_implementation"]
    return getattr(kwargs.get("config"), "_attn_implementation_internal", None)


def resolved_dtype(value: Any, adapter_path: str | os.PathLike) -> torch.dtype | None:
    """`dtype` as `from_pretrained` takes it (a `torch.dtype` or its name) as a `torch.dtype`; None for `"auto"` or
    None (each part keeps the dtype it was stored in).

    Args:
        value: The `dtype` option.
        adapter_path: The checkpoint, named in errors.

    Raises:
        ValueError: `value` is not a floating torch dtype.
    """
    if value is None or value == "auto":
        return None
    resolved = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(
            f"{adapter_path}: dtype={value!r} is not a floating torch dtype; pass e.g. torch.bfloat16, "
            "'bfloat16' or 'auto'"
        )
    return resolved


def _one_device(device_map: Any, adapter_path: str | os.PathLike) -> torch.device | None:
    """The one device a `device_map` names, as transformers reads one (`"cpu"`, `"cuda:0"`, `0`, a
    `torch.device`, `{"": device}`, or `"auto"` with at most one accelerator)."""
    if device_map is None:
        return None
    if isinstance(device_map, dict):
        devices = set(device_map.values())
        if len(devices) == 1:
            return _one_device(devices.pop(), adapter_path)
    elif isinstance(device_map, (int, torch.device)) and not isinstance(device_map, bool):
        return torch.device(device_map)  # an index is an accelerator's, as in transformers
    elif device_map in _PLACED_BY_ACCELERATE:
        if torch.cuda.device_count() <= 1:
            return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    elif isinstance(device_map, str) and device_map != "disk":
        return torch.device(device_map)
    raise ValueError(
        f"{adapter_path}: an adapter-only checkpoint loads onto one device, but device_map={device_map!r} "
        "spreads it over several; pass one device (e.g. device_map='cuda:0'), or save the model whole "
        "(model.save_pretrained) and load that with the device_map"
    )


__all__ = ["LoadOptions", "resolved_dtype", "stored_dtype"]
