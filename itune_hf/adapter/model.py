"""The PEFT tuner of the I-Tuning adapter type: finds the LM feed-forward blocks and wraps them."""

from __future__ import annotations

import copy
import re

from peft.tuners.tuners_utils import BaseTuner, check_target_module_exists
from torch import nn

from ..models._shared.backbones import vision_width
from .config import ITuningAdapterConfig
from .layer import MERGE_REFUSED, ITuningLayer


def _base_description(config: ITuningAdapterConfig) -> str:
    return (
        f"LM {config.text_model_type} (hidden {config.text_hidden_size}, {config.text_num_layers} layers), "
        f"vision {config.vision_model_type} (hidden {config.vision_hidden_size})"
    )


def _refuse_native_modules(model: nn.Module) -> None:
    """An adapter on a model that has its own (native) I-Tuning modules would run two sets side by side."""
    native = getattr(model, "ituning", None)
    if native is not None and len(native) > 0:
        raise ValueError(
            f"This {type(model).__name__} already has native I-Tuning modules (layers {sorted(native, key=int)}, in "
            "model.ituning): an I-Tuning adapter would add a second set beside them. Attach adapters to a bare base "
            "instead: build_model(preset, add_ituning_modules=False), ITuningForCaptioning.from_vision_text_pretrained"
            "(..., add_ituning_modules=False) or ITuningForCaptioning.from_pretrained(dir, add_ituning_modules=False)"
            "; or train and use the native modules as they are (no PEFT)."
        )


class _BaseReference:
    """What an adapter config keeps of its base to write the reference `config.json`: the config and the class
    name, read when saving (a deep copy of the adapter config copies no model)."""

    def __init__(self, model: nn.Module) -> None:
        self.config, self.architecture = model.config, type(model).__name__

    def __deepcopy__(self, memo: dict) -> _BaseReference:
        return self


class ITuningTuner(BaseTuner):
    """Injects I-Tuning modules in parallel to the feed-forward blocks of an [`ITuningForCaptioning`]'s LM.

    Used through PEFT: `get_peft_model(model, ITuningAdapterConfig(...))`, `PeftModel.from_pretrained(model, dir)`.

    Args:
        model: The captioning model (usually a bare one, `add_ituning_modules=False`).
        config: The adapter config, or a dict of them by adapter name.
        adapter_name: Name of the adapter to create.
        low_cpu_mem_usage: As in PEFT: the modules are created on the meta device, for a load to fill in.
    """

    prefix: str = "ituning_"
    tuner_layer_cls = ITuningLayer
    target_module_mapping: dict = {}

    # ------------------------------------------------------------------ checks and target selection
    def inject_adapter(self, model: nn.Module, adapter_name: str, *args, **kwargs) -> None:
        # Every adapter is checked against the base and records it here: PEFT calls `_pre_injection_hook` for the
        # first adapter only, while `add_adapter` and `load_adapter` come through this method too. It records into
        # a copy: the caller's config stays as given, for another base (as a LoRA config is reused).
        self.peft_config[adapter_name] = copy.deepcopy(self.peft_config[adapter_name])
        self._check_and_record_base(model, self.peft_config[adapter_name])
        super().inject_adapter(model, adapter_name, *args, **kwargs)

    def _check_and_record_base(self, model: nn.Module, config: ITuningAdapterConfig) -> None:
        if not (hasattr(model, "ffn_sites") and hasattr(model, "vision_context")):
            raise TypeError(
                f"The I-Tuning adapter attaches to an ITuningForCaptioning model (which supplies the vision states), "
                f"got {type(model).__name__}. Build one with ITuningForCaptioning.from_vision_text_pretrained(...) "
                "or from a preset (itune_hf.build_model)."
            )
        _refuse_native_modules(model)
        text, vision = model.config.text_config, model.config.vision_config
        actual = {
            "text_model_type": text.model_type,
            "text_hidden_size": text.hidden_size,
            "text_num_layers": len(model.ffn_sites),
            "vision_model_type": vision.model_type,
            "vision_hidden_size": vision_width(vision),
        }
        recorded = {key: getattr(config, key) for key in actual}
        if any(value is not None for value in recorded.values()):
            mismatched = {k for k in actual if recorded[k] is not None and recorded[k] != actual[k]}
            if mismatched:
                expected_cfg = ITuningAdapterConfig(**{**recorded, "first_layer": 0})
                actual_cfg = ITuningAdapterConfig(**{**actual, "first_layer": 0})
                raise ValueError(
                    f"This I-Tuning adapter was built for {_base_description(expected_cfg)}, but the base model has "
                    f"{_base_description(actual_cfg)} (mismatch in {sorted(mismatched)}). Load it onto the base it was "
                    f"trained with (adapter_config.json: base_model_name_or_path={config.base_model_name_or_path!r})."
                )
        for key, value in actual.items():
            setattr(config, key, value)
        object.__setattr__(config, "_base_model", _BaseReference(model))  # for the reference config.json on saving
        if config.backbones is None:  # created now (a loaded adapter keeps what it recorded)
            config.backbones = [vision._name_or_path, text._name_or_path]
        settings = config.settings  # resolved against this base: the width is recorded, the layers checked
        config.bottleneck_dim = settings.resolved_bottleneck_dim(text.hidden_size)
        settings.layers(len(model.ffn_sites))
        model.vision_context.selection(settings.visual_tokens, settings.final_norm)  # the tower can give them

    def _prepare_adapter_config(self, peft_config: ITuningAdapterConfig, model_config: dict) -> ITuningAdapterConfig:
        if peft_config.target_modules is None:
            paths = [site.path for site in self.model.ffn_sites if site.index >= peft_config.first_layer]
            peft_config.target_modules = r"^language_model\.(" + "|".join(re.escape(p) for p in paths) + r")$"
        elif not any(
            self._check_target_module_exists(peft_config, f"language_model.{s.path}") for s in self.model.ffn_sites
        ):
            raise ValueError(
                f"target_modules={peft_config.target_modules!r} matches no LM feed-forward block at or above "
                f"first_layer={peft_config.first_layer} (the blocks: language_model.{self.model.ffn_sites[0].path} "
                f"... language_model.{self.model.ffn_sites[-1].path}). Lower first_layer, or leave target_modules "
                "unset to wrap every block from first_layer on."
            )
        return peft_config

    def _check_target_module_exists(self, peft_config: ITuningAdapterConfig, key: str):
        # `first_layer` narrows a user's `target_modules` as LoRA's `layers_to_transform` does: a feed-forward block
        # below it gets no module, whatever the regex matched (an empty result is PEFT's "not found" error)
        matched = check_target_module_exists(peft_config, key)
        if matched and peft_config.first_layer > 0:
            site = self._site_at(key)
            if site is not None and site.index < peft_config.first_layer:
                return False
        return matched

    def _site_at(self, key: str):
        return next((s for s in self.model.ffn_sites if f"language_model.{s.path}" == key), None)

    # ------------------------------------------------------------------ injection
    def _create_and_replace(
        self,
        peft_config: ITuningAdapterConfig,
        adapter_name: str,
        target: nn.Module,
        target_name: str,
        parent: nn.Module,
        current_key: str,
        **optional_kwargs,
    ) -> None:
        if isinstance(target, ITuningLayer):
            target.update_layer(adapter_name, peft_config)
            return
        site = self._site_at(current_key)
        if site is None:
            raise ValueError(
                f"target_modules matched {current_key!r}, which is not the feed-forward block of an LM layer; "
                "I-Tuning modules attach only to the blocks listed in model.ffn_sites"
            )
        new_module = ITuningLayer(
            target,
            adapter_name,
            config=peft_config,
            layer_index=site.index,
            context=self.model.vision_context,
            hidden_size=self.model.config.text_config.hidden_size,
            vision_hidden_size=vision_width(self.model.config.vision_config),
        )
        if adapter_name not in self.active_adapters:
            new_module.requires_grad_(False)  # an added, inactive adapter is not trainable until set_adapter
        self._replace_module(parent, target_name, new_module, target)

    def _replace_module(self, parent: nn.Module, child_name: str, new_module: nn.Module, child: nn.Module) -> None:
        setattr(parent, child_name, new_module)

    def _mark_only_adapters_as_trainable(self, model: nn.Module) -> None:
        # Freeze everything but the adapters; whether an adapter trains is set_adapter's call (PEFT sets it from
        # `inference_mode`: False after get_peft_model, True after PeftModel.from_pretrained without is_trainable).
        for name, param in model.named_parameters():
            if ".ituning_modules." not in name:
                param.requires_grad = False

    # ------------------------------------------------------------------ merging is not defined for I-Tuning
    def _check_merge_allowed(self) -> None:
        raise NotImplementedError(MERGE_REFUSED)

    def merge_and_unload(self, *args, **kwargs):
        raise NotImplementedError(MERGE_REFUSED)

    def merge_adapter(self, *args, **kwargs) -> None:
        raise NotImplementedError(MERGE_REFUSED)

    def add_weighted_adapter(self, adapters=None, *args, **kwargs) -> None:
        raise NotImplementedError(
            f"add_weighted_adapter({adapters!r}): I-Tuning modules are cross-attention blocks over the image, not "
            "weight deltas: a weighted sum of adapters (PEFT's combination of LoRA deltas) is not defined for them. "
            "Switch between adapters with set_adapter, or train one adapter on the data of both."
        )

    # ------------------------------------------------------------------ saving and loading
    @classmethod
    def _remove_adapter_name_from_key(cls, key: str, adapter_name: str) -> str:
        # "...mlp.ituning_modules.<adapter>.q_proj.weight" -> "...mlp.ituning_modules.q_proj.weight": the adapter name
        # sits third from the end (ModuleDict -> module -> Linear -> weight), where PEFT's default does not look.
        return key.replace(f".ituning_modules.{adapter_name}.", ".ituning_modules.")

    @classmethod
    def _remap_adapter_state_dict_for_load(cls, model, config, adapter_name, state_dict):
        remapped = super()._remap_adapter_state_dict_for_load(model, config, adapter_name, state_dict)
        model_state = model.state_dict()
        expected = {k for k in model_state if f".ituning_modules.{adapter_name}." in k}
        loaded = {k for k in remapped if f".ituning_modules.{adapter_name}." in k}
        for key in sorted(loaded & expected):
            if tuple(remapped[key].shape) != tuple(model_state[key].shape):
                raise ValueError(
                    f"I-Tuning adapter weight {key} has shape {tuple(remapped[key].shape)} in the checkpoint but "
                    f"{tuple(model_state[key].shape)} in the model: the adapter belongs to a base of another size"
                )
        missing, unexpected = expected - loaded, set(remapped) - model_state.keys()
        if missing or unexpected:
            raise ValueError(
                f"The I-Tuning adapter checkpoint does not fit this model: {len(missing)} module weights missing "
                f"(e.g. {sorted(missing)[:3]}), {len(unexpected)} unexpected (e.g. {sorted(unexpected)[:3]})"
            )
        return remapped
