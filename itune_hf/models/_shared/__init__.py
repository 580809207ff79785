"""Code every model family shares, written once here.

Remote code (a checkpoint loaded with `trust_remote_code=True` where itune_hf is not installed) carries the files
its model file imports from beside it, so each family folder holds a generated copy of the files it uses, under a
"Generated from" header: `make fix-copies` (tools/fix_copies.py) writes them, and `tests/models/test_shared_copies.py`
fails when one differs from its source. The package's own modules (training, pipelines, commands, ...) import from
here, never from a family folder. Files here import only the standard library, numpy, PIL, torch and transformers.

Inside the installed package a family's copy of `images.py` *is* the shared module (`share_module`): one
`ImageError` class, whichever family's processor raised it. Remote code loads the checkpoint's own copy.
"""

from __future__ import annotations

import importlib
import sys


def share_module(package: str, name: str) -> None:
    """Make the family `package`'s generated copy `name` the shared module itself, within the installed package.

    Call it from the family's `__init__` (which runs before any of its files). Classes then exist once (an
    `ImageError` from XGPT's processor is the one `itune_hf.models._shared.images` exports); remote code is unaffected.

    Args:
        package: The family package's `__name__`.
        name: The shared module, e.g. `"images"`.
    """
    sys.modules.setdefault(f"{package}.{name}", importlib.import_module(f"{__name__}.{name}"))


__all__ = ["share_module"]
