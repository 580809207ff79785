"""The tiny real photo set: five captions per photo, files found inside the installed packages, graceful skipping."""

from __future__ import annotations

import json
import warnings

import pytest

from itune_hf.data import DataError, PhotoSkippedWarning, list_photos, load_karpathy, make_photos, verify_images
from itune_hf.data import photos as photos_module

EXPECTED = {
    "skimage": {"astronaut", "chelsea", "coffee", "rocket", "motorcycle", "hubble_deep_field", "retina", "ihc"},
    "sklearn": {"china", "flower"},
    "matplotlib": {"grace_hopper"},
}


def test_every_photo_has_five_distinct_sentences():
    photos = list_photos()
    assert len({photo.name for photo in photos}) == len(photos)
    for package, names in EXPECTED.items():
        assert names <= {photo.name for photo in photos if photo.package == package}
    for photo in photos:
        assert len(photo.captions) == 5 and len(set(photo.captions)) == 5, photo.name
        for caption in photo.captions:
            assert caption[0].isupper() and caption.endswith(".") and 4 <= len(caption.split()) <= 20, caption


def test_make_photos_writes_a_loadable_test_split(tmp_path):
    with warnings.catch_warnings(record=True) as caught:  # skipped photos warn; here every photo is available
        warnings.simplefilter("always")
        dataset_json = make_photos(tmp_path / "photos")
    assert [str(w.message) for w in caught if issubclass(w.category, PhotoSkippedWarning)] == []
    data = json.loads(dataset_json.read_text())
    assert data["dataset"] == "itune-photos" and data["skipped"] == []
    assert len(data["images"]) == len(list_photos())
    dataset = load_karpathy(dataset_json, split="test")
    assert len(dataset) == len(list_photos())
    assert all(len(captions) == 5 for captions in dataset["captions"])
    verified, report = verify_images(dataset)
    assert len(verified) == len(dataset) and not report  # every copied photo decodes
    by_id = {row["image_id"]: row for row in dataset}
    assert by_id["chelsea"]["captions"][0].startswith("A close up of a tabby cat")
    assert (tmp_path / "photos" / "images" / "china.jpg").read_bytes()[:2] == b"\xff\xd8"  # copied as is


def test_missing_package_is_skipped_with_a_note(tmp_path, monkeypatch):
    real_find_spec = photos_module.find_spec
    monkeypatch.setattr(photos_module, "find_spec", lambda name: None if name == "sklearn" else real_find_spec(name))
    with pytest.warns(PhotoSkippedWarning) as caught:
        dataset_json = make_photos(tmp_path / "photos")
    assert [str(w.message) for w in caught] == [
        "photo 'china' skipped: package sklearn is not installed",
        "photo 'flower' skipped: package sklearn is not installed",
    ]
    data = json.loads(dataset_json.read_text())
    names = {entry["filename"].split(".")[0] for entry in data["images"]}
    assert names.isdisjoint(EXPECTED["sklearn"]) and EXPECTED["skimage"] <= names
    assert {item["name"] for item in data["skipped"]} == {"china", "flower"}

    monkeypatch.setattr(photos_module, "find_spec", lambda name: None)
    with pytest.warns(PhotoSkippedWarning) as caught, pytest.raises(DataError, match="no photo is available"):
        make_photos(tmp_path / "none")
    assert len(caught) == len(list_photos())
    assert not (tmp_path / "none").exists()


def test_photo_missing_from_an_installed_package_is_skipped(tmp_path, monkeypatch):
    fake = tmp_path / "fake_skimage"
    (fake / "data").mkdir(parents=True)
    (fake / "data" / "astronaut.png").write_bytes(
        (photos_module.package_dir("skimage") / "data/astronaut.png").read_bytes()
    )
    real = photos_module.package_dir
    monkeypatch.setattr(photos_module, "package_dir", lambda name: fake if name == "skimage" else real(name))
    with pytest.warns(PhotoSkippedWarning) as caught:
        dataset_json = make_photos(tmp_path / "photos")
    assert any("photo 'coffee' skipped: skimage does not ship data/coffee.png" in str(w.message) for w in caught)
    assert not any("astronaut" in str(w.message) or "china" in str(w.message) for w in caught)
    names = [entry["filename"] for entry in json.loads(dataset_json.read_text())["images"]]
    assert "astronaut.png" in names and "coffee.png" not in names
