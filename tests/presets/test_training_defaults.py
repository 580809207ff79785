"""Presets and model families carry the optimisation settings that suit them: the command line or a recipe wins, then
the preset's `"training"` entry, then the family's `training_defaults`, then the built-in table."""

from __future__ import annotations

import pytest

from itune_hf.models import families, get_family
from itune_hf.presets import get_preset, list_presets
from itune_hf.training import TrainingConfig
from itune_hf.training.config import TRAINING_DEFAULTS, describe_training_defaults, training_defaults


def test_the_preset_then_the_family_then_the_table_choose_what_the_run_did_not_set():
    demo = TrainingConfig(output_dir="out", preset="xgpt-demo")
    preset, family = get_preset("xgpt-demo").training, get_family("xgpt").training_defaults
    assert preset and family and not set(preset) & set(family)
    for name in TRAINING_DEFAULTS:
        expected = preset.get(name, family.get(name, TRAINING_DEFAULTS[name]))
        assert getattr(demo, name) == expected, name
    assert demo.defaults_from["learning_rate"] == "preset xgpt-demo"
    assert demo.defaults_from["adam_beta2"] == "family xgpt"
    plain = TrainingConfig(output_dir="out", preset="itune-tiny-random")
    assert {name: getattr(plain, name) for name in TRAINING_DEFAULTS} == TRAINING_DEFAULTS
    assert set(plain.defaults_from.values()) == {"built-in"}


def test_a_value_given_wins_and_is_reported_as_given():
    config = TrainingConfig(output_dir="out", preset="xgpt-demo", learning_rate="3e-4", adam_beta2=0.95)
    assert config.learning_rate == 3e-4 and config.adam_beta2 == 0.95
    line = describe_training_defaults(config)
    assert "learning_rate 0.0003 (given)" in line and "adam_beta2 0.95 (given)" in line
    assert "warmup_steps 10 (preset xgpt-demo)" in line


def test_a_run_without_a_preset_takes_its_familys_defaults():
    config = TrainingConfig(output_dir="out", preset=None, vision_model="v", text_model="t", family="xgpt")
    assert config.weight_decay == get_family("xgpt").training_defaults["weight_decay"]
    assert TrainingConfig(output_dir="out", preset=None, vision_model="v", text_model="t").weight_decay == 0.01


@pytest.mark.parametrize("name", list_presets())
def test_every_presets_training_defaults_are_training_settings_of_the_right_type(name):
    chosen = training_defaults(name)
    assert set(chosen) == set(TRAINING_DEFAULTS)
    for key, (value, _) in chosen.items():
        assert TrainingConfig.coerce(key, value) == value, (name, key)


def test_a_family_naming_a_setting_that_is_not_a_training_default_is_refused(monkeypatch):
    import dataclasses

    from itune_hf.models import registry

    broken = dataclasses.replace(families()["ituning"], training_defaults={"num_epochs": 3})
    monkeypatch.setitem(registry._FAMILIES, "ituning", broken)
    with pytest.raises(ValueError, match="family ituning: training default 'num_epochs'"):
        TrainingConfig(output_dir="out", preset="itune-tiny-random")


def test_the_help_says_where_the_default_comes_from():
    assert "Default: the preset's, else its family's, else 0.0001." in TrainingConfig.help("learning_rate")
