"""`itune train --load-in 8bit|4bit` as a user runs it: the run trains on a quantised frozen LM, saves an adapter-only
checkpoint that records how the LM was loaded, and `itune caption` loads it the same way (or as told)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from itune_hf import build_model
from itune_hf.cli import main
from itune_hf.data import make_synthetic
from itune_hf.models.loading import load_captioner


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("load-in-world")
    make_synthetic(root / "data", num_images=16, seed=5, image_size=32)
    return root / "data"


def train_args(world, output_dir, *extra) -> list[str]:
    return [
        "train", "--data", str(world / "dataset.json"), "--preset", "itune-tiny-random", "--batch-size", "4",
        "--learning-rate", "1e-2", "--max-steps", "2", "--save-every", "2", "--eval-split", "none",
        "--report-to", "none", "--output-dir", str(output_dir), *extra,
    ]  # fmt: skip


def quantised_layers(model) -> int:
    bnb = pytest.importorskip("bitsandbytes")  # the `quant` extra, which `make test` installs
    return sum(isinstance(m, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)) for m in model.language_model.modules())


@pytest.mark.slow  # trains and captions twice (about 15 s on 2 idle cores)
@pytest.mark.parametrize("load_in, precision", [("8bit", "no"), ("4bit", "no"), ("8bit", "bf16")])
def test_train_with_load_in_then_caption_loads_the_lm_as_the_run_did(world, tmp_path, capsys, load_in, precision):
    """Under bf16 autocast (the default where a CPU computes bf16 natively) bitsandbytes turns the quantised layers'
    biases to bf16 in place; the saved LM still holds them in its own dtype."""
    pytest.importorskip("bitsandbytes")
    run = tmp_path / "run"
    options = ("--load-in", load_in, "--mixed-precision", precision)
    assert main(train_args(world, run, *options)) == 0, capsys.readouterr().err
    assert f"frozen LM in {load_in}" in capsys.readouterr().out  # the run says what it trained on

    record = json.loads((run / "frozen_lm.json").read_text())
    assert record["load_in"] == load_in and record["layers"] == 12  # 3 GPT-2 blocks x 4 Conv1D
    assert json.loads((run / "training_config.json").read_text())["load_in"] == load_in
    with safe_open(str(run / "adapter_model.safetensors"), "pt") as adapter:  # adapter-only
        assert all(".ituning_modules." in key for key in adapter.keys())
    assert not (run / "backbones").exists()  # the preset's name rebuilds its seeded random backbones

    assert quantised_layers(load_captioner(run)[0]) == 12  # as recorded
    whole = load_captioner(run, load_in=None)[0]
    assert quantised_layers(whole) == 0  # full precision when asked: the preset's LM, as its class builds it
    reference = build_model("itune-tiny-random", pretrained=True).language_model.state_dict()
    assert all(torch.equal(tensor, reference[key]) for key, tensor in whole.language_model.state_dict().items())

    image = str(world / "images" / "000000.png")
    for extra in ([], ["--load-in", "none"]):
        assert main(["caption", image, "--model", str(run), "--max-new-tokens", "3", *extra]) == 0
        assert capsys.readouterr().out.startswith(image + "\t")


def test_load_in_is_refused_for_xgpt_and_for_an_unknown_width(world, tmp_path, capsys):
    assert main(train_args(world, tmp_path / "x", "--preset", "xgpt-tiny-random", "--load-in", "4bit")) == 2
    error = capsys.readouterr().err
    assert "--load-in 4bit: XGPT runs do not quantise a language model (only I-Tuning runs do)" in error
    assert "drop --load-in" in error
    assert main(train_args(world, tmp_path / "y", "--load-in", "3bit")) == 2
    assert "error: load_in must be one of 8bit, 4bit (or none), got '3bit'" in capsys.readouterr().err


def test_resume_refuses_a_run_loaded_another_way(tmp_path):
    from itune_hf.training import TrainingConfig
    from itune_hf.training.checkpoints import _check_resume_settings

    config = TrainingConfig(output_dir=str(tmp_path), preset="itune-tiny-random", load_in="8bit", resume=True)
    with pytest.raises(ValueError, match=r"--resume with settings that differ .*load_in: None -> '8bit'"):
        _check_resume_settings(config, {"preset": "itune-tiny-random"})  # the saved run: full precision


def test_bitsandbytes_hint_about_its_optional_hub_kernel_is_not_printed(tmp_path, caplog):
    """bitsandbytes, which PEFT imports whenever it is installed, warns on CPUs with AVX512-BF16 that an optional Hub
    kernel is missing (it then uses its own): a model command keeps that line off stderr, and nothing else."""
    import logging

    assert main(["caption", str(tmp_path / "none.png"), "--model", str(tmp_path / "no-model")]) == 2
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING):
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s.", "No module named 'kernels'")
        logger.warning("another warning")
    assert [record.getMessage() for record in caplog.records] == ["another warning"]


def test_caption_refuses_load_in_for_a_captioner_that_keeps_its_language_model_as_saved(tmp_path, capsys):
    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_model, build_processor

    from conftest import write_photo

    for preset in ("xgpt-tiny-random", "clipcap-mlp-tiny-random"):
        directory = tmp_path / preset
        save_captioner(build_model(preset), directory, processor=build_processor(preset))
        photo = str(write_photo(tmp_path / "p.png"))
        assert main(["caption", photo, "--model", str(directory), "--load-in", "8bit"]) == 2
        error = capsys.readouterr().err
        assert "which loads its language model as saved (only I-Tuning captioners quantise theirs)" in error, error
