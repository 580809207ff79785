"""Saving an I-Tuning adapter as a checkpoint that loads anywhere: the PEFT files (only the I-Tuning weights), a
reference `config.json` naming the frozen backbones (no weights), and the backbones that have no reference
(randomly initialised ones, as in the offline demo) under `backbones/`, referenced relatively.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def backbone_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The backbone's own weights, under its own names, even while PEFT tuner layers wrap parts of it; an LM loaded
    quantised (`itune train --load-in`) gives its weights dequantised, as its own class loads them.

    Args:
        module: The vision tower or the LM.
    """
    from ...quantization import full_precision_state_dict

    state = {
        key.replace(".base_layer.", "."): tensor
        for key, tensor in module.state_dict().items()
        if ".ituning_modules." not in key
    }
    return full_precision_state_dict(module, state)


def save_unreferenced_backbones(captioner: Any, directory: Path) -> None:
    """Save the backbones without a reference under `backbones/vision` or `backbones/text` and reference them
    relatively, so the adapter still loads anywhere.

    Args:
        captioner: The `ITuningForCaptioning` the adapter is attached to.
        directory: The checkpoint directory.
    """
    for name, module, sub_config in (
        ("vision", captioner.vision_model, captioner.config.vision_config),
        ("text", captioner.language_model, captioner.config.text_config),
    ):
        if not sub_config._name_or_path or sub_config._name_or_path == f"backbones/{name}":
            module.save_pretrained(directory / "backbones" / name, state_dict=backbone_state_dict(module))
            sub_config._name_or_path = f"backbones/{name}"


def save_adapter(model: Any, directory: Path, **save_kwargs: Any) -> None:
    """Write an adapter-only checkpoint of a `PeftModel` with I-Tuning adapters into `directory`.

    Args:
        model: The `PeftModel`.
        directory: Target directory (exists).
        **save_kwargs: Passed to `PeftModel.save_pretrained` (e.g. `selected_adapters`). `save_embedding_layers`
            defaults to False: I-Tuning never trains the embeddings, and PEFT's "auto" looks the base up on the Hub
            (two warnings on every save where the base is a preset name or the Hub is unreachable).
    """
    model.save_pretrained(directory, **{"save_embedding_layers": False, **save_kwargs})
    save_backbone_reference(model.get_base_model(), directory)


def save_backbone_reference(captioner: Any, directory: Path) -> None:
    """Next to adapter files: the backbones without a reference (under `backbones/`), a `config.json` naming the
    backbones (a bare config: the adapter files hold the I-Tuning weights) and, for a quantised frozen LM,
    `frozen_lm.json` (`itune_hf.quantization`).

    Args:
        captioner: The `ITuningForCaptioning` (bare with PEFT adapters, or native).
        directory: The checkpoint directory.
    """
    from ...quantization import write_record

    save_unreferenced_backbones(captioner, directory)
    write_record(captioner, directory)  # how the frozen LM was loaded (8bit, 4bit), so that it loads the same way
    reference = captioner.config.__class__.from_dict(captioner.config.to_dict())
    reference.add_ituning_modules = False  # backbones only: the adapter files hold the I-Tuning weights
    reference.architectures = [type(captioner).__name__]
    reference.save_pretrained(directory)


__all__ = ["backbone_state_dict", "save_adapter", "save_backbone_reference", "save_unreferenced_backbones"]
