"""`itune pretrain-vision` / `pretrain_vision_tower`: the small vision tower learns the synthetic world's attributes,
is cached under a fingerprint (reused as is, pre-trained again when a setting changes or a file is damaged), and
replaces a preset's random tower in `build_model` (and so in `itune train --vision-model` and `itune demo`)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from itune_hf.cli import main
from itune_hf.presets import build_model, get_preset
from itune_hf.vision import pretraining as vision_pretraining
from itune_hf.vision.pretraining import VisionPretrainingSettings, pretrain_vision_tower

PRESET = "itune-tiny-random"  # a 32x32 CLIP-style tower of width 32
TINY = dict(steps=60, batch_size=32, learning_rate=3e-3, num_images=384, eval_images=128, image_size=32)
FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]


@pytest.fixture(scope="module")
def tower_dir(tmp_path_factory):
    """A tiny tower pre-trained once through the CLI, as a user runs it; with what the command printed."""
    directory = tmp_path_factory.mktemp("vision") / "tower-cache"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["pretrain-vision", "--preset", PRESET, "--output-dir", str(directory), *FLAGS]) == 0
    return directory, out.getvalue()


def test_the_pretrained_tower_learned_the_worlds_attributes(tower_dir):
    directory, printed = tower_dir
    report = json.loads((directory / "report.json").read_text())
    heads = report["heads"]
    # held-out images: global attributes from the pooled output, per-patch ones from the patch tokens
    for name, margin in (("background", 0.4), ("patch_color", 0.4), ("color_0", 0.2)):
        assert heads[name]["accuracy"] >= heads[name]["chance"] + margin, (name, heads[name])
    assert report["mean_accuracy"] >= report["mean_chance"] + 0.08, report
    assert "pre-trained in" in printed and f"accuracy {report['mean_accuracy']:.3f}" in printed
    # the tower itself changed (not only the heads, which are dropped)
    random_tower = get_preset(PRESET).vision.load(pretrained=False, vision=True).state_dict()
    trained = load_file(str(directory / "tower" / "model.safetensors"))
    changed = [k for k in trained if not torch.equal(trained[k], random_tower[k])]
    assert len(changed) >= len(trained) // 2


QUICK = {**TINY, "steps": 2}


@pytest.fixture(scope="module")
def quick_dir(tmp_path_factory):
    """A tower pre-trained for 2 steps: what the cache tests damage (pre-training it again is quick)."""
    directory = tmp_path_factory.mktemp("quick") / "tower-cache"
    pretrain_vision_tower(PRESET, directory, VisionPretrainingSettings(**QUICK))
    return directory


def _copy(directory, tmp_path):
    shutil.copytree(directory, tmp_path / "copy")
    return tmp_path / "copy"


def _no_training(*args, **kwargs):
    raise AssertionError("an intact tower with the same fingerprint must be reused, not trained again")


def test_same_fingerprint_reuses_the_tower_without_training(tower_dir, monkeypatch, capsys):
    monkeypatch.setattr(vision_pretraining, "train_tower", _no_training)
    tower = pretrain_vision_tower(PRESET, tower_dir[0], VisionPretrainingSettings(**TINY))
    assert tower.reused and tower.report["steps"] == TINY["steps"]
    assert main(["pretrain-vision", "--preset", PRESET, "--output-dir", str(tower_dir[0]), *FLAGS]) == 0
    assert "reused (same fingerprint)" in capsys.readouterr().out
    loaded = tower.load()
    assert not any(p.requires_grad for p in loaded.parameters())


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (dict(seed=1), "settings.seed changed"),
        (dict(world_seed=7), "settings.world_seed changed"),
    ],
)
def test_a_changed_setting_pretrains_again(quick_dir, tmp_path, capsys, change, reason):
    directory = _copy(quick_dir, tmp_path)
    before = (directory / "tower" / "model.safetensors").read_bytes()
    tower = pretrain_vision_tower(PRESET, directory, VisionPretrainingSettings(**{**QUICK, **change}))
    assert not tower.reused and reason in capsys.readouterr().err
    assert (directory / "tower" / "model.safetensors").read_bytes() != before
    assert pretrain_vision_tower(PRESET, directory, VisionPretrainingSettings(**{**QUICK, **change})).reused


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (
            lambda d: (d / "tower" / "model.safetensors").write_bytes(b"not weights"),
            "tower/model.safetensors is damaged",
        ),
        (lambda d: (d / "tower" / "config.json").unlink(), "tower/config.json is missing"),
        (lambda d: (d / "fingerprint.json").write_text("{"), "fingerprint.json is damaged"),
        (lambda d: (d / "fingerprint.json").unlink(), "no fingerprint.json"),
    ],
)
def test_a_damaged_cache_is_pretrained_again_with_a_message(quick_dir, tmp_path, capsys, damage, reason):
    directory = _copy(quick_dir, tmp_path)
    damage(directory)
    settings = VisionPretrainingSettings(**QUICK)
    tower = pretrain_vision_tower(PRESET, directory, settings)
    assert not tower.reused
    assert reason in capsys.readouterr().err
    assert (directory / "tower" / "model.safetensors").is_file()
    assert pretrain_vision_tower(PRESET, directory, settings).reused  # healed


def test_build_model_takes_the_pretrained_weights_for_the_presets_tower(tower_dir):
    weights = load_file(str(tower_dir[0] / "tower" / "model.safetensors"))
    model = build_model(PRESET, vision_model=str(tower_dir[0] / "tower"), add_ituning_modules=False)
    assert all(torch.equal(model.vision_model.state_dict()[k], v) for k, v in weights.items())
    assert model.config.vision_config._name_or_path == ""  # a directory: saved adapters carry a copy
    assert not any(p.requires_grad for p in model.vision_model.parameters())
    with pytest.raises(ValueError, match="not the architecture of preset 'itune-demo'"):
        build_model("itune-demo", vision_model=str(tower_dir[0] / "tower"))


def test_a_tower_reference_is_pretrained_once_into_the_shared_cache_and_then_reused(tmp_path, monkeypatch, capsys):
    """`itune:pretrain-vision/<preset>` (xgpt-demo-resnet's tower) resolves, wherever backbones are loaded, to that
    preset's tower pre-trained with the default settings in $ITUNE_CACHE: trained on the first load, reused after."""
    import functools

    import itune_hf  # noqa: F401  (plugs the package's resolvers in)
    from itune_hf.models._shared.backbones import load_vision_tower, resolve_reference

    monkeypatch.setenv("ITUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        vision_pretraining, "VisionPretrainingSettings", functools.partial(VisionPretrainingSettings, **QUICK)
    )  # the defaults, made quick
    reference = vision_pretraining.TOWER_REFERENCE + PRESET
    location = resolve_reference(reference)
    expected = vision_pretraining.default_tower_dir(PRESET, VisionPretrainingSettings(**QUICK)) / "tower"
    assert location == str(expected) and str(tmp_path / "cache" / "vision-towers") in location
    assert f"{reference}: pre-training {PRESET}'s vision tower (2 steps, once" in capsys.readouterr().err
    monkeypatch.setattr(vision_pretraining, "train_tower", _no_training)
    assert resolve_reference(reference) == location and capsys.readouterr().err == ""
    assert load_vision_tower(location).config.hidden_size == 32
    assert resolve_reference("some/hub-id") == "some/hub-id"


def test_pretraining_the_tower_of_a_preset_with_an_lm_loads_nothing_of_the_lm(tmp_path, monkeypatch):
    from itune_hf import presets

    def no_processor(name):
        raise AssertionError(f"{name}: the tower's pre-training built the whole processor (SmolLM2's tokenizer)")

    monkeypatch.setattr(presets, "build_processor", no_processor)
    tower = pretrain_vision_tower("itune-demo-resnet", tmp_path / "tower-cache", VisionPretrainingSettings(**QUICK))
    assert (tower.tower_dir / "preprocessor_config.json").is_file()


def test_xgpt_demo_resnets_tower_is_the_demo_resnet_pretrained_by_the_package():
    tower, resnet = get_preset("xgpt-demo-resnet").vision, get_preset("itune-demo-resnet").vision
    assert tower.hub_id == vision_pretraining.TOWER_REFERENCE + "itune-demo-resnet"
    assert (tower.config, tower.image_processor, tower.init_seed) == (
        resnet.config, resnet.image_processor, resnet.init_seed
    )  # fmt: skip
    model = build_model("xgpt-demo-resnet")  # not pretrained: the random tower, nothing pre-trained
    assert model.config.reads_feature_map and model.config.region_feature_size == 128
    with pytest.raises(ValueError, match=r"already has pretrained weights \(itune:pretrain-vision/itune-demo-resnet\)"):
        vision_pretraining.vision_backbone("xgpt-demo-resnet")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "no-such-preset"], "--preset no-such-preset: Unknown preset"),
        (["--image-size", "8"], "--image-size: must be at least 24 pixels"),
        (["--preset", "itune-gpt2-base"], "already has pretrained weights (openai/clip-vit-base-patch16)"),
    ],
)
def test_bad_input_gets_one_clear_error(tmp_path, capsys, argv, message):
    assert main(["pretrain-vision", "--output-dir", str(tmp_path / "t"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_output_dir_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["pretrain-vision", "--preset", PRESET, "--output-dir", str(tmp_path / "file")]) == 2
    assert f"{tmp_path / 'file'}: not a directory" in capsys.readouterr().err


def test_other_families_refuse_a_vision_model_with_their_preset(tower_dir):
    from itune_hf.training import build_training_model
    from itune_hf.training.config import TrainingConfig

    config = TrainingConfig(
        output_dir="unused", data="unused", preset="xgpt-tiny-random", vision_model=str(tower_dir[0] / "tower")
    )
    with pytest.raises(ValueError, match="only I-Tuning presets take other weights for their vision tower"):
        build_training_model(config)


def test_a_directory_it_did_not_write_is_refused_and_overwrite_names_what_it_removes(tmp_path, capsys):
    # a user's folder is never taken for an unfinished pre-training (and its tower/ deleted)
    directory = tmp_path / "d"
    (directory / "tower").mkdir(parents=True)
    (directory / "tower" / "mine.txt").write_text("my notes")
    argv = ["pretrain-vision", "--preset", PRESET, "--output-dir", str(directory), *FLAGS, "--steps", "1"]
    assert main(argv) == 2
    assert "holds files itune pretrain-vision did not write (tower)" in capsys.readouterr().err
    assert (directory / "tower" / "mine.txt").read_text() == "my notes"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*argv, "--overwrite"]) == 0
    assert "--overwrite: removing 1 entries" in capsys.readouterr().err
    assert not (directory / "tower" / "mine.txt").exists() and (directory / "fingerprint.json").is_file()


def test_an_infinite_learning_rate_is_refused_and_a_diverging_tower_is_never_saved(tmp_path, capsys, monkeypatch):
    # --learning-rate inf would train and fingerprint an all-NaN tower
    argv = ["pretrain-vision", "--preset", PRESET, "--output-dir", str(tmp_path / "t"), *FLAGS, "--steps", "1"]
    with pytest.raises(SystemExit):
        main([*argv, "--learning-rate", "inf"])
    assert "argument --learning-rate: expected a number > 0, got 'inf'" in capsys.readouterr().err
    monkeypatch.setattr(vision_pretraining, "_loss", lambda logits, labels: torch.tensor(float("nan")))
    assert main(argv) == 2
    assert "vision pre-training step 1: the loss is nan (the tower diverged)" in capsys.readouterr().err
    assert not (tmp_path / "t" / "fingerprint.json").exists() and not (tmp_path / "t" / "tower").exists()


def test_a_patch_is_labelled_with_the_shape_covering_an_eighth_of_it_at_least():
    import numpy as np

    shapes = np.zeros((16, 16), dtype=np.int64)  # a 2x2 grid of 8x8 patches
    shapes[0:8, 0:8] = 2  # patch 0: all shape 2
    shapes[0, 8:15] = 1  # patch 1: 7 of 64 pixels, under an eighth: no object
    shapes[8:10, 0:5] = 1  # patch 2: 10 pixels of shape 1 ...
    shapes[10:14, 0:5] = 3  # ... and 20 of shape 3: shape 3
    assert vision_pretraining._patch_shapes(shapes, 2).tolist() == [2, 0, 3, 0]


def test_a_convolutional_tower_pretrains_on_its_feature_grid(tmp_path):
    settings = VisionPretrainingSettings(**{**QUICK, "batch_size": 8, "num_images": 16, "eval_images": 16})
    tower = pretrain_vision_tower("itune-demo-resnet", tmp_path / "resnet", settings)
    assert tower.load().config.model_type == "resnet"
    assert set(tower.report["heads"]) == set(vision_pretraining._heads())
    # the shape head is scored on object patches only: its chance is a shape's share, not the background's
    assert tower.report["heads"]["patch_shape"]["chance"] < 0.8
