"""NoCaps / COCO-style, Visual Genome and Hugging Face loaders, and the `load_captions` dispatcher; a `save_to_disk`
dataset with embedded images (and other column names) through `itune train`, `eval` and `cache-features`."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset, DatasetDict
from datasets import Image as ImageFeature
from PIL import Image

from itune_hf.cli import main
from itune_hf.data import (
    DataError,
    DataFormatError,
    SplitSizeWarning,
    UnusableImagesError,
    UnusableImagesWarning,
    add_data_arguments,
    load_captions,
    load_coco_captions,
    load_data_from_args,
    load_hf_captions,
    load_nocaps,
    load_visual_genome,
    make_synthetic,
    open_example_image,
    verify_images,
)

from conftest import train_tiny_adapter


def write_png(path: Path, colour=(200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (12, 10), colour).save(path)
    return path


def write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def nocaps_json(tmp_path: Path, name: str = "nocaps_val_4500_captions.json", with_captions: bool = True) -> Path:
    images = [
        {"id": 0, "file_name": "0013ea2087020901.jpg", "domain": "in-domain", "open_images_id": "0013ea2087020901"},
        {"id": 1, "file_name": "00223d8ba5dd0f2a.jpg", "domain": "near-domain"},
        {"id": 2, "file_name": "003e1f6e6e0c5f5c.jpg", "domain": "out-domain"},
    ]
    for image in images:
        write_png(tmp_path / "nocaps" / "val" / image["file_name"])
    data = {"licenses": [], "info": {}, "images": images}
    if with_captions:
        data["annotations"] = [
            {"image_id": image["id"], "id": image["id"] * 10 + k, "caption": f"caption {k} of image {image['id']}"}
            for k in range(10)
            for image in images
        ]
    return write_json(tmp_path / name, data)


def test_nocaps_keeps_domain_and_ten_captions(tmp_path):
    path = nocaps_json(tmp_path)
    with pytest.warns(SplitSizeWarning) as caught:
        data = load_nocaps(path, tmp_path / "nocaps" / "val")
    assert isinstance(data, Dataset) and len(data) == 3
    assert data["domain"] == ["in-domain", "near-domain", "out-domain"]
    assert data["split"] == ["val"] * 3
    assert data[1]["image_id"] == "1"
    assert data[1]["captions"] == [f"caption {k} of image 1" for k in range(10)]
    assert data[2]["image_path"] == str(tmp_path / "nocaps" / "val" / "003e1f6e6e0c5f5c.jpg")
    message = str(caught[0].message)
    assert "NoCaps val" in message
    assert "total has 3 instead of 4,500 (-4,497)" in message
    assert "in-domain has 1 instead of 648" in message and "out-domain has 1 instead of 914" in message
    only_out = load_nocaps(path, tmp_path / "nocaps" / "val", domain="out-domain", check_counts=False)
    assert only_out["image_id"] == ["2"]


def test_nocaps_test_split_without_captions_and_errors(tmp_path):
    path = nocaps_json(tmp_path, "nocaps_test_image_info.json", with_captions=False)
    with pytest.warns(SplitSizeWarning, match="NoCaps test: total has 3 instead of 10,600"):
        data = load_nocaps(path, tmp_path / "nocaps" / "val")
    assert data["split"] == ["test"] * 3 and data["captions"] == [[], [], []]
    bad = write_json(tmp_path / "bad.json", {"images": [{"id": 5, "file_name": "x.jpg"}], "annotations": []})
    with pytest.raises(DataFormatError, match=r"bad.json: images\[0\]: field 'domain' is missing"):
        load_nocaps(bad)
    orphan = write_json(
        tmp_path / "orphan.json",
        {
            "images": [{"id": 5, "file_name": "x.jpg", "domain": "in-domain"}],
            "annotations": [{"image_id": 6, "caption": "c"}],
        },
    )
    with pytest.raises(DataFormatError, match=r"annotations\[0\]: image_id 6 is not among the images"):
        load_nocaps(orphan)


def test_a_file_whose_later_images_carry_domains_is_read_as_nocaps(tmp_path):
    data = json.loads(nocaps_json(tmp_path).read_text())
    del data["images"][0]["domain"]  # the first image untagged, the others tagged
    partly = write_json(tmp_path / "captions.json", data)
    for load in (lambda path: load_captions(path, image_root=tmp_path / "nocaps" / "val"), load_coco_captions):
        with pytest.raises(DataFormatError, match=r"captions.json: images\[0\]: field 'domain' is missing"):
            load(partly)
    data["images"][0]["domain"] = "in-domain"
    write_json(partly, data)
    loaded = load_captions(partly, image_root=tmp_path / "nocaps" / "val", check_counts=False)["val"]
    assert loaded["domain"] == ["in-domain", "near-domain", "out-domain"]


def test_nocaps_missing_images_are_reported(tmp_path):
    path = nocaps_json(tmp_path)
    (tmp_path / "nocaps" / "val" / "00223d8ba5dd0f2a.jpg").unlink()
    with pytest.warns(UnusableImagesWarning, match="00223d8ba5dd0f2a.jpg \\(no such file\\)"):
        data = load_nocaps(path, tmp_path / "nocaps" / "val", check_counts=False)
    assert data["image_id"] == ["0", "2"]
    with pytest.raises(UnusableImagesError, match="00223d8ba5dd0f2a.jpg"):
        load_nocaps(path, tmp_path / "nocaps" / "val", check_counts=False, on_missing="error")


def region(image_id: int, region_id: int, phrase: str, x=1, y=2, w=3, h=4) -> dict:
    return {"region_id": region_id, "image_id": image_id, "phrase": phrase, "x": x, "y": y, "width": w, "height": h}


def vg_files(tmp_path: Path) -> Path:
    write_png(tmp_path / "vg" / "VG_100K" / "1.jpg")
    write_png(tmp_path / "vg" / "VG_100K_2" / "2.jpg")
    regions = [
        {
            "id": 1,
            "regions": [
                region(1, 10, "a man riding a horse ", 5, 6, 7, 8),
                region(1, 11, "  A man  riding a horse."),  # duplicate after cleanup (case, spaces, period)
                region(1, 12, "   "),  # empty: dropped
                region(1, 13, "green grass on the ground", 9, 9, 9, 9),
            ],
        },
        {"id": 2, "regions": [region(2, 20, "white clouds in blue sky")]},
        {"id": 3, "regions": [region(3, 30, ".")]},  # nothing left after cleanup: image dropped
    ]
    return write_json(tmp_path / "vg" / "region_descriptions.json", regions)


def test_visual_genome_one_row_per_image_with_clean_phrases(tmp_path):
    path = vg_files(tmp_path)
    with pytest.warns(SplitSizeWarning, match="Visual Genome 1.2: images has 3 instead of 108,077"):
        data = load_visual_genome(path)
    assert data["image_id"] == ["1", "2"]
    assert data[0]["captions"] == ["a man riding a horse", "green grass on the ground"]
    assert np.allclose(data[0]["boxes"], [[5 / 12, 0.6, 1, 1], [0.75, 0.9, 1, 1]])  # x, y, w, h in a 12x10 image
    assert data[0]["image_path"] == str(tmp_path / "vg" / "VG_100K" / "1.jpg")
    assert data[1]["image_path"] == str(tmp_path / "vg" / "VG_100K_2" / "2.jpg")  # found in the second folder
    assert data["split"] == ["train", "train"]
    capped = load_visual_genome(path, max_captions_per_image=1, check_counts=False)
    assert capped[0]["captions"] == ["a man riding a horse"]
    with pytest.raises(ValueError, match="only have a train split"):
        load_visual_genome(path, split="test")


def test_visual_genome_image_data_json_and_missing_images(tmp_path):
    path = vg_files(tmp_path)
    image_data = write_json(
        tmp_path / "vg" / "image_data.json",
        [
            {"image_id": 1, "url": "https://cs.stanford.edu/people/rak248/VG_100K/1.jpg", "width": 12, "height": 10},
            {"image_id": 2, "url": "https://cs.stanford.edu/people/rak248/VG_100K/2.jpg", "width": 12, "height": 10},
            {"image_id": 3, "url": "https://cs.stanford.edu/people/rak248/VG_100K/3.jpg", "width": 12, "height": 10},
        ],
    )
    # image_data.json says image 2 is in VG_100K, where it is not: reported with that path.
    with pytest.warns(UnusableImagesWarning) as caught:
        data = load_visual_genome(path, image_data_json=image_data, check_counts=False)
    assert data["image_id"] == ["1"]
    assert caught[0].message.report.paths == [str(tmp_path / "vg" / "VG_100K" / "2.jpg")]
    with pytest.raises(DataFormatError, match=r"region_descriptions.json: \[0\]: regions\[0\] has no 'phrase'"):
        load_visual_genome(write_json(tmp_path / "vg" / "region_descriptions.json", [{"id": 1, "regions": [{}]}]))


def test_hf_save_to_disk_with_embedded_images(tmp_path):
    paths = [str(write_png(tmp_path / "src" / f"{i}.png", (i * 60, 0, 0))) for i in range(3)]
    table = Dataset.from_dict(
        {"image": paths, "caption": [["a red thing", "red"], ["dark"], ["black"]], "img_id": ["a", "b", "c"]}
    ).cast_column("image", ImageFeature())
    DatasetDict({"train": table.select([0, 1]), "validation": table.select([2])}).save_to_disk(tmp_path / "disk")
    for path in paths:
        Path(path).unlink()  # the saved dataset embeds the bytes: it must not need the source files
    data = load_hf_captions(tmp_path / "disk")
    assert set(data) == {"train", "val"}
    assert data["train"]["image_id"] == ["a", "b"] and data["val"]["split"] == ["val"]
    assert data["train"][0]["captions"] == ["a red thing", "red"]
    assert open_example_image(data["train"][1]).getpixel((0, 0)) == (60, 0, 0)
    same = load_captions(str(tmp_path / "disk"), split="validation")
    assert same["image_id"] == ["c"]
    verified, report = verify_images(same)
    assert len(verified) == 1 and not report


def test_hf_imagefolder_directory_groups_one_caption_per_row(tmp_path):
    folder = tmp_path / "folder" / "train"
    for i in range(2):
        write_png(folder / f"{i}.png")
    rows = [{"file_name": "0.png", "image_id": 0, "text": f"first {k}"} for k in range(2)]
    rows += [{"file_name": "1.png", "image_id": 1, "text": "second"}]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    data = load_hf_captions(tmp_path / "folder", "train", cache_dir=str(tmp_path / "cache"))
    assert data["image_id"] == ["0", "1"]
    assert data["captions"] == [["first 0", "first 1"], ["second"]]
    assert data["image_path"][1] == str(folder / "1.png")


def test_hf_split_column_and_errors(tmp_path, monkeypatch):
    import datasets

    # conftest sets HF_HUB_OFFLINE after `datasets` read it at import: make the library see it too (no network).
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    write_png(tmp_path / "imgs" / "x.png")
    table = Dataset.from_dict(
        {"filename": ["x.png"] * 3, "sentences": [["a"], ["b"], ["c"]], "split": ["train", "val", "test"]}
    )
    table.save_to_disk(tmp_path / "single")
    data = load_hf_captions(tmp_path / "single", "test", image_root=tmp_path / "imgs")
    assert data["captions"] == [["c"]] and data["image_path"] == [str(tmp_path / "imgs" / "x.png")]
    with pytest.raises(DataError, match="no split 'holdout'"):
        load_hf_captions(tmp_path / "single", "holdout")
    with pytest.raises(DataError, match="no caption column 'label'; columns: filename, sentences, split"):
        load_hf_captions(tmp_path / "single", "train", caption_column="label")
    with pytest.warns(UnusableImagesWarning, match=r"x.png \(no such file\)"):
        assert len(load_hf_captions(tmp_path / "single", "train", image_root=tmp_path)) == 0
    with pytest.raises(DataError, match="could not load as a Hugging Face dataset.*HF_HUB_OFFLINE is set"):
        load_captions("someone/not-a-local-dataset", split="test")


def test_coco_style_and_hf_paths_out_of_the_image_root_are_refused_unless_allowed(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    write_png(tmp_path / "outside.png")
    coco = {"images": [{"id": 3, "file_name": "../outside.png"}], "annotations": []}
    path = write_json(tmp_path / "root" / "captions_test.json", coco)
    with pytest.raises(DataError, match=r"image '3' is .*root/../outside.png, outside the image root .*root \(paths"):
        load_captions(path)
    assert load_captions(path, split="test", allow_outside_root=True)["image_id"] == ["3"]
    Dataset.from_dict({"image_path": ["../outside.png"], "caption": ["a"]}).save_to_disk(tmp_path / "root" / "disk")
    with pytest.raises(DataError, match=r"disk \[train\]: image 'outside' is .*outside.png, outside the image root"):
        load_hf_captions(tmp_path / "root" / "disk", "train", image_root=tmp_path / "root")
    kept = load_hf_captions(tmp_path / "root" / "disk", "train", image_root=tmp_path / "root", allow_outside_root=True)
    assert len(kept) == 1
    Dataset.from_dict({"image_path": [str(tmp_path / "outside.png")], "caption": ["a"]}).save_to_disk(tmp_path / "abs")
    assert len(load_hf_captions(tmp_path / "abs", "train")) == 1  # absolute, as `datasets` stores paths: read


def test_load_captions_detects_each_json_format(tmp_path):
    karpathy = make_synthetic(tmp_path / "syn", num_images=10)
    assert set(load_captions(str(karpathy))) == {"train", "val", "test"}
    assert len(load_captions(str(tmp_path / "syn"), split="train")) == 8  # a directory holding dataset.json
    with pytest.warns(SplitSizeWarning):
        nocaps = load_captions(str(nocaps_json(tmp_path)), str(tmp_path / "nocaps" / "val"))
    assert list(nocaps) == ["val"] and "domain" in nocaps["val"].column_names
    with pytest.warns(SplitSizeWarning):
        vg = load_captions(str(vg_files(tmp_path)), split="train")
    assert "boxes" in vg.column_names
    unknown = write_json(tmp_path / "other.json", {"categories": []})
    with pytest.raises(DataFormatError, match="other.json: cannot tell the annotation format"):
        load_captions(str(unknown))
    with pytest.raises(FileNotFoundError, match="missing.json: no such file"):
        load_captions(str(tmp_path / "missing.json"))


def test_builtin_names_are_materialised_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ITUNE_DATA_CACHE", str(tmp_path / "cache"))
    data = load_captions("synthetic", split="val")
    assert len(data) == 200 and Path(data[0]["image_path"]).is_relative_to(tmp_path / "cache")
    stamp = Path(data[0]["image_path"]).stat().st_mtime_ns
    assert Path(load_captions("synthetic", split="val")[0]["image_path"]).stat().st_mtime_ns == stamp  # reused
    photos = load_captions("photos", split="test")
    assert len(photos) >= 1 and all(len(c) == 5 for c in photos["captions"])


def test_add_data_arguments_gives_every_command_the_same_options(tmp_path):
    karpathy = make_synthetic(tmp_path / "syn", num_images=10)
    parser = argparse.ArgumentParser()
    add_data_arguments(parser, verify_option=True)
    args = parser.parse_args(["--data", str(karpathy), "--split", "test", "--on-missing", "error", "--verify-images"])
    assert (args.image_root, args.split, args.on_missing, args.verify_images) == (None, "test", "error", True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_data_from_args(args)) == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["--data", "x", "--on-missing", "skip"])
    defaulted = argparse.ArgumentParser()
    add_data_arguments(defaulted, default_data="synthetic", default_split="train")
    assert vars(defaulted.parse_args([])) == {
        "data": "synthetic",
        "image_root": None,
        "allow_outside_image_root": False,
        "split": "train",
        "on_missing": "report",
        "image_column": None,
        "caption_column": None,
    }


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


def test_caption_column_names_the_field_a_karpathy_entry_holds_its_captions_in(tmp_path):
    """`--caption-column alt_text` on a Karpathy dataset.json (make-clipart's alt-text arm): a string or a list of
    strings per entry; an entry without the field is refused naming the file, the entry and the field."""
    for name in ("a.png", "b.png"):
        write_png(tmp_path / "images" / name)
    images = [
        {"filepath": "images", "filename": "a.png", "split": "train", "sentences": [{"raw": "A red square."}],
         "alt_text": "red square stock photo, shapes"},
        {"filepath": "images", "filename": "b.png", "split": "train", "sentences": [{"raw": "A blue square."}],
         "alt_text": ["blue square", "free download"]},
    ]  # fmt: skip
    dataset_json = tmp_path / "dataset.json"
    dataset_json.write_text(json.dumps({"dataset": "itune-clipart", "images": images}))
    for data in (str(dataset_json), str(tmp_path)):
        alt = load_captions(data, split="train", caption_column="alt_text")
        assert alt["captions"] == [["red square stock photo, shapes"], ["blue square", "free download"]]
        assert load_captions(data, split="train")["captions"] == [["A red square."], ["A blue square."]]
    parser = argparse.ArgumentParser()
    add_data_arguments(parser)
    args = parser.parse_args(["--data", str(dataset_json), "--split", "train", "--caption-column", "alt_text"])
    assert load_data_from_args(args)["captions"][1] == ["blue square", "free download"]

    del images[1]["alt_text"]
    dataset_json.write_text(json.dumps({"dataset": "itune-clipart", "images": images}))
    with pytest.raises(DataFormatError) as refused:
        load_captions(str(dataset_json), split="train", caption_column="alt_text")
    assert str(refused.value).startswith(f"{dataset_json}: images[1]: no field 'alt_text' (--caption-column alt_text)")
    images[1]["alt_text"] = {"not": "text"}
    dataset_json.write_text(json.dumps({"dataset": "itune-clipart", "images": images}))
    with pytest.raises(DataFormatError, match=r"images\[1\]: field 'alt_text' .* a string or a list of strings"):
        load_captions(str(dataset_json), split="train", caption_column="alt_text")
    nocaps = tmp_path / "nocaps.json"
    nocaps.write_text(json.dumps({"images": [{"id": 1, "file_name": "images/a.png"}],
                                  "annotations": [{"image_id": 1, "caption": "x"}]}))  # fmt: skip
    with pytest.raises(ValueError, match="--caption-column alt_text: names a field of a Karpathy dataset.json"):
        load_captions(str(nocaps), caption_column="alt_text")
