"""Data that loaded silently wrong: a Hugging Face table holding every split in a `split` column (all of it was
`train`), split names that mean the same, captions that are empty, one caption per row without an id column, ids
shared by different images, one image under several entries, and images without references reaching validation
or `itune eval`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict
from PIL import Image

from itune_hf.cli import main
from itune_hf.data import (
    DataError,
    EmptyCaptionsWarning,
    RepeatedImagesWarning,
    load_captions,
    load_hf_captions,
    load_karpathy,
)
from itune_hf.data.karpathy import detect_karpathy_kind


def images(root: Path, count: int) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", (12, 10), (20 * i, 40, 90)).save(root / f"{i}.png")
    return [f"{i}.png" for i in range(count)]


def karpathy(path: Path, entries: list[tuple[str, str, list[str]]]) -> Path:
    """A Karpathy file of (file name, split, captions) entries."""
    data = {
        "images": [
            {"filename": name, "split": split, "cocoid": i, "sentences": [{"raw": c} for c in captions]}
            for i, (name, split, captions) in enumerate(entries)
        ]
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_table_with_a_split_column_is_split_on_it(tmp_path):
    names = images(tmp_path / "imgs", 4)
    table = Dataset.from_dict({"filename": names, "caption": list("abcd"), "split": ["train", "train", "val", "test"]})
    table.save_to_disk(tmp_path / "single")
    loaded = load_hf_captions(tmp_path / "single", image_root=tmp_path / "imgs")
    assert {name: len(part) for name, part in loaded.items()} == {"train": 2, "val": 1, "test": 1}  # all was train
    assert len(load_hf_captions(tmp_path / "single", "train", image_root=tmp_path / "imgs")) == 2


def test_restval_joins_train_and_two_names_for_val_are_refused(tmp_path):
    names = images(tmp_path / "imgs", 4)

    def part(rows: list[int]) -> Dataset:
        return Dataset.from_dict({"filename": [names[i] for i in rows], "caption": [f"c{i}" for i in rows]})

    DatasetDict({"train": part([0, 1]), "restval": part([2]), "val": part([3])}).save_to_disk(tmp_path / "restval")
    loaded = load_hf_captions(tmp_path / "restval", image_root=tmp_path / "imgs")
    assert sorted(loaded["train"]["image_id"]) == ["0", "1", "2"]  # restval overwrote train
    DatasetDict({"val": part([0]), "validation": part([1])}).save_to_disk(tmp_path / "twice")
    with pytest.raises(DataError, match=r"the splits 'val' and 'validation' both mean 'val'"):
        load_hf_captions(tmp_path / "twice", image_root=tmp_path / "imgs")


def test_rows_per_caption_group_by_file_and_an_id_of_two_images_is_refused(tmp_path):
    names = images(tmp_path / "imgs", 2)
    Dataset.from_dict({"filename": [names[0], names[0], names[1]], "caption": ["a", "b", "c"]}).save_to_disk(
        tmp_path / "no-id"
    )
    rows = load_hf_captions(tmp_path / "no-id", "train", image_root=tmp_path / "imgs")
    assert rows["captions"] == [["a", "b"], ["c"]]  # two rows of image 0 (the last one's captions kept before)
    Dataset.from_dict({"filename": [names[0]] * 2, "caption": ["a", "b"], "image_id": [7.0, 7.0]}).save_to_disk(
        tmp_path / "float-id"
    )
    assert load_hf_captions(tmp_path / "float-id", "train", image_root=tmp_path / "imgs")["image_id"] == ["7"]  # "7.0"
    table = {"filename": names, "caption": ["a", "b"], "image_id": [7, 7]}
    Dataset.from_dict(table).save_to_disk(tmp_path / "clash")
    with pytest.raises(DataError, match=r"rows 0 and 1 have the same image id '7' \(image_id\) but different images"):
        load_hf_captions(tmp_path / "clash", "train", image_root=tmp_path / "imgs")


def test_empty_captions_are_dropped_and_repeated_images_named(tmp_path):
    names = images(tmp_path, 3)
    entries = [(names[0], "train", ["a dog", "  ", ""]), (names[1], "train", ["a cat"]), (names[1], "test", ["x"])]
    path = karpathy(tmp_path / "data.json", entries)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_karpathy(path)
    assert loaded["train"]["captions"] == [["a dog"], ["a cat"]]  # "" was a target and a reference
    messages = {type(w.message): str(w.message) for w in caught}
    assert "dropped 2 empty caption(s) of 1 image(s) (e.g. '0')" in messages[EmptyCaptionsWarning]
    assert "1 across splits (test, train)" in messages[RepeatedImagesWarning]


def test_a_dataset_field_is_not_overruled_by_the_file_name():
    assert detect_karpathy_kind({"dataset": "mytest"}, "cocoa_recipes.json") is None  # it warned of COCO's sizes
    assert detect_karpathy_kind({}, "dataset_coco.json") == "coco"


@pytest.fixture
def no_reference_in_val(tmp_path):
    names = images(tmp_path, 4)
    entries = [(names[0], "train", ["a red one"]), (names[1], "train", ["a blue one"]), (names[2], "val", [])]
    return karpathy(tmp_path / "data.json", [*entries, (names[3], "test", ["a green one"])])


def test_validation_without_references_is_left_out_and_eval_refuses_before_captioning(
    no_reference_in_val, tmp_path, capsys
):
    from itune_hf.training.config import TrainingConfig
    from itune_hf.training.data import load_splits

    config = TrainingConfig(preset="itune-tiny-random", data=str(no_reference_in_val), output_dir=str(tmp_path / "o"))
    train, validation = load_splits(config)
    assert len(train) == 2 and validation is None  # validation stopped at its first score, without a checkpoint
    assert "1 images have no reference caption (e.g. '2'); training without validation" in capsys.readouterr().err
    argv = ["eval", "--model", "unused", "--data", str(no_reference_in_val), "--split", "val"]
    assert main([*argv, "--output-dir", str(tmp_path / "e")]) == 2
    assert "1 of the 1 images of" in capsys.readouterr().err


def test_eval_split_aliases_are_read_and_a_named_missing_split_is_refused(tmp_path):
    from itune_hf.training.config import TrainingConfig
    from itune_hf.training.data import load_splits

    names = images(tmp_path, 3)
    path = karpathy(
        tmp_path / "d.json", [(names[0], "train", ["a"]), (names[1], "val", ["b"]), (names[2], "test", ["c"])]
    )
    options = {"preset": "itune-tiny-random", "data": str(path), "output_dir": str(tmp_path / "o")}
    _, validation = load_splits(TrainingConfig(**options, eval_split="validation"))  # it trained without validation
    assert validation is not None and len(validation) == 1
    with pytest.raises(ValueError, match=r"has no 'bogus' split \(it has train, val, test\); pass --eval-split NAME"):
        load_splits(TrainingConfig(**options, eval_split="bogus"))
    assert len(load_captions(str(path), split="train")) == 1


def test_a_repeated_coco_annotation_id_is_refused(tmp_path):
    """The same annotation three times gave its image the caption three times (training weight, references)."""
    images(tmp_path, 1)
    annotation = {"id": 5, "image_id": 0, "caption": "a dog"}
    data = {"images": [{"id": 0, "file_name": "0.png"}], "annotations": [annotation, dict(annotation)]}
    (tmp_path / "captions.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"annotations\[1\]: annotation id 5 is already annotations\[0\]'s"):
        load_captions(str(tmp_path / "captions.json"), split="val", check_counts=False)
