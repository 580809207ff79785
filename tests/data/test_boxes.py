"""Object boxes in the datasets: the synthetic world's `boxes` column, COCO instance boxes (`instances=`), Visual
Genome boxes normalised, all as normalised x1, y1, x2, y2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset, DatasetDict
from PIL import Image

from itune_hf.data import (
    WHOLE_IMAGE_BOX,
    DataFormatError,
    load_captions,
    load_coco_captions,
    load_karpathy,
    load_visual_genome,
    make_synthetic,
    normalise_xywh,
    read_instance_boxes,
)
from itune_hf.data.boxes import boxes_feature
from itune_hf.data.synthetic import COLORS


def write_png(path: Path, size=(16, 16), colour=(200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def entry(filename: str, split: str = "train", **extra) -> dict:
    return {"filepath": "imgs", "filename": filename, "split": split, "sentences": [{"raw": "a thing"}], **extra}


def test_synthetic_boxes_enclose_each_drawn_object(tmp_path):
    dataset_json = make_synthetic(tmp_path / "syn", num_images=40, seed=5, image_size=64)
    entries = {e["filename"]: e for e in json.loads(dataset_json.read_text())["images"]}
    data = load_captions(tmp_path / "syn")
    assert all(part.features["boxes"] == data["train"].features["boxes"] for part in data.values())
    checked = 0
    for part in data.values():
        for row in part:
            objects = entries[Path(row["image_path"]).name]["objects"]
            assert len(row["boxes"]) == len(objects) >= 1
            pixels = np.asarray(Image.open(row["image_path"]).convert("RGB"))
            for box, obj in zip(row["boxes"], objects):
                assert all(0.0 <= value <= 1.0 for value in box)
                x1, y1, x2, y2 = (round(value * 64) for value in box)
                assert [x1, y1, x2, y2] == obj["bbox"] and np.allclose(np.array(box) * 64, obj["bbox"])
                inside = (pixels[y1:y2, x1:x2] == COLORS[obj["color"]]).all(axis=-1)
                # the object's colour touches all four sides of its box (a tight box) ...
                assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
                # ... and, when no other object has its colour, every pixel of that colour lies inside it
                if sum(o["color"] == obj["color"] for o in objects) == 1:
                    assert (pixels == COLORS[obj["color"]]).all(axis=-1).sum() == inside.sum() > 0
                checked += 1
    assert checked >= 60
    one = load_karpathy(dataset_json, split="test")
    assert isinstance(one, Dataset) and one.features["boxes"] == data["test"].features["boxes"]


def test_files_without_objects_have_no_boxes_column(tmp_path):
    write_png(tmp_path / "imgs" / "a.png")
    path = write_json(tmp_path / "dataset.json", {"images": [entry("a.png")]})
    assert "boxes" not in load_captions(path, split="train").column_names


def test_object_boxes_sizes_from_entry_header_and_errors(tmp_path):
    write_png(tmp_path / "imgs" / "a.png", size=(20, 10))
    write_png(tmp_path / "imgs" / "b.png", size=(40, 20))
    write_png(tmp_path / "imgs" / "c.png")
    images = [
        entry("a.png", objects=[{"bbox": [0, 0, 10, 5]}, {"bbox": [10, 5, 20, 10]}]),  # size from the image header
        entry("b.png", "val", width=80, height=40, objects=[{"bbox": [8, 4, 40, 20]}]),  # the entry's size wins
        entry("c.png", "test"),  # no objects: an empty list, same column in every split
    ]
    data = load_captions(write_json(tmp_path / "dataset.json", {"images": images}))
    assert isinstance(data, DatasetDict) and len({str(part.features["boxes"]) for part in data.values()}) == 1
    assert data["train"][0]["boxes"] == [[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0]]
    assert np.allclose(data["val"][0]["boxes"], [[0.1, 0.1, 0.5, 0.5]])
    assert data["test"][0]["boxes"] == []
    images[0]["objects"][1]["bbox"] = [10, 5, 21, 10]  # 1 pixel past the 20-pixel-wide image
    with pytest.raises(DataFormatError, match=r"dataset.json: image a field 'objects': box 1 .* outside the 20x10"):
        load_captions(write_json(tmp_path / "dataset.json", {"images": images}))
    images[0]["objects"][1]["bbox"] = [10, 5, 20]
    with pytest.raises(DataFormatError, match=r"images\[0\]: objects\[1\] field 'bbox': .*not four"):
        load_captions(write_json(tmp_path / "dataset.json", {"images": images}))


def instances_json(tmp_path: Path, name: str, images: list[tuple[int, int, int]], boxes: dict[int, list]) -> Path:
    """A COCO instances file: `images` as (id, width, height), `boxes` image id -> [x, y, w, h] boxes."""
    annotations = [
        {"id": 100 * image_id + k, "image_id": image_id, "bbox": box, "category_id": 1, "iscrowd": 0}
        for image_id, image_boxes in boxes.items()
        for k, box in enumerate(image_boxes)
    ]
    data = {
        "images": [{"id": i, "width": w, "height": h, "file_name": f"{i}.jpg"} for i, w, h in images],
        "annotations": annotations,
        "categories": [{"id": 1, "name": "thing"}],
    }
    return write_json(tmp_path / name, data)


def test_coco_instances_give_karpathy_boxes(tmp_path):
    for name in ("a.png", "b.png", "c.png"):
        write_png(tmp_path / "imgs" / name)
    images = [entry("a.png", cocoid=1), entry("b.png", "test", cocoid=2), entry("c.png", "test", cocoid=3)]
    karpathy = write_json(tmp_path / "dataset_coco.json", {"images": images})
    train = instances_json(tmp_path, "instances_train2014.json", [(1, 200, 100)], {1: [[20, 10, 100, 50]]})
    val = instances_json(
        tmp_path, "instances_val2014.json", [(2, 100, 100), (3, 50, 50)], {2: [[0, 0, 10, 10], [90, 90, 10.4, 10]]}
    )
    data = load_captions(karpathy, instances=[train, val], check_counts=False)
    assert np.allclose(data["train"][0]["boxes"], [[0.1, 0.1, 0.6, 0.6]])
    assert np.allclose(data["test"][0]["boxes"], [[0, 0, 0.1, 0.1], [0.9, 0.9, 1.0, 1.0]])  # overhang clipped
    assert data["test"][1]["boxes"] == []  # an image without annotations
    assert data["test"].features["boxes"] == data["train"].features["boxes"]
    test = load_karpathy(karpathy, split="test", instances=val, check_counts=False)  # the split's images suffice
    assert len(test) == 2
    with pytest.raises(DataFormatError, match=r"1 of 3 images are not in the instances file\(s\) .*ids 1\)"):
        load_captions(karpathy, instances=val, check_counts=False)


def test_coco_instances_give_coco_style_boxes_and_errors(tmp_path):
    write_png(tmp_path / "7.jpg")
    captions = write_json(
        tmp_path / "captions_val.json",
        {"images": [{"id": 7, "file_name": "7.jpg"}], "annotations": [{"image_id": 7, "caption": "a cat"}]},
    )
    instances = instances_json(tmp_path, "instances.json", [(7, 40, 20)], {7: [[4, 2, 36, 18]]})
    for dataset in (
        load_coco_captions(captions, instances=instances),
        load_captions(captions, split="val", instances=instances),
    ):
        assert np.allclose(dataset[0]["boxes"], [[0.1, 0.1, 1.0, 1.0]]) and dataset[0]["captions"] == ["a cat"]
    assert "boxes" not in load_coco_captions(captions).column_names
    broken = instances_json(tmp_path, "broken.json", [(7, 40, 20)], {7: [[4, 2, -1, 18]]})
    with pytest.raises(DataFormatError, match=r"broken.json: annotations\[0\] \(image 7\): field 'bbox'"):
        read_instance_boxes(broken)
    with pytest.raises(DataFormatError, match=r"instances.json: image id 7 is also in .*instances.json"):
        read_instance_boxes([instances, instances])
    write_json(tmp_path / "nosize.json", {"images": [{"id": 7}], "annotations": []})
    with pytest.raises(DataFormatError, match=r"nosize.json: images\[0\]: field 'width' is missing"):
        read_instance_boxes(tmp_path / "nosize.json")


def test_visual_genome_boxes_are_normalised_by_the_image_size(tmp_path):
    write_png(tmp_path / "vg" / "VG_100K" / "1.jpg", size=(200, 100))
    write_png(tmp_path / "vg" / "VG_100K" / "2.jpg", size=(50, 50))
    regions = [
        {
            "id": 1,
            "regions": [
                {"phrase": "a man", "x": 20, "y": 10, "width": 100, "height": 50},
                {"phrase": "a horse", "x": 150, "y": 80, "width": 100, "height": 30},  # overhangs: clipped
                {"phrase": "a day"},  # no coordinates: the whole image
            ],
        },
        {"id": 2, "regions": [{"phrase": "a dog", "x": 5, "y": 10, "width": 20, "height": 40}]},
    ]
    regions_json = write_json(tmp_path / "vg" / "region_descriptions.json", regions)
    rows = load_captions(regions_json, check_counts=False)["train"]
    expected = [[0.1, 0.1, 0.6, 0.6], [0.75, 0.8, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]
    assert np.allclose(rows[0]["boxes"], expected) and len(rows[0]["boxes"]) == len(rows[0]["captions"])
    assert np.allclose(rows[1]["boxes"], [[0.1, 0.2, 0.5, 1.0]])  # sizes read from each image's header
    assert rows.features["boxes"] == boxes_feature()  # as every loader's

    image_data = [  # image_data.json's sizes are used instead of the headers (its files are half the size here)
        {"image_id": i, "url": f"https://x/VG_100K/{i}.jpg", "width": w, "height": h}
        for i, w, h in ((1, 400, 200), (2, 100, 100))
    ]
    write_json(tmp_path / "vg" / "image_data.json", image_data)
    sized = load_visual_genome(regions_json, image_data_json=tmp_path / "vg" / "image_data.json", check_counts=False)
    assert np.allclose(sized[0]["boxes"][0], [0.05, 0.05, 0.3, 0.3]) and np.allclose(
        sized[1]["boxes"], [[0.05, 0.1, 0.25, 0.5]]
    )
    assert normalise_xywh([], 10, 10) == []
    with pytest.raises(ValueError, match="negative width"):
        normalise_xywh([[0, 0, -1, 2]], 10, 10)
    for region, message in (
        ({"x": 0, "y": 0, "width": -1, "height": 2}, "its box .* has a negative width or height"),
        ({"x": 0, "y": 0, "width": "wide", "height": 2}, "its x, y, width, height is .*, not four numbers"),
        ({"x": 0, "y": 0, "width": 4}, "field height missing"),
    ):
        (tmp_path / "bad").mkdir(exist_ok=True)
        bad = write_json(
            tmp_path / "bad" / "region_descriptions.json", [{"id": 1, "regions": [{"phrase": "a", **region}]}]
        )
        with pytest.raises(DataFormatError, match=rf"region_descriptions.json: \[0\]: regions\[0\]: {message}"):
            load_captions(bad, check_counts=False)


def test_boxes_columns_feed_the_xgpt_processor_and_a_boxes_model(tmp_path):
    """visual_source="boxes": the processor pools patch tokens in a row's boxes (an image without boxes: the whole
    image)."""
    from itune_hf.presets import build_model, build_processor

    make_synthetic(tmp_path / "syn", num_images=10, seed=2)
    rows = load_captions(tmp_path / "syn", split="train")[:3]
    boxes = [image_boxes or [WHOLE_IMAGE_BOX] for image_boxes in [*rows["boxes"][:2], []]]
    processor, model = build_processor("xgpt-tiny-random"), build_model("xgpt-tiny-random", visual_source="boxes")
    inputs = processor(images=rows["image_path"], boxes=boxes, captions=[c[0] for c in rows["captions"]])
    counts = [len(image_boxes) for image_boxes in boxes]
    assert inputs["region_boxes"].shape == (3, max(counts), 4) and inputs["region_mask"].sum(1).tolist() == counts
    assert torch.isfinite(model(**inputs).loss)
    prompts = processor(images=rows["image_path"], boxes=boxes)
    assert model.eval().generate(**prompts, max_new_tokens=3).shape[0] == 3
