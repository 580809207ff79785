"""XGPT's box-pooled and precomputed-region inputs through `itune train` and `itune eval`, run as a user runs them
(`itune_hf.cli.main([...])`) on a small synthetic world and region features the tests write; plus the collator's
batches against the processor's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset

from itune_hf.cli import main
from itune_hf.data import load_captions, make_synthetic
from itune_hf.presets import build_model, build_processor
from itune_hf.training import CaptionCollator, CaptionPairs
from itune_hf.training.config import TrainingConfig
from itune_hf.vision.feature_cache import FeatureCache, cache_features
from itune_hf.vision.inputs import VisualInputs

from conftest import write_photo

PRESET = "xgpt-tiny-random"
WIDTH = 12  # width of the region features the tests write
RUN = ["--preset", PRESET, "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-3", "--max-steps", "3"]
RUN += ["--save-every", "3", "--eval-every", "3", "--eval-max-images", "4", "--eval-max-new-tokens", "4"]
EVAL = ["--split", "test", "--max-images", "4", "--num-beams", "1", "--max-new-tokens", "4", "--metrics", "BLEU,CIDEr"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return make_synthetic(tmp_path_factory.mktemp("xgpt-world") / "data", num_images=40, seed=3, image_size=32)


@pytest.fixture(scope="module")
def regions(world, tmp_path_factory) -> Path:
    """One `<image_id>.npz` per image of the world: WIDTH-d features and pixel boxes (its objects, else the image)."""
    directory = tmp_path_factory.mktemp("regions")
    generator = np.random.default_rng(0)
    for split in load_captions(world).values():
        for image_id, boxes in zip(split["image_id"], split["boxes"]):
            pixels = np.asarray(boxes or [[0, 0, 1, 1]], dtype=np.float32) * 32
            features = generator.standard_normal((len(pixels), WIDTH)).astype(np.float32)
            np.savez(directory / f"{image_id}.npz", features=features, boxes=pixels, image_w=32, image_h=32)
    return directory


@pytest.fixture(scope="module")
def no_boxes(world) -> Path:
    """The world's annotations without their objects: a Karpathy file without a `boxes` column."""
    data = json.loads(world.read_text())
    for entry in data["images"]:
        entry.pop("objects", None)
    path = world.parent / "no_boxes.json"
    path.write_text(json.dumps(data))
    return path


def itune(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------------------------------------------------------
# Building the model, the processor and the collator
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pretrained", [False, True])
def test_a_regions_model_is_built_from_a_preset_without_a_vision_tower(pretrained):
    model = build_model(PRESET, pretrained=pretrained, visual_source="regions", region_feature_size=WIDTH)
    assert model.vision_model is None and model.config.vision_config is None
    assert model.config.region_feature_size == WIDTH
    assert build_model(PRESET).config.vision_config._name_or_path == ""  # grid presets are unchanged


def test_the_processor_maps_boxes_by_image_size_without_the_images(tmp_path):
    processor = build_processor(PRESET)
    wide = write_photo(tmp_path / "wide.png", size=(60, 40))
    boxes = [[[0.2, 0.0, 0.5, 0.5], [0.0, 0.0, 1.0, 1.0]]]
    with_images = processor(images=[wide], boxes=boxes)
    sizes_only = processor(text=[None], boxes=boxes, image_sizes=[(60, 40)])
    torch.testing.assert_close(sizes_only["region_boxes"], with_images["region_boxes"])
    assert "pixel_values" not in sizes_only
    with pytest.raises(ValueError, match="pass the images too"):
        processor(text=[None], boxes=boxes)


def test_collated_boxes_match_the_processor_and_the_feature_cache(world, tmp_path):
    rows = load_captions(world)["train"].select(range(4))
    rows = Dataset.from_dict({**rows.to_dict(), "boxes": [[], *rows["boxes"][1:]]})  # image 0 has no boxes
    processor = build_processor(PRESET)
    pairs = CaptionPairs(rows, boxes=True)
    first = {}  # each image's first caption
    for index, (row, _) in enumerate(pairs.pairs):
        first.setdefault(row, index)
    items = [pairs[index] for index in first.values()]
    batch = CaptionCollator(processor, visual=VisualInputs("boxes"))(items)
    expected = processor(
        images=list(rows["image_path"]),
        captions=[c[0] for c in rows["captions"]],
        boxes=[[[0.0, 0.0, 1.0, 1.0]], *rows["boxes"][1:]],
    )
    assert batch.keys() == expected.keys() >= {"pixel_values", "region_boxes", "region_mask", "labels"}
    for key in batch:
        torch.testing.assert_close(batch[key], expected[key])

    model = build_model(PRESET, visual_source="boxes").eval()
    cache_features(rows, tmp_path / "cache", vision_model=model.vision_model, image_processor=processor.image_processor,
                   dtype="float32", progress=False)  # fmt: skip
    cached = CaptionCollator(
        processor, visual=VisualInputs("boxes", FeatureCache(tmp_path / "cache"), "vision_hidden_states")
    )(items)
    assert "pixel_values" not in cached and "vision_hidden_states" in cached
    for key in ("region_boxes", "region_mask", "labels"):
        torch.testing.assert_close(cached[key], expected[key])
    with torch.no_grad():  # cached vision states + boxes compute what the images + boxes compute
        torch.testing.assert_close(model(**cached).loss, model(**batch).loss, rtol=1e-4, atol=1e-4)


def test_training_config_refuses_nonsense_combinations():
    with pytest.raises(ValueError, match="visual_source must be one of"):
        TrainingConfig(output_dir="x", preset=PRESET, visual_source="pixels")
    with pytest.raises(ValueError, match="pass only one of them"):
        TrainingConfig(output_dir="x", preset=PRESET, region_features="r", feature_cache="c")
    with pytest.raises(ValueError, match="visual_source='boxes': drop one of them"):
        TrainingConfig(output_dir="x", preset=PRESET, region_features="r", visual_source="boxes")
    with pytest.raises(ValueError, match="pass region_features"):
        TrainingConfig(output_dir="x", preset=PRESET, visual_source="regions")
    assert TrainingConfig(output_dir="x", preset=PRESET, region_features="r").chosen_visual_source == "regions"


# ------------------------------------------------------------------------------------------------------------------
# itune train / itune eval
# ------------------------------------------------------------------------------------------------------------------
def test_boxes_through_train_and_eval(world, regions, tmp_path, capsys):
    run = tmp_path / "run"
    code, out, err = itune(capsys, "train", *RUN, "--visual-source", "boxes", "--data", world, "--output-dir", run)
    assert code == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["best_step"] == 3
    assert json.loads((run / "config.json").read_text())["visual_source"] == "boxes"
    assert "Visual input: CLIP patch tokens pooled inside given boxes" in (run / "README.md").read_text()

    code, out, err = itune(capsys, "eval", "--model", run, "--data", world, *EVAL, "--output-dir", tmp_path / "eval")
    assert code == 0, err[-3000:]
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert report["visual_source"] == "boxes" and "pooled in each image's boxes" in report["visual_input"]
    assert report["images"] == 4 and (tmp_path / "eval" / "captions.jsonl").is_file()

    code, _, err = itune(capsys, "eval", "--model", run, "--data", world, *EVAL, "--region-features", regions)
    assert code == 2 and "not precomputed regions; drop --region-features" in err


def test_visual_genome_regions_are_the_boxes_a_boxes_model_trains_on(tmp_path, capsys):
    (tmp_path / "vg" / "VG_100K").mkdir(parents=True)
    entries = []
    for image_id in range(4):
        write_photo(tmp_path / "vg" / "VG_100K" / f"{image_id}.jpg", size=(60, 40))
        regions = [{"phrase": "a red wall", "x": 0, "y": 0, "width": 30, "height": 40}]
        regions.append({"phrase": "a blue patch", "x": 30, "y": 0, "width": 50, "height": 20})  # overhangs: clipped
        entries.append({"id": image_id, "regions": regions})
    data = tmp_path / "vg" / "region_descriptions.json"
    data.write_text(json.dumps(entries))
    boxes = load_captions(data, check_counts=False)["train"][0]["boxes"]
    assert np.allclose(boxes, [[0, 0, 0.5, 1], [0.5, 0, 1, 0.5]])  # normalised corners, as a boxes model reads them
    argv = ["train", *RUN, "--visual-source", "boxes", "--data", data, "--eval-split", "none"]
    code, out, err = itune(capsys, *argv, "--output-dir", tmp_path / "run")
    assert code == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["train_captions"] == 8


def test_region_features_through_train_and_eval(world, regions, tmp_path, capsys):
    run = tmp_path / "run"
    code, out, err = itune(capsys, "train", *RUN, "--region-features", regions, "--data", world, "--output-dir", run)
    assert code == 0, err[-3000:]
    config = json.loads((run / "config.json").read_text())
    assert config["visual_source"] == "regions" and config["region_feature_size"] == WIDTH
    assert config.get("vision_config") is None
    card = (run / "README.md").read_text()
    assert f"precomputed region features ({WIDTH}-d" in card and f"bottom-up region features from {regions}" in card

    out_dir = tmp_path / "eval"
    code, out, err = itune(
        capsys, "eval", "--model", run, "--data", world, *EVAL, "--region-features", regions, "--output-dir", out_dir
    )
    assert code == 0, err[-3000:]
    report = json.loads((out_dir / "metrics.json").read_text())
    assert report["visual_source"] == "regions" and report["visual_input"].startswith("bottom-up region features")
    assert len((out_dir / "captions.jsonl").read_text().splitlines()) == 4

    code, _, err = itune(capsys, "eval", "--model", run, "--data", world, *EVAL)
    assert code == 2 and "pass --region-features PATH" in err
    code, _, err = itune(capsys, "eval", "--model", run, "--data", world, *EVAL, "--feature-cache", tmp_path)
    assert code == 2 and "--feature-cache" in err and "precomputed regions" in err
    narrow = tmp_path / "narrow"
    narrow.mkdir()
    np.savez(
        narrow / "000000.npz", features=np.ones((1, 3), np.float32), boxes=[[0, 0, 32, 32]], image_w=32, image_h=32
    )
    code, _, err = itune(capsys, "eval", "--model", run, "--data", world, *EVAL, "--region-features", narrow)
    assert code == 2 and f"--region-features {narrow}: 3-d features, but the model reads {WIDTH}-d" in err


def test_train_refuses_what_it_cannot_honour(world, regions, no_boxes, tmp_path, capsys):
    def refused(*args) -> str:
        code, _, err = itune(capsys, "train", "--report-to", "none", "--max-steps", "1", *args)
        assert code == 2, err[-2000:]
        return err.strip().splitlines()[-1]  # the error is one line

    out = ["--output-dir", tmp_path / "out"]
    err = refused("--preset", "itune-tiny-random", "--region-features", regions, "--data", world, *out)
    assert "--region-features: not settings of I-Tuning models" in err
    err = refused("--preset", PRESET, "--visual-source", "boxes", "--data", no_boxes, *out)
    assert f"{no_boxes} (train split) has no object boxes (no 'boxes' column)" in err
    err = refused("--preset", PRESET, "--region-features", regions, "--feature-cache", regions, "--data", world, *out)
    assert "pass only one of them" in err
    partial = tmp_path / "partial"
    partial.mkdir()
    first = sorted(regions.glob("*.npz"))[0]
    (partial / first.name).write_bytes(first.read_bytes())
    err = refused("--preset", PRESET, "--region-features", partial, "--data", world, *out)
    assert f"--region-features {partial} has no features for" in err and "(train split)" in err
