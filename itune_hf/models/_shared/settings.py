"""What every family's settings dataclass does alike: its names and their help, the settings read off any object that
holds them (a config, an adapter config), and a plain dict. Pure Python.

A family's `settings.py` carries a copy of `SettingsFields` under a `# Copied from` marker (`make fix-copies`), and
its settings dataclass takes it as a base.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class SettingsFields:
    """Field-wise helpers of a settings dataclass (its direct subclass). A class inheriting the settings (a config,
    an adapter config) still reads only the settings' own fields."""

    @classmethod
    def settings_class(cls) -> type:
        """The settings dataclass itself (the class that takes this mixin), also when asked on a subclass."""
        return next(klass for klass in cls.__mro__ if SettingsFields in klass.__bases__)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The setting names, in definition order (the same names everywhere: config, adapter, `itune train`)."""
        return tuple(f.name for f in dataclasses.fields(cls.settings_class()))

    @classmethod
    def help(cls, name: str) -> str:
        """The help text of setting `name` (shown by `itune train --help`).

        Args:
            name: One of `names()`.
        """
        return next(f.metadata["help"] for f in dataclasses.fields(cls.settings_class()) if f.name == name)

    @classmethod
    def from_object(cls, source: Any, **overrides: Any) -> Any:
        """The settings held by `source` (a config, an adapter config, ...), with `overrides` applied (`None`
        overrides are ignored).

        Args:
            source: Any object with the setting names as attributes.
            **overrides: Settings replacing those of `source`.
        """
        values = {name: getattr(source, name) for name in cls.names()}
        values.update({name: value for name, value in overrides.items() if value is not None})
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (only the setting names, also on subclasses)."""
        return {name: getattr(self, name) for name in self.names()}


__all__ = ["SettingsFields"]
