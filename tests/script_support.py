"""A script of `benchmarks/` loaded as a module, so that tests can call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, *, register: bool = False) -> ModuleType:
    """The script at `path` as a module named after its file.

    Args:
        path: The script.
        register: Also put it in `sys.modules` (a script whose dataclasses look their module up there); the caller
            removes it after (`sys.modules.pop(module.__name__)`).
    """
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
