"""Conversions between the PEFT adapter format and the native `ITuningForCaptioning` modules.

Both hold the same `ITuningModule`s; only the key names differ:
`base_model.model.language_model.<ffn path>.ituning_modules.<param>` (adapter file) and `ituning.<layer>.<param>`
(full checkpoint). So an adapter-only checkpoint loads as the same native model a full checkpoint gives.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import hf_hub_download
from safetensors.torch import load_file, save_file
from transformers import GenerationConfig
from transformers.utils import GENERATION_CONFIG_NAME

from ..models._shared.backbones import vision_width
from ..models.ituning.configuration_ituning import ITuningConfig
from .base import AUTO_MAPPING
from .config import ITuningAdapterConfig
from .load_options import LoadOptions, stored_dtype
from .weight_files import FULL_WEIGHT_FILES, is_trainable_only_index

ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


def find_adapter_file(name_or_path: str | os.PathLike, filename: str, **hub_kwargs: Any) -> Path | None:
    """Path of `filename` in a local directory or Hub repo, or None when it has no such file.

    Args:
        name_or_path: Local directory or Hub repo id.
        filename: File to look for (e.g. `adapter_config.json`).
        **hub_kwargs: `revision`, `token`, `cache_dir`, `local_files_only` for Hub repos.
    """
    local = Path(name_or_path)
    if local.is_dir():
        return local / filename if (local / filename).is_file() else None
    if local.exists() or str(name_or_path).count("/") > 1:
        return None
    kwargs = {k: v for k, v in hub_kwargs.items() if k in ("revision", "token", "cache_dir", "local_files_only")}
    try:
        return Path(hf_hub_download(str(name_or_path), filename, **kwargs))
    except Exception:  # not a repo, no such file, or the Hub is unreachable: there is no adapter file here
        return None


def holds_full_weights(name_or_path: str | os.PathLike, **hub_kwargs: Any) -> bool:
    """Whether the location holds a full model's weights (a trainable-only index does not count)."""
    for name in FULL_WEIGHT_FILES:
        found = find_adapter_file(name_or_path, name, **hub_kwargs)
        if found is not None and not is_trainable_only_index(found):
            return True
    return False


def is_adapter_only_checkpoint(name_or_path: str | os.PathLike, **hub_kwargs: Any) -> bool:
    """Whether the location holds an I-Tuning adapter and no full model weights."""
    config_path = find_adapter_file(name_or_path, ADAPTER_CONFIG_NAME, **hub_kwargs)
    if config_path is None:
        return False
    if json.loads(config_path.read_text(encoding="utf-8")).get("peft_type") != "ITUNING":
        return False
    return not holds_full_weights(name_or_path, **hub_kwargs)


def refuse_adapter_without_config(name_or_path: str | os.PathLike) -> None:
    """A local folder with an adapter's weights but not its `adapter_config.json` (and no model weights): say that,
    not that `model.safetensors` is missing.

    Raises:
        FileNotFoundError: naming the folder, the missing file and how to get it.
    """
    folder = Path(name_or_path)
    if not (folder / ADAPTER_WEIGHTS_NAME).is_file() or (folder / ADAPTER_CONFIG_NAME).is_file():
        return  # (local folders only: no Hub request for a check on every load)
    if holds_full_weights(folder):
        return
    raise FileNotFoundError(
        f"{name_or_path} has {ADAPTER_WEIGHTS_NAME} but no {ADAPTER_CONFIG_NAME}: an adapter checkpoint needs both "
        "(copy the adapter_config.json that PeftModel.save_pretrained wrote next to the weights)"
    )


def _relative_to(directory: Path, reference: str) -> str:
    """Backbones saved next to an adapter (e.g. a random vision tower) are referenced relative to it."""
    if reference and not os.path.isabs(reference) and (directory / reference).is_dir():
        return str(directory / reference)
    return reference


def native_settings_from_adapter(adapter: ITuningAdapterConfig) -> dict[str, Any]:
    """`ITuningConfig` settings that make a native model carry the adapter's modules."""
    return {**adapter.settings.as_dict(), "add_ituning_modules": True}


def adapter_state_to_native(state: dict[str, torch.Tensor], ffn_paths: dict[str, int]) -> dict[str, torch.Tensor]:
    """Rename adapter-file keys to native keys.

    Args:
        state: Tensors of `adapter_model.safetensors`.
        ffn_paths: Module path of each LM feed-forward block inside the captioning model (e.g.
            `"language_model.transformer.h.3.mlp"`) -> its layer index.

    Raises:
        ValueError: for a key that is not an I-Tuning weight of a known feed-forward block.
    """
    native = {}
    for key, tensor in state.items():
        path, marker, param = key.removeprefix(_PEFT_PREFIX).partition(".ituning_modules.")
        if not marker or path not in ffn_paths:
            raise ValueError(f"Adapter weight {key!r} does not belong to an I-Tuning module of this model's LM")
        native[f"ituning.{ffn_paths[path]}.{param}"] = tensor
    return native


def _base_references(
    model_class, adapter_path: str | os.PathLike, adapter_config: ITuningAdapterConfig, hub_kwargs: dict, kwargs: dict
) -> tuple[str, str]:
    """The (vision, text) references of an adapter's base: from the reference `config.json` next to it, else its
    `base_model_name_or_path` (a preset or a full checkpoint), else the `backbones` it recorded when created."""
    base_config_path = find_adapter_file(adapter_path, "config.json", **hub_kwargs)
    if base_config_path is not None:  # a reference config naming the backbones (no weights are stored with it)
        base_config = ITuningConfig.from_json_file(str(base_config_path))
        return tuple(
            _relative_to(base_config_path.parent, ref)
            for ref in (base_config.vision_config._name_or_path, base_config.text_config._name_or_path)
        )
    base_name = adapter_config.base_model_name_or_path
    if not base_name and adapter_config.backbones:
        return tuple(adapter_config.backbones)
    if not base_name:
        raise ValueError(
            f"{adapter_path}: the adapter names no base (no config.json, empty base_model_name_or_path in "
            f"{ADAPTER_CONFIG_NAME}); load it with PeftModel.from_pretrained(<base model>, {str(adapter_path)!r})"
        )
    from ..presets import get_preset, list_presets

    if base_name in list_presets():
        return (get_preset(base_name).vision.hub_id, get_preset(base_name).text.hub_id)
    base = model_class.from_pretrained(base_name, **kwargs)
    return (base.config.vision_config._name_or_path, base.config.text_config._name_or_path)


def _referenced_backbones(adapter_path: str | os.PathLike, hub_kwargs: dict) -> tuple[str, str]:
    """The (vision, text) backbones the reference `config.json` next to an adapter names ("" each where it names
    none, or it is missing)."""
    path = find_adapter_file(adapter_path, "config.json", **hub_kwargs)
    if path is None:
        return "", ""
    config = ITuningConfig.from_json_file(str(path))
    return config.vision_config._name_or_path or "", config.text_config._name_or_path or ""


def _is_full_checkpoint(name_or_path: str | None) -> bool:
    """Whether `name_or_path` is a local folder holding a whole captioner (its config and weights, no adapter)."""
    if not name_or_path or not Path(name_or_path).is_dir():
        return False
    folder = Path(name_or_path)
    weights = any((folder / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json"))
    return weights and (folder / "config.json").is_file() and not (folder / ADAPTER_CONFIG_NAME).is_file()


def _native_base(
    model_class, adapter_path, adapter_config: ITuningAdapterConfig, settings: dict, hub_kwargs: dict, kwargs: dict
):
    """The native model (fresh I-Tuning modules with the adapter's settings) that the adapter's weights go into:
    built from the preset that names the base (its reference `config.json`, if any, names no backbones: a preset's
    seeded random ones, in the dtype asked for, else the adapter file's, as a full checkpoint's `"auto"` reads its
    file), else from the backbones' references."""
    from ..presets import build_model, list_presets

    options = LoadOptions.from_kwargs(kwargs, adapter_path)
    base_name = adapter_config.base_model_name_or_path
    if base_name in list_presets() and not any(_referenced_backbones(adapter_path, hub_kwargs)):
        model = build_model(base_name, pretrained=True, **settings)  # seeded random backbones come out the same
        weights = find_adapter_file(adapter_path, ADAPTER_WEIGHTS_NAME, **hub_kwargs)
        return model.to(options.dtype or (weights and stored_dtype(weights)) or torch.float32)
    backbone_kwargs = dict(hub_kwargs)
    if options.backbone_dtype is not None:
        backbone_kwargs["dtype"] = options.backbone_dtype
    references = _base_references(model_class, adapter_path, adapter_config, hub_kwargs, kwargs)
    if not all(references) and _is_full_checkpoint(base_name):
        # a base loaded bare from a full checkpoint (`from_pretrained(dir, add_ituning_modules=False)`): its
        # backbones are in its weights; its modules are rebuilt with the adapter's settings, whose weights follow
        return model_class.from_pretrained(base_name, ignore_mismatched_sizes=True, **settings, **backbone_kwargs)
    if not all(references):
        raise ValueError(
            f"{adapter_path}: the base config does not name its backbones (vision {references[0]!r}, text "
            f"{references[1]!r}); load the adapter with PeftModel.from_pretrained(<base model>, ...)"
        )
    return model_class.from_vision_text_pretrained(
        *references, vision_kwargs=backbone_kwargs, text_kwargs=backbone_kwargs, **settings
    )


def load_native_from_adapter(model_class, adapter_path: str | os.PathLike, **kwargs: Any):
    """Load an adapter-only checkpoint as a native model with the adapter's modules built in.

    The base comes from the checkpoint's `config.json` (a bare `ITuningConfig` whose sub-configs name the backbones
    to load) or, failing that, from `base_model_name_or_path` in `adapter_config.json` (a full I-Tuning checkpoint
    or a preset name) or the `backbones` it recorded (a plain `PeftModel.save_pretrained` folder of an adapter on a
    base built with `from_vision_text_pretrained`).

    Args:
        model_class: `ITuningForCaptioning` (or a subclass).
        adapter_path: Local directory or Hub repo of the adapter.
        **kwargs: `from_pretrained` options: `revision`, `token`, `cache_dir`, `local_files_only` and `dtype` (also
            used for the backbones), `attn_implementation`, `device_map` (one device), `output_loading_info`
            (see `load_options.LoadOptions`).
    """
    hub_kwargs = {k: kwargs[k] for k in ("revision", "token", "cache_dir", "local_files_only") if k in kwargs}
    adapter_config = ITuningAdapterConfig.from_pretrained(str(adapter_path), **hub_kwargs)
    weights_path = find_adapter_file(adapter_path, ADAPTER_WEIGHTS_NAME, **hub_kwargs)
    if weights_path is None:
        raise FileNotFoundError(f"{adapter_path} has {ADAPTER_CONFIG_NAME} but no {ADAPTER_WEIGHTS_NAME}")

    options = LoadOptions.from_kwargs(kwargs, adapter_path)
    settings = native_settings_from_adapter(adapter_config)
    model = _native_base(model_class, adapter_path, adapter_config, settings, hub_kwargs, kwargs)
    load_adapter_weights(model, weights_path, adapter_path)
    generation = find_adapter_file(adapter_path, GENERATION_CONFIG_NAME, **hub_kwargs)
    if generation is not None:  # the adapter's decoding settings, as a full checkpoint's load reads them
        model.generation_config = GenerationConfig.from_pretrained(generation.parent)
    floating = next(p.dtype for p in model.language_model.parameters() if p.is_floating_point())  # (not int8 weights)
    model.ituning.to(floating)  # one dtype, as a full checkpoint loads
    model.name_or_path = str(adapter_path)  # as from_pretrained names a model: where it came from (its datastore/)
    model.eval()
    return options.returned(options.apply(model))


def load_adapter_weights(model: Any, weights_path: str | os.PathLike, name: Any = None) -> None:
    """Load an adapter's `adapter_model.safetensors` into the native I-Tuning modules of `model`, in place.

    Args:
        model: A native `ITuningForCaptioning` with modules of the adapter's shape.
        weights_path: The adapter's weight file.
        name: How errors name the adapter (default: `weights_path`).
    """
    name = weights_path if name is None else name
    ffn_paths = {f"language_model.{site.path}": site.index for site in model.ffn_sites}
    state = adapter_state_to_native(load_file(str(weights_path)), ffn_paths)
    expected = {k: v for k, v in model.state_dict().items() if k.startswith("ituning.")}
    missing, unexpected = expected.keys() - state.keys(), state.keys() - expected.keys()
    if missing or unexpected:
        raise ValueError(
            f"{name}: the adapter does not fit its base: {len(missing)} module weights missing (e.g. "
            f"{sorted(missing)[:3]}), {len(unexpected)} unexpected (e.g. {sorted(unexpected)[:3]})"
        )
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise ValueError(
                f"{name}: adapter weight {key} has shape {tuple(tensor.shape)} but the model expects "
                f"{tuple(expected[key].shape)}"
            )
    model.load_state_dict(state, strict=False)


def save_adapter(model: Any, save_directory: str | os.PathLike, *, processor: Any | None = None) -> Path:
    """Write the adapter-only files of an I-Tuning captioner: `adapter_config.json`, `adapter_model.safetensors`
    (the I-Tuning weights only), a `config.json` naming the frozen backbones, and the backbones that have no reference
    (random ones) under `backbones/`; a native model on a preset's seeded random backbones (`build_model`) gets
    neither: the preset name recorded as its base rebuilds them. The folder loads with
    `PeftModel.from_pretrained(base, folder)` and `ITuningForCaptioning.from_pretrained(folder)`, like one written by
    `PeftModel.save_pretrained`.

    Args:
        model: A native `ITuningForCaptioning` (e.g. trained with `Trainer`, whose checkpoints hold the whole model)
            or a `PeftModel` with I-Tuning adapters.
        save_directory: Target directory (created if needed).
        processor: Saved alongside when given.

    Returns:
        The directory.
    """
    from ..models.ituning.settings import ITuningSettings
    from .saving import save_backbone_reference

    directory = Path(save_directory)
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "get_base_model"):
        from ..hub import save_captioner

        return save_captioner(model, directory, processor=processor)
    if not hasattr(model, "ituning") or not len(model.ituning):
        raise ValueError(f"{type(model).__name__} has no native I-Tuning modules to export as an adapter")
    text, vision, sites = model.config.text_config, model.config.vision_config, model.ffn_sites
    paths = {str(site.index): site.path for site in sites if str(site.index) in model.ituning}
    config = ITuningAdapterConfig(**ITuningSettings.from_object(model.config).as_dict(), inference_mode=True)
    recorded = dict(
        text_model_type=text.model_type, text_hidden_size=text.hidden_size, text_num_layers=len(sites),
        vision_model_type=vision.model_type, vision_hidden_size=vision_width(vision),
        bottleneck_dim=config.settings.resolved_bottleneck_dim(text.hidden_size),
        target_modules=r"^language_model\.(" + "|".join(re.escape(p) for p in paths.values()) + r")$",
        base_model_name_or_path=model.name_or_path or None, backbones=[vision._name_or_path, text._name_or_path],
        auto_mapping=AUTO_MAPPING,
    )  # fmt: skip
    for key, value in recorded.items():  # what get_peft_model records about the base
        setattr(config, key, value)
    config.save_pretrained(str(directory))
    state = {
        f"{_PEFT_PREFIX}language_model.{paths[layer]}.ituning_modules.{name}": tensor.detach().contiguous().cpu()
        for layer, module in model.ituning.items()
        for name, tensor in module.state_dict().items()
    }
    save_file(state, str(directory / ADAPTER_WEIGHTS_NAME), metadata={"format": "pt"})
    model.generation_config.save_pretrained(directory)  # how the captioner decodes travels with its adapter
    save_backbone_reference(model, directory)  # (none of a preset's backbones: its name rebuilds them)
    if processor is not None:
        processor.save_pretrained(directory)
    return directory


__all__ = [
    "adapter_state_to_native",
    "find_adapter_file",
    "holds_full_weights",
    "is_adapter_only_checkpoint",
    "is_trainable_only_index",
    "load_native_from_adapter",
    "native_settings_from_adapter",
    "refuse_adapter_without_config",
    "save_adapter",
]
