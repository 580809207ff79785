"""One source of the I-Tuning settings (ITuningSettings) and the registry of model families."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
import yaml

from itune_hf import ITuningAdapterConfig, ITuningConfig, ITuningSettings
from itune_hf.commands import train as train_command
from itune_hf.families.ituning.training import adapter_config
from itune_hf.models import ModelFamily, families, family_of, get_family, register_family
from itune_hf.training.config import TrainingConfig

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"bottleneck_dim": 10, "num_heads": 4}, "not divisible by num_heads=4"),
        ({"init": "xavier"}, "init must be one of"),
        ({"scale": 0.0}, "lambda"),
        ({"attention_scale": -1.0}, "attention_scale must be positive"),
        ({"dropout": 1.0}, "dropout must be in"),
        ({"first_layer": -1}, "first_layer must be >= 0"),
        ({"visual_tokens": "center"}, "visual_tokens must be one of"),
    ],
)
def test_every_entry_point_checks_the_settings_alike(values, message):
    for build in (
        ITuningSettings,
        ITuningAdapterConfig,
        lambda **v: ITuningConfig(**v, add_ituning_modules=False),
        lambda **v: TrainingConfig(output_dir="unused", **v),
    ):
        with pytest.raises(ValueError, match=message):
            build(**values)


def test_settings_resolve_against_the_lm():
    settings = ITuningSettings(num_heads=4, first_layer=2)
    assert settings.resolved_bottleneck_dim(768) == 384 and settings.layers(4) == [2, 3]
    with pytest.raises(ValueError, match="leaves no layer"):
        settings.layers(2)
    with pytest.raises(ValueError, match="set bottleneck_dim explicitly"):
        ITuningSettings(num_heads=5).resolved_bottleneck_dim(768)  # 384 % 5
    assert settings.module_kwargs(768, 512)["bottleneck_dim"] == 384


def test_config_and_adapter_config_share_the_settings():
    names = ITuningSettings.names()
    assert names == (
        "bottleneck_dim", "num_heads", "scale", "attention_scale", "first_layer", "init", "dropout", "visual_tokens",
        "final_norm",
    )  # fmt: skip
    adapter = {f.name: f.default for f in dataclasses.fields(ITuningAdapterConfig)}
    config = ITuningConfig(add_ituning_modules=False)
    for field in dataclasses.fields(ITuningSettings):
        assert adapter[field.name] == field.default and getattr(config, field.name) == field.default


def test_configs_saved_with_the_former_names_still_load():
    legacy = ITuningConfig().to_dict()
    for name in ("num_heads", "first_layer", "init"):
        legacy.pop(name)
    legacy.update(ituning_num_heads=2, ituning_first_layer=3, ituning_init="random")
    config = ITuningConfig.from_dict(legacy)
    assert (config.num_heads, config.first_layer, config.init) == (2, 3, "random")
    assert config.ituning_first_layer == 3  # the former attribute names read the new ones
    assert "ituning_first_layer" not in config.to_dict()


def _train_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    return parser.parse_args(argv)


def test_every_setting_is_an_itune_train_option_that_reaches_the_adapter(tmp_path):
    argv = ["--output-dir", str(tmp_path), "--preset", "itune-tiny-random"]
    argv += ["--attention-scale", "1.0", "--dropout", "0.1", "--num-heads", "2", "--init", "random", "--scale", "2"]
    config = train_command.config_from_args(_train_args(argv))
    for name in ITuningSettings.names():
        assert f"--{name.replace('_', '-')}" in train_command_help()
        assert getattr(config, name, "missing") != "missing"
    base = ITuningConfig.from_dict({**ITuningConfig().to_dict(), "first_layer": 5, "add_ituning_modules": False})
    adapter = adapter_config(config, base)
    assert (adapter.attention_scale, adapter.dropout, adapter.num_heads, adapter.init, adapter.scale) == (
        1.0,
        0.1,
        2,
        "random",
        2.0,
    )
    assert adapter.first_layer == 5  # not overridden: the base's (its preset's) setting is kept


def train_command_help() -> str:
    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    return parser.format_help()


def test_the_paper_form_recipe_sets_the_papers_equations(tmp_path):
    recipe = REPO / "examples" / "recipes" / "coco-base-paper-form.yaml"
    config = train_command.config_from_args(_train_args(["--config", str(recipe), "--output-dir", str(tmp_path)]))
    assert (config.init, config.attention_scale) == ("random", 1.0)
    ours = yaml.safe_load((REPO / "examples" / "recipes" / "coco-base.yaml").read_text())
    paper = yaml.safe_load(recipe.read_text())
    assert {k: v for k, v in paper.items() if ours.get(k) != v} == {
        "output_dir": "outputs/coco-base-paper-form",
        "init": "random",
        "attention_scale": 1.0,
    }


def test_the_ituning_family_is_registered_and_its_parts_import():
    family = get_family("ituning")
    assert families()["ituning"] is family and family.saves == "adapter"
    for part in ("config_class", "model_class", "processor_class", "settings_class", "build_for_training"):
        assert family.load(part) is not None
    assert family.load("config_class") is ITuningConfig
    assert family_of(ITuningConfig(add_ituning_modules=False)) is family


def test_the_registry_refuses_unknown_and_clashing_families():
    with pytest.raises(KeyError, match="Unknown model family 'nope'; known families: .*ituning"):
        get_family("nope")
    clash = dataclasses.replace(get_family("ituning"), name="other")  # same model_type
    with pytest.raises(ValueError, match="is registered"):
        register_family(clash)
    with pytest.raises(ValueError, match="not a captioning model of a registered family"):
        family_of(argparse.Namespace(config=argparse.Namespace(model_type="bert")))
    with pytest.raises(ValueError, match="saves adapters: name its save_adapter"):
        ModelFamily("x", "x", "", "a:b", "a:b", "a:b", None, "a:b", saves="adapter", card="a:b")
    with pytest.raises(ValueError, match="'x': name its card, an itune_hf.hub.cards.FamilyCard"):
        ModelFamily("x", "x", "", "a:b", "a:b", "a:b", None, "a:b", saves="full")


def test_a_misspelt_preset_override_is_refused_with_a_suggestion():
    from itune_hf import build_model

    with pytest.raises(TypeError, match="ituning_frist_layer: not a setting of ITuningConfig .*did you mean"):
        build_model("itune-tiny-random", ituning_frist_layer=2)
    with pytest.raises(TypeError, match="architecure: .*did you mean architecture"):
        build_model("xgpt-tiny-random", architecure="enc")
    assert build_model("itune-tiny-random", first_layer=2).config.ituning_layers == [2]
