"""Saving an I-Tuning adapter as a checkpoint that loads anywhere: the PEFT files (only the I-Tuning weights), a
reference `config.json` naming the frozen backbones (no weights), and the backbones that have no reference
(randomly initialised ones, as in the offline demo) under `backbones/`, referenced relatively.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def backbone_state_dict(
    module: torch.nn.Module, state: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The backbone's own weights, under its own names, even while PEFT tuner layers wrap parts of it; an LM loaded
    quantised (`itune train --load-in`) gives its weights dequantised, as its own class loads them.

    Args:
        module: The vision tower or the LM.
        state: Its state dict gathered whole (an FSDP run's shards: `training.sharding`); `module.state_dict()` when
            None.
    """
    from ..models.quantization import full_precision_state_dict

    state = {
        key.replace(".base_layer.", "."): tensor
        for key, tensor in (module.state_dict() if state is None else state).items()
        if ".ituning_modules." not in key
    }
    return full_precision_state_dict(module, state)


def within(state: dict[str, torch.Tensor] | None, prefix: str) -> dict[str, torch.Tensor] | None:
    """The entries of a state dict under `prefix` (a submodule's, e.g. `"vision_model."`), named as the submodule
    names them; None for None.

    Args:
        state: A state dict, or None.
        prefix: The submodule's path and a dot.
    """
    if state is None:
        return None
    return {key[len(prefix) :]: tensor for key, tensor in state.items() if key.startswith(prefix)}


def save_unreferenced_backbones(
    captioner: Any, directory: Path, state: dict[str, torch.Tensor] | None = None
) -> dict[str, str]:
    """Save the backbones without a reference under `backbones/vision` or `backbones/text`, so the adapter still
    loads anywhere; none for a preset's seeded random backbones, which the preset's name (the adapter's recorded
    base) rebuilds. The captioner's config is left as it is (a later save elsewhere must not name these folders).

    Args:
        captioner: The `ITuningForCaptioning` the adapter is attached to.
        directory: The checkpoint directory.
        state: The captioner's state dict gathered whole (FSDP); read from its modules when None.

    Returns:
        The relative reference of each backbone saved, by sub-config (`{"vision_config": "backbones/vision"}`).
    """
    saved: dict[str, str] = {}
    if rebuilt_by_preset(captioner):
        return saved
    for name, attribute, key in (
        ("vision", "vision_model", "vision_config"),
        ("text", "language_model", "text_config"),
    ):
        reference = getattr(captioner.config, key)._name_or_path
        if not reference or reference == f"backbones/{name}":
            module = getattr(captioner, attribute)
            weights = backbone_state_dict(module, within(state, f"{attribute}."))
            module.save_pretrained(directory / "backbones" / name, state_dict=weights)
            saved[key] = f"backbones/{name}"
    return saved


def rebuilt_by_preset(model: Any) -> bool:
    """Whether `model`'s backbones are a preset's seeded random ones (no reference), which its name rebuilds.

    Args:
        model: An `ITuningForCaptioning`.
    """
    from ..presets import list_presets

    references = (model.config.vision_config._name_or_path, model.config.text_config._name_or_path)
    return model.name_or_path in list_presets() and not any(references)


def save_adapter(model: Any, directory: Path, **save_kwargs: Any) -> None:
    """Write an adapter-only checkpoint of a `PeftModel` with I-Tuning adapters into `directory`.

    Every adapter folder gets the backbone reference (`save_backbone_reference`) and the base's
    `generation_config.json` (how the captioner decodes travels with its adapter, as `convert.save_adapter` writes
    it for a native model), so that each one opens on its own and decodes as saved.

    Args:
        model: The `PeftModel`.
        directory: Target directory (exists).
        **save_kwargs: Passed to `PeftModel.save_pretrained` (e.g. `selected_adapters`). `save_embedding_layers`
            defaults to False: I-Tuning never trains the embeddings, and PEFT's "auto" looks the base up on the Hub
            (two warnings on every save where the base is a preset name or the Hub is unreachable). `state_dict`
            (the `PeftModel`'s, gathered whole from an FSDP run's shards) is where the backbones are read from too.
    """
    model.save_pretrained(directory, **{"save_embedding_layers": False, **save_kwargs})
    state = within(save_kwargs.get("state_dict"), "base_model.model.")
    for name in save_kwargs.get("selected_adapters") or list(model.peft_config):
        # beside each adapter, where PEFT puts it (the folder itself for "default", a subfolder for the others)
        folder = directory if name == "default" else directory / name
        save_backbone_reference(model.get_base_model(), folder, state)
        model.get_base_model().generation_config.save_pretrained(folder)


def save_backbone_reference(captioner: Any, directory: Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """Next to adapter files: the backbones without a reference (under `backbones/`), a `config.json` naming the
    backbones (a bare config: the adapter files hold the I-Tuning weights) and, for a quantised frozen LM,
    `frozen_lm.json` (`itune_hf.models.quantization`).

    Args:
        captioner: The `ITuningForCaptioning` (bare with PEFT adapters, or native).
        directory: The checkpoint directory.
        state: The captioner's state dict gathered whole (FSDP); read from its modules when None.
    """
    from ..models.quantization import write_record

    saved = save_unreferenced_backbones(captioner, directory, state)
    write_record(captioner, directory)  # how the frozen LM was loaded (8bit, 4bit), so that it loads the same way
    save_reference_config(captioner.config, type(captioner).__name__, directory, saved)


def save_reference_config(
    config: Any, architecture: str, directory: Path, references: dict[str, str] | None = None
) -> None:
    """Write the bare `config.json` of an adapter's base next to the adapter: the backbones' references, no I-Tuning
    modules (the adapter files hold them). The Auto classes and `pipeline` load an adapter folder through it
    (without one they swap in `base_model_name_or_path`, which may be a preset name they cannot resolve); a preset's
    seeded random backbones, which it names none of, are rebuilt from the preset name the adapter records.

    Args:
        config: The base's `ITuningConfig`.
        architecture: The base's class name (`ITuningForCaptioning`).
        directory: The adapter folder.
        references: Backbone references to write instead of the config's, by sub-config (what
            `save_unreferenced_backbones` saved).
    """
    reference = config.__class__.from_dict(config.to_dict())
    for key, path in (references or {}).items():
        getattr(reference, key)._name_or_path = path
    reference.add_ituning_modules = False  # backbones only: the adapter files hold the I-Tuning weights
    reference.architectures = [architecture]
    directory.mkdir(parents=True, exist_ok=True)
    reference.to_json_file(directory / "config.json")  # the config alone: no model code beside an adapter


__all__ = [
    "backbone_state_dict", "rebuilt_by_preset", "save_adapter", "save_backbone_reference", "save_reference_config",
    "save_unreferenced_backbones", "within",
]  # fmt: skip
