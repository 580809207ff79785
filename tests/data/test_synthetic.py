"""The synthetic caption world: determinism, captions that match the pixels, splits, speed, safe output."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from itune_hf.cli import main
from itune_hf.data import DataError, make_synthetic
from itune_hf.data.synthetic import (
    BACKGROUNDS,
    COLORS,
    PALETTE,
    SHAPES,
    SYNTHETIC_VERSION,
    VOCABULARY,
    generate_example,
    render_scene,
    split_sizes,
)

COLOR_WORDS = "|".join(COLORS)
SHAPE_WORDS = "|".join(SHAPES)
OBJECT_PHRASE = re.compile(rf"\b(a|one|single|two|three|pair of) ({COLOR_WORDS}) ({SHAPE_WORDS})s?\b")
COUNT = {"a": 1, "one": 1, "single": 1, "two": 2, "three": 3, "pair of": 2}


def tree_digest(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def colour_names(pixels: np.ndarray) -> np.ndarray:
    """Name of the palette colour of every pixel (exact match: the world has no anti-aliasing)."""
    names = np.full(pixels.shape[:2], "", dtype=object)
    for name, rgb in {**BACKGROUNDS, **COLORS}.items():
        names[(pixels == np.array(rgb, dtype=np.uint8)).all(axis=-1)] = name
    assert (names != "").all(), "every pixel must be one of the palette colours"
    return names


def test_same_seed_same_bytes_different_seed_different(tmp_path):
    first = make_synthetic(tmp_path / "a", num_images=30, seed=7).parent
    second = make_synthetic(tmp_path / "b", num_images=30, seed=7).parent
    other = make_synthetic(tmp_path / "c", num_images=30, seed=8).parent
    assert tree_digest(first) == tree_digest(second)
    digest_other = tree_digest(other)
    assert digest_other["dataset.json"] != tree_digest(first)["dataset.json"]
    changed = [name for name, digest in tree_digest(first).items() if digest_other.get(name) != digest]
    assert len(changed) > 25  # nearly every image differs


def test_smaller_world_is_a_prefix_of_a_larger_one(tmp_path):
    small = json.loads(make_synthetic(tmp_path / "s", num_images=10, seed=1).read_text())["images"]
    large = json.loads(make_synthetic(tmp_path / "l", num_images=40, seed=1).read_text())["images"]
    strip = lambda entry: {k: v for k, v in entry.items() if k != "split"}  # noqa: E731
    assert [strip(e) for e in small] == [strip(e) for e in large[:10]]


def test_golden_bytes_are_machine_independent(tmp_path):
    """Pinned digest: the generator uses no RNG, libm or zlib behaviour that may vary between machines. If the world
    is changed on purpose, bump SYNTHETIC_VERSION and update this digest."""
    directory = make_synthetic(tmp_path / "g", num_images=12, seed=0).parent
    combined = hashlib.sha256(json.dumps(tree_digest(directory), sort_keys=True).encode()).hexdigest()
    assert SYNTHETIC_VERSION == 3
    assert combined == GOLDEN_DIGEST


# Version 2 added the scenes' relations to dataset.json, version 3 the hard world's sizes (here only the version
# number in dataset.json changes); every image is byte-identical to version 1's.
GOLDEN_DIGEST = "a1b34c75dfb02ea8ebd9671fba9afeb5d3af48e5284ba3a65f6089a563de922c"


def test_captions_describe_exactly_what_is_drawn(tmp_path):
    dataset_json = make_synthetic(tmp_path / "w", num_images=150, seed=11)
    data = json.loads(dataset_json.read_text())
    kinds = set()
    for entry in data["images"]:
        pixels = np.asarray(Image.open(dataset_json.parent / entry["filepath"] / entry["filename"]).convert("RGB"))
        assert pixels.shape == (64, 64, 3)
        names = colour_names(pixels)
        background = names[0, 0]
        assert background in BACKGROUNDS and entry["background"] == background
        foreground = names != background
        components, count = ndimage.label(foreground, structure=np.ones((3, 3)))  # 8-connected
        drawn_colours = set(names[foreground])
        dominant = max(drawn_colours, key=lambda c: (names == c).sum())
        # Objects are separate blobs (no overlap), each larger than one 8x8 patch and at least 12 pixels across.
        sizes = ndimage.sum(foreground, components, range(1, count + 1))
        assert count == len(entry["objects"]) and min(sizes) >= 80
        centres = {}
        for index in range(1, count + 1):
            ys, xs = np.nonzero(components == index)
            colours = set(names[ys, xs])
            assert len(colours) == 1
            centres.setdefault(colours.pop(), []).append((xs.mean(), ys.mean()))
        kinds.add(len(entry["objects"]))
        for sentence in entry["sentences"]:
            raw = sentence["raw"]
            assert raw[0].isupper() and raw.endswith(".")
            phrases = OBJECT_PHRASE.findall(raw.lower())
            assert {colour for _, colour, _ in phrases} == drawn_colours, raw
            assert sum(COUNT[number] for number, _, _ in phrases) == count, raw
            if count == 1:
                assert phrases[0][1] == dominant
            mentioned_bg = {word for word in BACKGROUNDS if f"{word} background" in raw}
            assert mentioned_bg <= {background}, raw
            relation = re.match(
                rf"an? ({COLOR_WORDS}) \w+ (to the left of|above|below|under) an? ({COLOR_WORDS})", raw.lower()
            )
            if relation and relation.group(1) != relation.group(3) and count == 2:
                (x1, y1), (x2, y2) = centres[relation.group(1)][0], centres[relation.group(3)][0]
                if relation.group(2) == "to the left of":
                    assert x1 < x2, raw
                elif relation.group(2) == "above":
                    assert y1 < y2, raw
                else:
                    assert y1 > y2, raw
            assert set(sentence["tokens"]) <= set(VOCABULARY)
        assert len({s["raw"] for s in entry["sentences"]}) == 5  # five different references
    assert kinds == {1, 2, 3}


def test_scene_metadata_matches_rendering():
    png, scene, captions, boxes = generate_example(seed=5, index=3, image_size=96)
    image = Image.open(__import__("io").BytesIO(png))
    assert image.mode == "P" and image.size == (96, 96)
    canvas, again = render_scene(scene, 96)
    assert again == boxes
    assert np.array_equal(np.asarray(image.convert("RGB")), np.asarray(PALETTE, dtype=np.uint8)[canvas])
    assert len(captions) == 5


def test_split_sizes_and_arguments(tmp_path):
    assert split_sizes(2000) == {"train": 1600, "val": 200, "test": 200}
    assert split_sizes(5) == {"train": 3, "val": 1, "test": 1}
    assert split_sizes(1) == {"train": 1, "val": 0, "test": 0}
    data = json.loads(make_synthetic(tmp_path / "x", num_images=21, seed=0).read_text())
    assert [e["split"] for e in data["images"]] == ["train"] * 17 + ["val"] * 2 + ["test"] * 2
    assert data["dataset"] == "itune-synthetic" and data["generator"]["seed"] == 0
    with pytest.raises(ValueError, match="num_images must be at least 1"):
        make_synthetic(tmp_path / "y", num_images=0)
    with pytest.raises(ValueError, match="image_size must be at least 24"):
        make_synthetic(tmp_path / "y", image_size=8)
    assert not (tmp_path / "y").exists()


def test_two_thousand_images_take_seconds(tmp_path):
    started = time.perf_counter()
    dataset_json = make_synthetic(tmp_path / "big", num_images=2000)
    elapsed = time.perf_counter() - started
    assert len(list((dataset_json.parent / "images").iterdir())) == 2000
    assert elapsed < 30, f"2,000 images took {elapsed:.1f}s"


def test_output_directory_is_never_clobbered(tmp_path):
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("precious")
    with pytest.raises(DataError, match="not empty and is not a previous itune make-synthetic output"):
        make_synthetic(user_dir, num_images=3)
    assert [p.name for p in user_dir.iterdir()] == ["notes.txt"]
    make_synthetic(user_dir, num_images=3, overwrite=True)
    assert (user_dir / "notes.txt").read_text() == "precious" and (user_dir / "dataset.json").is_file()

    previous = make_synthetic(tmp_path / "out", num_images=6).parent
    (previous / "images" / "extra-user-file.txt").write_text("keep me")
    make_synthetic(previous, num_images=4, seed=2)  # a previous output of the same command is replaced
    assert sorted(p.name for p in (previous / "images").iterdir()) == [
        "000000.png",
        "000001.png",
        "000002.png",
        "000003.png",
        "extra-user-file.txt",
    ]
    assert json.loads((previous / "dataset.json").read_text())["generator"]["seed"] == 2
    assert not any(p.name.startswith(".out.tmp") for p in tmp_path.iterdir())

    photos_like = tmp_path / "photos"
    photos_like.mkdir()
    (photos_like / "dataset.json").write_text(json.dumps({"dataset": "itune-photos", "images": []}))
    with pytest.raises(DataError):
        make_synthetic(photos_like, num_images=2)


def _listed_images(dataset_json: Path) -> dict[str, bytes]:
    entries = json.loads(dataset_json.read_text())["images"]
    return {e["filename"]: (dataset_json.parent / e["filepath"] / e["filename"]).read_bytes() for e in entries}


@pytest.mark.slow  # in-process `itune make-synthetic` runs, one killed midway
def test_interrupted_make_synthetic_never_leaves_a_mixed_dataset_and_never_follows_a_link(tmp_path, monkeypatch):
    from itune_hf.data import _output

    out, fresh = tmp_path / "out", tmp_path / "fresh"
    args = ["make-synthetic", "--num-images", "6", "--image-size", "32"]
    assert main([*args, "--output-dir", str(out), "--seed", "0"]) == 0
    old = _listed_images(out / "dataset.json")
    assert main([*args, "--output-dir", str(fresh), "--seed", "1"]) == 0
    new = _listed_images(fresh / "dataset.json")
    assert old != new

    real_replace, calls = os.replace, []

    def killed_midway(src, dst):
        calls.append(dst)
        if len(calls) == 4:  # the marker and two new images are in: killed before the third
            raise KeyboardInterrupt("killed")
        return real_replace(src, dst)

    monkeypatch.setattr(_output.os, "replace", killed_midway)
    assert (
        main([*args, "--output-dir", str(out), "--seed", "1"]) == 130
    )  # the kill, as `itune` reports an interrupt: one line, exit 130
    monkeypatch.setattr(_output.os, "replace", real_replace)
    assert not (out / "dataset.json").exists()  # no index that lists half of the new images
    assert main([*args, "--output-dir", str(out), "--seed", "1"]) == 0  # a rerun completes it
    assert _listed_images(out / "dataset.json") == new and not (out / ".dataset.json.replacing").exists()

    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(out / "images")
    (out / "images").symlink_to(outside)
    with pytest.raises(ValueError, match="images is a symbolic link"):
        make_synthetic(out, num_images=6, seed=2, image_size=32)
    assert not any(outside.iterdir())
