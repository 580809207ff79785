"""Karpathy split JSON loading: columns, splits, missing/empty/truncated images, size checks, malformed files."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict
from PIL import Image

from itune_hf.data import (
    DataFormatError,
    RepeatedImagesWarning,
    SplitSizeWarning,
    UnusableImagesError,
    UnusableImagesWarning,
    load_karpathy,
    make_synthetic,
    verify_images,
)


def write_png(path: Path, colour=(200, 30, 30), size=(16, 16)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def entry(filename: str, split: str = "train", filepath: str | None = "imgs", cocoid: int | None = None, n: int = 2):
    item = {
        "filename": filename,
        "split": split,
        "sentences": [{"raw": f" caption {k} of {filename} ", "tokens": ["caption"]} for k in range(n)],
    }
    if filepath is not None:
        item["filepath"] = filepath
    if cocoid is not None:
        item["cocoid"] = cocoid
    return item


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture
def broken_set(tmp_path):
    """Five entries: two good images, one missing, one empty, one truncated (the cheap check only sees two)."""
    root = tmp_path / "root"
    write_png(root / "imgs" / "good1.png")
    write_png(root / "imgs" / "good2.png", (20, 200, 20))
    (root / "imgs" / "empty.png").write_bytes(b"")
    Image.effect_noise((64, 64), 50).convert("RGB").save(root / "imgs" / "truncated.png")
    full = (root / "imgs" / "truncated.png").read_bytes()
    (root / "imgs" / "truncated.png").write_bytes(full[: len(full) // 2])
    names = ["good1.png", "missing.png", "empty.png", "truncated.png", "good2.png"]
    json_path = write_json(
        tmp_path / "dataset_custom.json",
        {"dataset": "custom", "images": [entry(name, cocoid=i) for i, name in enumerate(names)]},
    )
    return json_path, root


def test_synthetic_output_loads_with_all_splits(tmp_path):
    dataset_json = make_synthetic(tmp_path / "syn", num_images=20, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing missing, no size check for an unknown dataset kind
        data = load_karpathy(dataset_json)
    assert isinstance(data, DatasetDict)
    assert {name: len(part) for name, part in data.items()} == {"train": 16, "val": 2, "test": 2}
    row = data["train"][0]
    assert set(row) >= {"image_id", "image_path", "captions", "split"}
    assert row["image_id"] == "000000" and row["split"] == "train"
    assert Path(row["image_path"]).is_absolute() and Path(row["image_path"]).is_file()
    assert len(row["captions"]) == 5 and all(isinstance(c, str) and c for c in row["captions"])
    one = load_karpathy(dataset_json, split="validation")
    assert isinstance(one, Dataset) and len(one) == 2 and set(one["split"]) == {"val"}


def test_paths_ids_and_restval(tmp_path):
    root = tmp_path / "coco"
    write_png(root / "val2014" / "a.jpg")
    write_png(root / "a.jpg")  # Flickr-style entry without filepath
    json_path = write_json(
        tmp_path / "ann.json",
        {
            "images": [
                entry("a.jpg", "restval", filepath="val2014", cocoid=42),
                {**entry("a.jpg", "test", filepath=None), "imgid": 7},
            ]
        },
    )
    data = load_karpathy(json_path, root)
    assert data["train"][0]["image_id"] == "42"
    assert data["train"][0]["split"] == "train"  # restval is train
    assert data["train"][0]["image_path"] == str(root / "val2014" / "a.jpg")
    assert data["test"][0]["image_path"] == str(root / "a.jpg")
    assert data["test"][0]["image_id"] == "a"  # no cocoid: the file name without extension
    assert data["train"][0]["captions"] == ["caption 0 of a.jpg", "caption 1 of a.jpg"]  # raw, stripped


def test_missing_and_empty_images_are_reported_and_skipped(broken_set):
    json_path, root = broken_set
    with pytest.warns(UnusableImagesWarning) as caught:
        data = load_karpathy(json_path, root, split="train")
    message = str(caught[0].message)
    assert str(root / "imgs" / "missing.png") + " (no such file)" in message
    assert str(root / "imgs" / "empty.png") + " (empty file)" in message
    assert "2 of 5 images" in message and "skipped" in message
    assert caught[0].message.report.paths == [str(root / "imgs" / "missing.png"), str(root / "imgs" / "empty.png")]
    # The cheap load-time check does not decode: the truncated file is still there.
    assert [Path(p).name for p in data["image_path"]] == ["good1.png", "truncated.png", "good2.png"]


def test_missing_images_stop_loading_in_error_mode(broken_set):
    json_path, root = broken_set
    with pytest.raises(UnusableImagesError) as raised:
        load_karpathy(json_path, root, on_missing="error")
    message = str(raised.value)
    assert str(root / "imgs" / "missing.png") in message and str(root / "imgs" / "empty.png") in message
    assert "stopping" in message and "--on-missing report" in message
    assert raised.value.report.action == "stopped"


def test_verify_images_finds_truncated_files(broken_set):
    json_path, root = broken_set
    with pytest.warns(UnusableImagesWarning):
        data = load_karpathy(json_path, root)
    with pytest.warns(UnusableImagesWarning) as caught:
        verified, report = verify_images(data, num_threads=2)
    assert report.paths == [str(root / "imgs" / "truncated.png")]
    assert "unreadable image data" in report.problems[0][1]
    assert str(root / "imgs" / "truncated.png") in str(caught[0].message)
    assert [Path(p).name for p in verified["train"]["image_path"]] == ["good1.png", "good2.png"]
    with pytest.raises(UnusableImagesError, match="truncated.png"):
        verify_images(data["train"], on_error="error")


def test_report_lists_ten_paths_and_the_total(tmp_path):
    json_path = write_json(tmp_path / "d.json", {"images": [entry(f"m{i}.png") for i in range(25)]})
    with pytest.warns(UnusableImagesWarning) as caught:
        data = load_karpathy(json_path, tmp_path / "nowhere", split="train")
    message = str(caught[0].message)
    assert len(data) == 0
    assert "25 of 25" in message and "... and 15 more" in message
    assert message.count("(no such file)") == 10
    assert "is the image root" in message and str(tmp_path / "nowhere") in message
    with pytest.warns(UnusableImagesWarning):
        everything = load_karpathy(json_path, tmp_path / "nowhere")
    assert {name: len(part) for name, part in everything.items()} == {"train": 0}  # the split stays, empty


def test_split_size_mismatch_warns_with_expected_and_found(tmp_path):
    for i in range(5):
        write_png(tmp_path / f"x{i}.jpg")
    images = [entry(f"x{i}.jpg", "train", filepath=None, cocoid=i) for i in range(3)]
    images += [entry(f"x{3 + i}.jpg", "val", filepath=None, cocoid=10 + i) for i in range(2)]
    json_path = write_json(tmp_path / "dataset_flickr8k.json", {"dataset": "flickr8k", "images": images})
    with pytest.warns(SplitSizeWarning) as caught:
        load_karpathy(json_path)
    message = str(caught[0].message)
    assert "Flickr8k" in message
    assert "train has 3 instead of 6,000 (-5,997)" in message
    assert "val has 2 instead of 1,000 (-998)" in message
    assert "test has 0 instead of 1,000 (-1,000)" in message
    with pytest.warns(SplitSizeWarning) as caught:
        load_karpathy(json_path, split="val")
    assert "val has 2" in str(caught[0].message) and "train" not in str(caught[0].message).split(":")[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_karpathy(json_path, check_counts=False)


def test_known_sizes_match_without_warning(tmp_path):
    write_png(tmp_path / "x.jpg")
    sizes = {"train": 6000, "val": 1000, "test": 1000}
    splits = [split for split, n in sizes.items() for _ in range(n)]
    images = [entry("x.jpg", split, None, cocoid=index) for index, split in enumerate(splits)]
    json_path = write_json(tmp_path / "whatever.json", {"dataset": "flickr8k", "images": images})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", RepeatedImagesWarning)  # one file for all 8,000 entries: sizes are tested
        data = load_karpathy(json_path)
    assert {name: len(part) for name, part in data.items()} == sizes


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", r"not valid JSON \(line 1, column 2"),
        ("[1, 2]", "expected a JSON object with an 'images' list"),
        ('{"annotations": []}', "no 'images' list"),
        ('{"images": {"a": 1}}', "'images' must be a list"),
        ('{"images": [{"split": "train", "sentences": []}]}', r"images\[0\]: field 'filename' is missing"),
        ('{"images": [{"filename": "a.jpg", "split": "train"}]}', r"images\[0\]: field 'sentences' is missing"),
        (
            '{"images": [{"filename": "a.jpg", "split": "train", "sentences": []},'
            ' {"filename": "b.jpg", "split": "train", "sentences": [{"tokens": ["x"]}]}]}',
            r"images\[1\]: sentences\[0\] has no 'raw' string",
        ),
        ('{"images": [{"filename": "a.jpg", "split": "dev2", "sentences": []}]}', r"field 'split' is 'dev2'"),
        ('{"images": [{"filename": "a.jpg", "split": "train"}, 3]}', r"images\[0\]: field 'sentences'"),
        ('{"images": ["a.jpg"]}', r"images\[0\]: expected an object"),
    ],
)
def test_malformed_files_name_the_file_and_field(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError, match=expected) as raised:
        load_karpathy(path)
    assert str(raised.value).startswith(str(path) + ":")


def test_duplicate_ids_and_missing_file(tmp_path):
    json_path = write_json(tmp_path / "d.json", {"images": [entry("a.jpg", cocoid=1), entry("b.jpg", cocoid=1)]})
    with pytest.raises(DataFormatError, match=r"images\[1\] has image id '1', already used by images\[0\]"):
        load_karpathy(json_path)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_karpathy(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="unknown split 'holdout'"):
        load_karpathy(json_path, split="holdout")
    with pytest.raises(ValueError, match="on_missing must be one of report, error"):
        load_karpathy(json_path, on_missing="skip")


def test_an_entry_whose_caption_is_not_valid_unicode_is_skipped_and_named(tmp_path):
    from itune_hf.data import UnreadableTextWarning

    images = [{"filename": f"{i}.png", "split": "train", "sentences": [{"raw": f"caption {i}"}]} for i in range(3)]
    images[1]["sentences"][0]["raw"] = "a lone \ud800 surrogate"  # valid JSON ("\\ud800"), not valid UTF-8
    for i in range(3):
        Image.new("RGB", (8, 8)).save(tmp_path / f"{i}.png")
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps({"images": images}))
    with pytest.warns(UnreadableTextWarning, match=r"1 of 3 entries skipped: .*dataset.json: images\[1\]"):
        rows = load_karpathy(path, split="train")
    assert sorted(rows["image_id"]) == ["0", "2"]


def test_an_entry_outside_the_image_root_is_refused_unless_allowed(tmp_path):
    """A data file names its images: `..`, an absolute path or a symlink out of the image root would make the
    loader read any file, so the file is refused naming the entry; `allow_outside_root=True` reads it."""
    from itune_hf.data import DataError

    root = tmp_path / "root"
    write_png(root / "imgs" / "inside.png")
    write_png(tmp_path / "elsewhere" / "outside.png")
    for filepath, filename in (("..", "elsewhere/outside.png"), (str(tmp_path / "elsewhere"), "outside.png")):
        data = {"images": [entry("inside.png"), entry(filename, filepath=filepath, cocoid=7)]}
        json_path = write_json(root / "dataset.json", data)
        with pytest.raises(DataError, match=r"image '7' is .*outside.png, outside the image root .*root"):
            load_karpathy(json_path, split="train")
        assert sorted(load_karpathy(json_path, split="train", allow_outside_root=True)["image_id"]) == ["7", "inside"]
    (root / "imgs" / "link.png").symlink_to(tmp_path / "elsewhere" / "outside.png")  # a symlink out of the root
    json_path = write_json(root / "dataset.json", {"images": [entry("link.png", cocoid=8)]})
    with pytest.raises(DataError, match="--allow-outside-image-root"):
        load_karpathy(json_path, split="train")
    write_png(tmp_path / "other_root" / "imgs" / "link.png")  # the image root given explicitly is the boundary
    json_path = write_json(tmp_path / "dataset.json", {"images": [entry("link.png", cocoid=9)]})
    assert load_karpathy(json_path, tmp_path / "other_root", split="train")["image_id"] == ["9"]
