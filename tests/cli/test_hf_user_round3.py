"""What Hugging Face users hit, round 3 (issue 32): `save_to_disk` datasets, subset scoring, the caller's
`max_length` in every family, batch-independent captions, and the frictions that came with them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from itune_hf.cli import main
from itune_hf.data import load_captions, make_synthetic

from conftest import train_tiny_adapter


@pytest.fixture(scope="module")
def saved_dataset(tmp_path_factory):
    """A synthetic world as users hold it: a `DatasetDict` saved with `save_to_disk`, images embedded (`image` +
    `text`: a list of captions in train, one string per image in test), the source files deleted."""
    from datasets import Dataset, DatasetDict, Image

    root = tmp_path_factory.mktemp("saved")
    world = load_captions(str(make_synthetic(root / "world", num_images=20, seed=3, image_size=32)))
    parts = {}
    for split, single in (("train", False), ("test", True)):
        rows = world[split]
        text = [captions[0] for captions in rows["captions"]] if single else rows["captions"]
        table = Dataset.from_dict({"image": rows["image_path"], "text": text})
        parts[split] = table.cast_column("image", Image())
    DatasetDict(parts).save_to_disk(root / "disk")
    for path in [*world["train"]["image_path"], *world["test"]["image_path"]]:
        Path(path).unlink()  # the images live only in the saved dataset
    return root / "disk"


# ---------------------------------------------------------------------- item 1: a save_to_disk dataset with its images
def test_a_saved_dataset_with_embedded_images_trains_evaluates_and_caches(saved_dataset, tmp_path, capsys):
    trained = train_tiny_adapter(saved_dataset, tmp_path / "run", steps=2)
    assert "skipping unreadable" not in capsys.readouterr().err
    summary = json.loads((trained / "train_summary.json").read_text())
    assert summary["history"] and all(h["loss"] == h["loss"] for h in summary["history"] if "loss" in h)
    common = ["--data", str(saved_dataset), "--split", "test"]
    out = tmp_path / "eval"
    code = main(["eval", "--model", str(trained), *common, "--max-new-tokens", "3", "--metrics", "BLEU",
                 "--output-dir", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    captions = [json.loads(line) for line in (out / "captions.jsonl").read_text().splitlines()]
    assert len(captions) == 2 and "skipped" not in err
    # no --num-beams: the model's generation config decodes (I-Tuning's 5 beams), as `generate` does by default
    from itune_hf.data.verify import open_example_image
    from itune_hf.models.loading import load_captioner

    model, processor = load_captioner(str(trained))
    rows = load_captions(str(saved_dataset), split="test")
    images = [open_example_image(row) for row in rows]
    expected = processor.batch_decode(model.generate(**processor(images=images), max_new_tokens=3))
    assert [row["caption"] for row in captions] == expected
    assert json.loads((out / "metrics.json").read_text())["num_beams"] == model.generation_config.num_beams == 5
    cache = tmp_path / "cache"
    code = main(["cache-features", "--preset", "itune-tiny-random", *common, "--output-dir", str(cache)])
    assert code == 0, capsys.readouterr().err
    assert json.loads((cache / "failed.json").read_text()) == {}
    from itune_hf.vision.feature_cache import FeatureCache

    rows = load_captions(str(saved_dataset), split="test")
    features = FeatureCache(cache)
    assert sorted(features.image_ids()) == sorted(rows["image_id"]) and not features.mismatched(rows)


# ------------------------------------------------------------------------------------ item 7: a preset name as --model
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


# ------------------------------------------------------------- frictions: explain decodes as the model's config
def test_itune_explain_decodes_as_the_models_generation_config_unless_told(captioner_dirs, tmp_path, capsys):
    from itune_hf.models.loading import load_captioner

    from conftest import write_photo

    photo = write_photo(tmp_path / "photo.png")
    model, processor = load_captioner(str(captioner_dirs["full"]))
    command = ["explain", str(photo), "--model", str(captioner_dirs["full"]), "--output", str(tmp_path / "h.png")]
    for beams in (None, 1):
        assert main([*command, "--max-new-tokens", "4", *(["--num-beams", str(beams)] if beams else [])]) == 0
        printed = capsys.readouterr().out.strip().split("\t")[1]
        ids = model.generate(
            **processor(images=[str(photo)]), max_new_tokens=4, **({"num_beams": beams} if beams else {})
        )
        assert printed == processor.batch_decode(ids)[0].strip(), beams


# ------------------------------------------------------- frictions: the column options the hint names exist
def test_image_and_caption_column_options_read_a_dataset_with_other_names(saved_dataset, tmp_path, capsys):
    import datasets

    from itune_hf.training import TrainingConfig
    from itune_hf.training.data import load_splits

    renamed = tmp_path / "renamed"
    loaded = datasets.load_from_disk(str(saved_dataset))
    loaded.rename_columns({"image": "picture", "text": "alt"}).save_to_disk(str(renamed))
    cache = ["cache-features", "--preset", "itune-tiny-random", "--data", str(renamed), "--split", "test"]
    assert main([*cache, "--output-dir", str(tmp_path / "c1")]) == 2
    assert "cannot tell which column holds the image" in capsys.readouterr().err  # the hint names the CLI option:
    assert main([*cache, "--output-dir", str(tmp_path / "c1"), "--image-column", "picture"]) == 2
    assert "(pass --caption-column NAME, or caption_column= to load_captions)" in capsys.readouterr().err
    columns = ["--image-column", "picture", "--caption-column", "alt"]
    assert main([*cache, "--output-dir", str(tmp_path / "c2"), *columns]) == 0
    assert json.loads((tmp_path / "c2" / "failed.json").read_text()) == {}
    config = TrainingConfig(output_dir=str(tmp_path / "run"), data=str(renamed), preset="itune-tiny-random",
                            image_column="picture", caption_column="alt", eval_split="none")  # fmt: skip
    train, _ = load_splits(config)
    assert len(train) == 16 and train[0]["captions"]
    world = make_synthetic(tmp_path / "world", num_images=4, seed=1, image_size=24)
    assert main(["cache-features", "--preset", "itune-tiny-random", "--data", str(world), *columns,
                 "--output-dir", str(tmp_path / "c3")]) == 2  # fmt: skip
    assert "--image-column picture, --caption-column alt: name columns of a Hugging Face dataset" in (
        capsys.readouterr().err
    )


# ------------------------------------------------------------------ frictions: messages give the right reason
def test_explain_refuses_a_family_it_does_not_draw_without_a_wrong_reason():
    from itune_hf.explain import attention_source
    from itune_hf.presets import build_model

    for preset in ("crossattn-tiny-random", "clipcap-mlp-tiny-random"):
        with pytest.raises(ValueError, match="needs an I-Tuning or XGPT captioner") as error:
            attention_source(build_model(preset))
        assert "no attention over the image" not in str(error.value)  # cross-attention attends over the image
        assert "does not draw the " in str(error.value)


# ----------------------------------------------------------- frictions: an adapter save is quiet, offline or not
def test_saving_an_adapter_gives_no_peft_hub_lookup_warnings(tmp_path):
    import warnings

    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig
    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_model, build_processor

    base = build_model("itune-tiny-random", add_ituning_modules=False)
    adapted = get_peft_model(base, ITuningAdapterConfig(first_layer=1))  # its base: a preset name, not a Hub repo
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_captioner(adapted, tmp_path / "adapter", processor=build_processor("itune-tiny-random"))
    assert not [str(w.message) for w in caught if "config file" in str(w.message) or "remote file" in str(w.message)]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()


# -------------------------------------------- frictions: I-Tuning's attentions come back without sdpa's warning
def test_ituning_generate_with_output_attentions_warns_nothing_and_returns_the_modules_attention(monkeypatch):
    import transformers.integrations.sdpa_attention as sdpa

    from itune_hf.presets import build_model, build_processor

    warned = []
    monkeypatch.setattr(sdpa.logger, "warning_once", lambda *args, **kwargs: warned.append(args))
    model, processor = build_model("itune-tiny-random").eval(), build_processor("itune-tiny-random")
    assert model.vision_model.config._attn_implementation == "sdpa"
    inputs = processor(images=[np.zeros((32, 32, 3), dtype=np.uint8)])
    plain = model.generate(**inputs, num_beams=1, max_new_tokens=3)
    out = model.generate(**inputs, num_beams=1, max_new_tokens=3, output_attentions=True, return_dict_in_generate=True)
    assert not warned
    assert torch.equal(out.sequences, plain)
    assert len(out.cross_attentions) == out.sequences.shape[1] - 1
    assert all(len(step) == len(model.image_layers()) for step in out.cross_attentions)


# ------------------------------------------------------------------ frictions: itune caption - reads stdin
def test_itune_caption_dash_reads_image_paths_from_stdin(captioner_dirs, tmp_path, capsys, monkeypatch):
    import io

    from conftest import write_photo

    photos = [str(write_photo(tmp_path / f"{i}.png", color=(60 * i, 0, 0))) for i in range(2)]
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{photos[0]}\n\n{photos[1]}\n"))
    command = ["caption", "-", "--model", str(captioner_dirs["full"]), "--json", "--num-beams", "1"]
    assert main([*command, "--max-new-tokens", "3"]) == 0
    printed = [json.loads(line)["path"] for line in capsys.readouterr().out.strip().splitlines()]
    assert printed == photos
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(command) == 2
    assert "no images found in stdin" in capsys.readouterr().err
