"""Registration of the I-Tuning classes with transformers and PEFT, run when those libraries are imported.

`import itune_hf` imports neither torch, transformers nor PEFT, yet users rely on it to make
`AutoConfig`/`AutoModelForImageTextToText`/`AutoProcessor` resolve the I-Tuning classes, `pipeline("image-to-text")`
build `ImageToTextPipeline` and `PeftModel.from_pretrained` load I-Tuning adapters. So `install()` (called by
`itune_hf/__init__.py`) registers at once what the already imported libraries need and puts `RegistrationFinder`
first on `sys.meta_path` for the rest: when one of the `TRIGGERS` modules finishes importing, its registration is
queued, and the queue runs as soon as no transformers, PEFT or itune_hf module is half-imported in this thread (a
registration imports those, and must never see one half-initialised). Either import order works:
`import itune_hf` before or after transformers and PEFT.

The finder only reads the spec other finders return and wraps the loader's `exec_module` of transformers, PEFT and
itune_hf modules (loader types and module attributes are unchanged); it leaves `sys.meta_path` once every
registration has run.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

# module whose import makes a registration necessary -> that registration
TRIGGERS: dict[str, str] = {
    "transformers.models.auto": "auto",  # every Auto class and from_pretrained route goes through it
    "transformers.pipelines": "pipeline",
    "peft": "peft",
    # the package plugs its adapter-only loader and offline backbones into the model (remote-code clean) file
    "itune_hf.models.ituning.modeling_ituning": "ituning_extensions",
    # the package's own modules load backbones through the shared source, with the same offline references
    "itune_hf.models._shared.backbones": "shared_resolvers",
}
# packages whose half-imported modules a registration could need (its own imports)
WATCHED = ("transformers", "peft", "itune_hf")


def _register_auto() -> None:
    from .models.auto import register_auto_classes

    register_auto_classes()


def _register_pipeline() -> None:
    from .pipelines import register_image_to_text_pipeline

    register_image_to_text_pipeline()


def _register_peft() -> None:
    from .adapter import register_ituning_peft_type

    register_ituning_peft_type()


def _register_ituning_extensions() -> None:
    from .families.ituning import extensions
    from .models.ituning import modeling_ituning

    extensions.install(modeling_ituning)


def _register_shared_resolvers() -> None:
    from .families.ituning import extensions
    from .models._shared import backbones

    extensions.install_resolver(backbones)


REGISTRATIONS: dict[str, Callable[[], None]] = {
    "auto": _register_auto,
    "pipeline": _register_pipeline,
    "peft": _register_peft,
    "ituning_extensions": _register_ituning_extensions,
    "shared_resolvers": _register_shared_resolvers,
}

_pending: set[str] = set()
_done: set[str] = set()
_running = threading.Lock()  # not reentrant: a registration's own imports never start another one
_local = threading.local()  # .depth: watched modules being executed by this thread


def _depth() -> int:
    return getattr(_local, "depth", 0)


def _is_watched(name: str) -> bool:
    return any(name == package or name.startswith(package + ".") for package in WATCHED)


def _run(name: str) -> None:
    try:
        REGISTRATIONS[name]()
    except Exception as error:  # never break the user's `import transformers` / `import peft`
        warnings.warn(
            f"itune_hf could not register its {name!r} integration ({type(error).__name__}: {error}); "
            "the I-Tuning classes may not resolve through transformers/PEFT",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        _done.add(name)


def run_pending() -> None:
    """Run the queued registrations now, unless a watched import is half done here or another thread runs them."""
    while _pending and _depth() == 0 and _running.acquire(blocking=False):
        try:
            while _pending:
                _run(_pending.pop())
        finally:
            _running.release()
    if _done == set(REGISTRATIONS):
        uninstall()


def _queue_trigger(name: str) -> None:
    registration = TRIGGERS.get(name)
    if registration is not None and registration not in _done:
        _pending.add(registration)


def _wrap_exec_module(loader: importlib.abc.Loader, name: str) -> None:
    exec_module = loader.exec_module

    def exec_then_register(module: ModuleType) -> None:
        _local.depth = _depth() + 1
        try:
            exec_module(module)
        finally:
            _local.depth -= 1
        _queue_trigger(name)
        run_pending()

    exec_then_register.__wrapped__ = exec_module
    loader.exec_module = exec_then_register


class RegistrationFinder(importlib.abc.MetaPathFinder):
    """A meta path finder that finds nothing itself: it wraps the loaders other finders return for watched modules."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """The spec the next finders give `fullname`, its loader wrapped to queue registrations (watched names only).

        Args:
            fullname: Module being imported.
            path: The parent package's `__path__` (None for a top-level module).
            target: The module object, when reloading.
        """
        if not _is_watched(fullname):
            return None
        spec = self._find_after_self(fullname, path, target)
        loader = None if spec is None else spec.loader
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec  # namespace packages, class-level (shared) loaders: left alone
        if not hasattr(loader.exec_module, "__wrapped__"):
            _wrap_exec_module(loader, fullname)
        return spec

    def _find_after_self(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> ModuleSpec | None:
        finders = sys.meta_path
        start = finders.index(self) + 1 if self in finders else 0
        for finder in finders[start:]:
            find_spec = getattr(finder, "find_spec", None)
            spec = None if find_spec is None else find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None


_finder = RegistrationFinder()


def _imported(name: str) -> bool:
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


def install() -> None:
    """Register for the libraries already imported, and hook the imports of the others (idempotent)."""
    for name in TRIGGERS:
        if _imported(name):
            _queue_trigger(name)
    if _done != set(REGISTRATIONS) and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    run_pending()


def uninstall() -> None:
    """Take the finder off `sys.meta_path` (imports then run at full speed; nothing is registered any more)."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


__all__ = ["REGISTRATIONS", "TRIGGERS", "RegistrationFinder", "install", "run_pending", "uninstall"]
