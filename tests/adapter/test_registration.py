"""Checks every assumption `itune_hf/adapter/registration.py` makes about PEFT and Python's enum.

If one of these fails after a PEFT upgrade, the message names the broken assumption: fix registration.py (or, if
PEFT has opened its adapter-type registry, switch to the public route) and widen the peft range in setup.cfg.
"""

from __future__ import annotations

import inspect
import json
import pickle

import peft
import pytest
from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_PREFIX_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING
from peft.tuners.tuners_utils import BaseTuner
from peft.utils import PeftType, register_peft_method

import itune_hf  # noqa: F401  (registers the adapter type)
from itune_hf.adapter import ITuningAdapterConfig, ITuningTuner
from itune_hf.adapter.registration import add_enum_member, peft_tested_range, peft_version_is_tested


def test_installed_peft_is_the_tested_range():
    assert peft_tested_range(), "setup.cfg declares no peft range (or itune-hf is not installed)"
    assert peft_version_is_tested(), (
        f"peft {peft.__version__} is outside the range the registration was tested on (peft{peft_tested_range()}): "
        "run this file, then widen the peft range in setup.cfg"
    )


def test_peft_still_has_a_closed_enum_so_the_extension_is_needed():
    with pytest.raises(ValueError, match="Unknown PEFT type"):
        register_peft_method(name="itune_probe_not_a_member", config_cls=ITuningAdapterConfig, model_cls=ITuningTuner)


def test_the_new_member_behaves_like_a_native_one():
    member = PeftType.ITUNING
    assert PeftType("ITUNING") is member and PeftType["ITUNING"] is member
    assert member in list(PeftType) and "ITUNING" in PeftType.__members__
    assert member == "ITUNING" and isinstance(member, str) and member.value == "ITUNING"
    assert pickle.loads(pickle.dumps(member)) is member
    assert json.loads(json.dumps({"peft_type": member})) == {"peft_type": "ITUNING"}


def test_add_enum_member_is_idempotent_and_generic():
    import enum

    class Kind(str, enum.Enum):
        A = "A"

    added = add_enum_member(Kind, "B", "B")
    assert add_enum_member(Kind, "B", "B") is added
    assert Kind("B") is added and list(Kind) == [Kind.A, added] and len(Kind) == 2


def test_peft_maps_the_type_to_our_classes():
    assert PEFT_TYPE_TO_CONFIG_MAPPING[PeftType.ITUNING] is ITuningAdapterConfig
    assert PEFT_TYPE_TO_TUNER_MAPPING[PeftType.ITUNING] is ITuningTuner
    assert PEFT_TYPE_TO_PREFIX_MAPPING[PeftType.ITUNING] == "ituning_"
    config = peft.PeftConfig.from_peft_type(peft_type="ITUNING", first_layer=2)
    assert isinstance(config, ITuningAdapterConfig) and config.first_layer == 2


@pytest.mark.parametrize(
    "hook",
    [
        "_pre_injection_hook",
        "_prepare_adapter_config",
        "_create_and_replace",
        "_check_merge_allowed",
        "_remove_adapter_name_from_key",
        "_remap_adapter_state_dict_for_load",
        "_mark_only_adapters_as_trainable",
    ],
)
def test_the_base_tuner_hooks_we_override_still_exist(hook):
    assert hasattr(BaseTuner, hook), f"PEFT's BaseTuner no longer has {hook}; ITuningTuner overrides it"
    ours, theirs = inspect.signature(getattr(ITuningTuner, hook)), inspect.signature(getattr(BaseTuner, hook))
    required = [
        p.name for p in theirs.parameters.values() if p.default is p.empty and p.kind == p.POSITIONAL_OR_KEYWORD
    ]
    assert [p for p in required if p not in ours.parameters] == [], f"{hook}: PEFT now passes {required}"
