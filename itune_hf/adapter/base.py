"""What `AutoPeftModel` loads an I-Tuning adapter's base with.

An adapter records its base (`base_model_name_or_path`) and, in `auto_mapping`, the class whose `from_pretrained`
rebuilds it. The base an adapter attaches to is the captioner *without* native I-Tuning modules; a full checkpoint
loaded plainly has them (and PEFT refuses to add an adapter beside them). So adapters name `ITuningBase`, whose
`from_pretrained` loads any base (a full checkpoint, a preset name, a Hub id) bare.
"""

from __future__ import annotations

import os
from typing import Any

#: The `auto_mapping` every I-Tuning adapter records (`AutoPeftModel.from_pretrained(folder,
#: import_allowlist=["itune_hf"])` imports `parent_library` and calls the class's `from_pretrained`).
AUTO_MAPPING = {"base_model_class": "ITuningBase", "parent_library": __name__}


class ITuningBase:
    """Loads the bare base of an I-Tuning adapter: `ITuningForCaptioning.from_pretrained(..., add_ituning_modules=
    False)`, so that a full checkpoint's own modules make way for the adapter's."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, **kwargs: Any):
        """The captioner at `pretrained_model_name_or_path` without native I-Tuning modules.

        Args:
            pretrained_model_name_or_path: A full checkpoint (local or Hub) or a preset name.
            *args, **kwargs: As in `ITuningForCaptioning.from_pretrained`.
        """
        from ..models.ituning.modeling_ituning import ITuningForCaptioning

        kwargs.setdefault("add_ituning_modules", False)
        return ITuningForCaptioning.from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


__all__ = ["AUTO_MAPPING", "ITuningBase"]
