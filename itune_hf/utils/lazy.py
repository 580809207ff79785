"""Packages whose public names are imported on first use (so that importing the package stays cheap)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, exports: dict[str, str], namespace: dict[str, Any], *, submodules: bool = False
) -> tuple[Callable, Callable]:
    """The `__getattr__` and `__dir__` of a package whose names live in its submodules.

    Args:
        package: The package's `__name__`.
        exports: Public name -> submodule defining it: relative to the package (`"loop"`), or absolute for a name
            that lives elsewhere in the project and is importable from here too (`"itune_hf.evaluation"`).
        namespace: The package's `globals()`: a name is cached there once imported.
        submodules: Also give the package's submodules as attributes (`itune_hf.hub` after a bare `import itune_hf`).
    """

    def __getattr__(name: str) -> Any:
        if name in exports:
            module = exports[name]
            absolute = module.startswith(package.partition(".")[0] + ".")
            value = getattr(importlib.import_module(module if absolute else f".{module}", package), name)
        elif submodules and not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f".{name}", package)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
