"""Registration of the I-Tuning adapter type in PEFT: the only place that touches PEFT's private surface.

PEFT's `register_peft_method` accepts only names that are already members of its closed `PeftType` enum, and
PEFT offers no public way to add one. We add the member `ITUNING` at import time, through the enum's internal
tables (`_member_map_`, `_value2member_map_`, `_member_names_`), then register the config and tuner classes
through the public `register_peft_method`. `tests/adapter/test_registration.py` checks every assumption made
here and fails loudly, naming the assumption, when PEFT or Python changes underneath it. The PEFT range this was
tested on is the one `setup.cfg` declares (`peft_tested_range()`); `import itune_hf` warns once outside it
(`_versions`).
"""

from __future__ import annotations

import enum

import peft
from packaging.specifiers import SpecifierSet
from peft.utils import PeftType, register_peft_method

PEFT_TYPE_NAME = "ITUNING"
PEFT_METHOD_NAME = "ituning"
PEFT_PREFIX = "ituning_"


def add_enum_member(enum_class: type[enum.Enum], name: str, value: str) -> enum.Enum:
    """Add a member to a `str`-valued enum class in place and return it (idempotent).

    Args:
        enum_class: The enum, e.g. `PeftType`.
        name: Member name.
        value: Member value.
    """
    if name in enum_class.__members__:
        return enum_class[name]
    member = str.__new__(enum_class, value)
    member._name_ = name
    member._value_ = value
    member._sort_order_ = len(enum_class._member_names_)
    member.__objclass__ = enum_class
    enum_class._member_map_[name] = member
    enum_class._value2member_map_[value] = member
    enum_class._member_names_.append(name)
    type.__setattr__(enum_class, name, member)  # EnumType.__setattr__ refuses; members are class attributes
    return member


def peft_tested_range() -> str:
    """The PEFT versions this registration was tested on, as `setup.cfg` declares them (e.g. `>=0.21,<0.22`);
    empty when the package is not installed."""
    from ..utils.versions import declared_ranges

    return declared_ranges().get("peft", "")


def peft_version_is_tested() -> bool:
    """Whether the installed PEFT is inside the range this registration was tested on (True when unknown)."""
    return SpecifierSet(peft_tested_range()).contains(peft.__version__, prereleases=True)


def register_ituning_peft_type() -> None:
    """Make `ITuningAdapterConfig` a PEFT adapter type (idempotent; runs on `import itune_hf`)."""
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    from .config import ITuningAdapterConfig
    from .model import ITuningTuner

    peft_type = add_enum_member(PeftType, PEFT_TYPE_NAME, PEFT_TYPE_NAME)
    if PEFT_TYPE_TO_CONFIG_MAPPING.get(peft_type) is ITuningAdapterConfig:
        return
    register_peft_method(
        name=PEFT_METHOD_NAME, config_cls=ITuningAdapterConfig, model_cls=ITuningTuner, prefix=PEFT_PREFIX
    )
