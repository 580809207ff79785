"""Loading a trained captioner of any registered family the way transformers users do: through the Auto classes."""

from __future__ import annotations

import os
from typing import Any

from .registry import family_of


def load_captioner(name_or_path: str | os.PathLike, **kwargs: Any) -> tuple[Any, Any]:
    """A captioning model (in eval mode) and its processor, from a full or an adapter-only checkpoint.

    Goes through `AutoModelForImageTextToText` and `AutoProcessor`, so any registered family loads (see
    `itune_hf.models`), as it would in a user's own code after `import itune_hf`.

    Args:
        name_or_path: Local directory or Hub repo id.
        **kwargs: Passed to the model's `from_pretrained` (`revision`, `dtype`, ...).

    Raises:
        ValueError: when the checkpoint is not a captioner of a registered family.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(name_or_path, **kwargs)
    family_of(model)  # refuses other image-text-to-text models: the commands rely on a family's behaviour
    hub_kwargs = {key: kwargs[key] for key in ("revision", "token", "cache_dir", "local_files_only") if key in kwargs}
    return model.eval(), AutoProcessor.from_pretrained(name_or_path, **hub_kwargs)


__all__ = ["load_captioner"]
