"""The `--model` argument the captioning commands share (`itune_hf.commands._models`): a preset name is refused
alike by `caption`, `eval` and `explain` (and never looked up on the Hub); `itune serve` serves it, saying its weights
are random."""

from __future__ import annotations

import pytest

from itune_hf.cli import main

PRESET_REFUSAL = "--model itune-tiny-random: a preset (an untrained setup), not a trained captioner; train one with"


@pytest.mark.parametrize("command", ["caption", "eval", "explain"])
def test_a_preset_as_model_is_refused_alike_by_every_captioning_command(command, tmp_path, capsys, monkeypatch):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("a preset name must not be looked up on the Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    photo = str(tmp_path / "photo.png")
    args = {
        "caption": [photo],
        "eval": ["--data", str(tmp_path / "data.json")],
        "explain": [photo, "--output", str(tmp_path / "heat.png")],
    }[command]
    assert main([command, *args, "--model", "itune-tiny-random"]) == 2
    assert PRESET_REFUSAL in capsys.readouterr().err


@pytest.mark.parametrize(("preset", "serving"), [("itune-tiny-random", "1 adapter(s) on one base"),
                                                 ("xgpt-tiny-random", "XGPT")])  # fmt: skip
def test_serve_takes_a_preset_says_its_weights_are_random_and_names_what_it_serves(
    preset, serving, capsys, monkeypatch
):
    import itune_hf.app

    served = []
    monkeypatch.setattr(itune_hf.app, "serve", lambda service, **kwargs: served.append(service))
    assert main(["serve", "--model", preset]) == 0 and served
    captured = capsys.readouterr()
    assert f"--model {preset} is a preset (an untrained setup): its weights are random" in captured.err
    assert captured.out.startswith(f"itune serve: {serving}; open http://")


@pytest.mark.parametrize("width", [64, 4_000_000])
def test_a_config_that_disagrees_with_its_weights_is_one_line_before_anything_is_allocated(tmp_path, capsys, width):
    import json

    from itune_hf import build_model, build_processor
    from itune_hf.hub import save_captioner

    folder = tmp_path / "model"
    save_captioner(build_model("itune-tiny-random"), folder, processor=build_processor("itune-tiny-random"))
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["n_embd"] = width  # 32 in the weights
    (folder / "config.json").write_text(json.dumps(config))
    image = tmp_path / "red.png"
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 0, 0)).save(image)
    capsys.readouterr()  # what saving printed
    assert main(["caption", str(image), "--model", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.json does not describe" in err[0] and "restore the config" in err[0], err
