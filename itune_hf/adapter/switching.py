"""Several domains on one frozen base: I-Tuning adapters loaded side by side with PEFT and switched per request.

`load_adapter_set({"coco": DIR, "photos": DIR2})` builds the frozen base (vision tower and LM) once, from the first
adapter's checkpoint, and loads every adapter onto it (`PeftModel.from_pretrained`, then `load_adapter`); `use(name)`
makes one active (`set_adapter`, a flag on each tuner layer: no weight is copied) and returns the captioner to call
`generate` on. Memory is one base plus N adapters (docs/adapters.md has the measurements). Each adapter must have been
trained on the same base: the backbones each names are compared before anything loads.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")


def parse_named_adapters(values: list[str], option: str = "--adapter") -> dict[str, str]:
    """`NAME=DIR` values (or a bare `DIR`, named after its folder) as {name: directory}, in the order given.

    Args:
        values: The option's values, e.g. `["coco=runs/coco", "runs/photos"]`.
        option: The option's spelling, for the messages.

    Raises:
        ValueError: naming the option and the value, for an empty name or directory or a name given twice.
    """
    named: dict[str, str] = {}
    for value in values:
        name, equals, path = value.partition("=")
        if not equals or Path(value).exists():
            name, path = Path(value.rstrip("/")).name, value
        if not _NAME.fullmatch(name) or not path:
            raise ValueError(
                f"{option} {value}: expected NAME=DIR (a name of letters, digits, '_', '.', '-', e.g. coco=runs/coco) "
                "or an adapter directory"
            )
        if name in named:
            raise ValueError(
                f"{option} {value}: the name {name!r} is given twice ({named[name]} and {path}); name each adapter "
                "with NAME=DIR"
            )
        named[name] = path
    return named


def base_identity(adapter_path: str | os.PathLike) -> tuple[str, ...]:
    """What identifies the frozen base an adapter-only checkpoint was trained on: each backbone's reference (a Hub
    id or a preset), or for a backbone saved next to the adapter (a random or local one) the SHA-256 of its weights.

    Args:
        adapter_path: The adapter's directory.
    """
    from ..models.ituning.modeling_ituning import ITuningForCaptioning
    from .config import ITuningAdapterConfig
    from .convert import _base_references

    config = ITuningAdapterConfig.from_pretrained(str(adapter_path))
    references = _base_references(ITuningForCaptioning, adapter_path, config, {}, {})
    if not any(references):  # a preset's seeded random backbones: the preset's name says which
        return (str(config.base_model_name_or_path),)
    return tuple(_weights_digest(Path(ref)) if Path(ref).is_dir() else ref for ref in references)


def _weights_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


@dataclass
class AdapterSet:
    """Named I-Tuning adapters on one frozen base, one active at a time.

    Attributes:
        model: The `PeftModel` holding every adapter.
        processor: The processor (the first adapter's).
        paths: Adapter name -> the directory it was loaded from, in the order given.
    """

    model: Any
    processor: Any
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """The adapters' names, in the order given."""
        return list(self.paths)

    @property
    def captioner(self) -> Any:
        """The `ITuningForCaptioning` the adapters are attached to (call `generate` on it)."""
        return self.model.base_model.model

    def use(self, name: str) -> Any:
        """Make adapter `name` the active one and return the captioner.

        Args:
            name: One of `names`.

        Raises:
            ValueError: for an unknown name, listing the known ones.
        """
        if name not in self.paths:
            raise ValueError(f"unknown adapter {name!r}; choose one of {', '.join(self.names)}")
        if self.model.active_adapter != name:
            self.model.set_adapter(name)
        return self.captioner


def load_adapter_set(adapters: dict[str, str], **kwargs: Any) -> AdapterSet:
    """Load the base of the first adapter once and every adapter onto it (eval mode; the first is active).

    Args:
        adapters: Name -> adapter-only checkpoint directory (`itune train` output), at least one.
        **kwargs: `dtype` for the base.

    Raises:
        InputError: naming the adapter, when a directory is not an adapter-only I-Tuning checkpoint or was trained
            on another base than the first.
    """
    from peft import PeftModel

    from ..errors import InputError
    from ..models.ituning.modeling_ituning import ITuningForCaptioning
    from ..models.loading import check_checkpoint_dir
    from .config import ITuningAdapterConfig
    from .convert import _native_base, is_adapter_only_checkpoint, native_settings_from_adapter

    if not adapters:
        raise ValueError("load_adapter_set needs at least one adapter")
    identities = {}
    for name, path in adapters.items():
        if not Path(path).is_dir() or not is_adapter_only_checkpoint(path):
            raise InputError(
                f"--adapter {name}={path}: not an adapter-only I-Tuning checkpoint (no adapter_config.json of type "
                "ITUNING without full weights); pass a directory written by itune train for an I-Tuning preset"
            )
        check_checkpoint_dir(path)
        identities[name] = base_identity(path)
    first, first_path = next(iter(adapters.items()))
    for name, path in adapters.items():
        if identities[name] != identities[first]:
            raise InputError(
                f"--adapter {name}={path}: trained on another base than --adapter {first}={first_path} (other "
                "backbones); adapters share one base only when trained on the same one: caption with each separately"
            )
    config = ITuningAdapterConfig.from_pretrained(first_path)
    settings = {**native_settings_from_adapter(config), "add_ituning_modules": False}
    base = _native_base(ITuningForCaptioning, first_path, config, settings, {}, kwargs)
    model = PeftModel.from_pretrained(base, first_path, adapter_name=first)
    for name, path in list(adapters.items())[1:]:
        _load_another_adapter(model, name, path)
    model.set_adapter(first)
    return AdapterSet(model.eval(), _processor(first_path), dict(adapters))


def _load_another_adapter(model: Any, name: str, path: str) -> None:
    """`model.load_adapter(path, adapter_name=name)`, checked here: PEFT finds an adapter's missing keys by its name as
    a substring, so a short name (`b`) matched `base_model...` and every key of the adapters loaded before it was
    reported missing. Its warning is dropped once every weight of the file is found in place, and kept otherwise."""
    import warnings

    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from ..errors import InputError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_adapter(path, adapter_name=name)
    saved = load_file(Path(path) / "adapter_model.safetensors")
    loaded = get_peft_model_state_dict(model, adapter_name=name, save_embedding_layers=False)  # no Hub lookup
    absent = sorted(key for key in saved if key not in loaded or not loaded[key].cpu().equal(saved[key]))
    if absent:
        raise InputError(f"--adapter {name}={path}: {len(absent)} of its weights did not load (e.g. {absent[0]})")
    for warning in caught:
        if "Found missing adapter keys" not in str(warning.message):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def _processor(path: str) -> Any:
    from transformers import AutoProcessor

    from ..utils.files import reading

    with reading(path, "the processor", "save or download the checkpoint again"):
        return AutoProcessor.from_pretrained(path)


__all__ = ["AdapterSet", "base_identity", "load_adapter_set", "parse_named_adapters"]
