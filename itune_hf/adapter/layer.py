"""The PEFT tuner layer: wraps one LM feed-forward block and adds the output of each active I-Tuning module."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from ..models.ituning.modeling_ituning import ITuningModule, VisionContext
from .config import ITuningAdapterConfig

MERGE_REFUSED = (
    "I-Tuning modules are cross-attention blocks over the image, not weight deltas: they cannot be merged into the "
    "frozen LM. To get one self-contained checkpoint, load the adapter with "
    "ITuningForCaptioning.from_pretrained(<adapter dir>) and call save_pretrained on the result."
)


class ITuningLayer(nn.Module, BaseTunerLayer):
    """A feed-forward block with I-Tuning modules in parallel, one per adapter name.

    Args:
        base_layer: The LM feed-forward block being wrapped.
        adapter_name: Name of the first adapter.
        config: Its adapter config.
        layer_index: Index of the decoder layer this block belongs to.
        context: The captioning model's `VisionContext`, which holds the vision states during a forward pass.
        hidden_size: LM width.
        vision_hidden_size: Vision-state width.
    """

    adapter_layer_names = ("ituning_modules",)
    other_param_names = ("visual_token_settings",)

    def __init__(
        self,
        base_layer: nn.Module,
        adapter_name: str,
        *,
        config: ITuningAdapterConfig,
        layer_index: int,
        context: VisionContext,
        hidden_size: int,
        vision_hidden_size: int,
    ) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.ituning_modules = nn.ModuleDict()
        self.visual_token_settings: dict[str, tuple[str, bool | None]] = {}  # per adapter: visual_tokens, final_norm
        self.layer_index = layer_index
        self.hidden_size = hidden_size
        self.vision_hidden_size = vision_hidden_size
        self._context = context  # runtime state shared with the model: a plain attribute, never saved
        self._disable_adapters = False
        self.merged_adapters = []
        self._active_adapter = adapter_name
        self.update_layer(adapter_name, config)

    def update_layer(self, adapter_name: str, config: ITuningAdapterConfig) -> None:
        """Create the module of `adapter_name` on this block, on the device and dtype of the block."""
        module = ITuningModule(**config.settings.module_kwargs(self.hidden_size, self.vision_hidden_size))
        parameters = list(self.get_base_layer().parameters())
        if parameters:  # a quantised LM's integer weights give the device, its float ones the dtype
            floating = next((p.dtype for p in parameters if p.is_floating_point()), None)
            if any(p.is_meta for p in module.parameters()):  # PEFT's low_cpu_mem_usage: the load fills them in
                module = module.to(dtype=floating)
            else:
                module = module.to(device=parameters[0].device, dtype=floating)
        self.ituning_modules[adapter_name] = module
        self.visual_token_settings[adapter_name] = (config.visual_tokens, config.final_norm)
        self.set_adapter(self.active_adapters, inference_mode=config.inference_mode)

    def has_active_ituning(self) -> bool:
        """Whether a module of an active adapter runs in this block now (read by the model's no-grad window)."""
        return not self.disable_adapters and any(name in self.ituning_modules for name in self.active_adapters)

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        raise NotImplementedError(MERGE_REFUSED)

    def unmerge(self) -> None:
        if not self.merged_adapters:  # as PEFT's mergeable layers do: nothing was merged, nothing to undo
            warnings.warn("Already unmerged. Nothing to do.", stacklevel=2)
            return
        raise NotImplementedError(MERGE_REFUSED)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any):
        result = self.base_layer(x, *args, **kwargs)
        if not self.has_active_ituning():
            return result
        delta = None
        for name in self.active_adapters:
            if name in self.ituning_modules:
                where = f"LM layer {self.layer_index}"
                vision_states, repeats = self._context.read_states(where, *self.visual_token_settings[name])
                out = self._context.run_module(self.ituning_modules[name], x, vision_states, repeats)
                delta = out if delta is None else delta + out
        if isinstance(result, tuple):  # e.g. mixture-of-experts blocks returning (hidden, router_logits)
            return (result[0] + delta, *result[1:])
        return result + delta

    def __repr__(self) -> str:
        return "ituning." + super().__repr__()
