"""Precomputed region features (`RegionFeatures`): `.npz` directories and bottom-up-attention `.tsv` files give the
same padded batches, ids match loosely, errors name the file, the image and the field, and XGPT takes the batches."""

from __future__ import annotations

import base64
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from itune_hf.data import DataFormatError, RegionFeatures
from itune_hf.data.regions import LXMERT_TSV_FIELDS

D = 6
#: image id -> (width, height, number of regions)
IMAGES = {"101": (200, 100, 3), "102": (50, 80, 5), "103": (64, 64, 2)}


def regions_of(image_id: str, d: int = D) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Deterministic features (N, d) and pixel boxes (N, 4) inside the image."""
    width, height, count = IMAGES[image_id]
    rng = np.random.default_rng(int(image_id))
    corners = rng.uniform(0, 1, (count, 4))
    x1, x2 = np.sort(corners[:, [0, 2]], axis=1).T * width
    y1, y2 = np.sort(corners[:, [1, 3]], axis=1).T * height
    boxes = np.stack([x1, y1, x2, y2], axis=1).astype(np.float32)
    return rng.normal(size=(count, d)).astype(np.float32), boxes, width, height


def write_npz_dir(directory: Path, d: int = D) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for image_id in IMAGES:
        features, boxes, width, height = regions_of(image_id, d)
        np.savez(directory / f"{image_id}.npz", features=features, boxes=boxes, image_w=width, image_h=height)
    return directory


def b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode()


def tsv_line(image_id: str, d: int = D) -> str:
    features, boxes, width, height = regions_of(image_id, d)
    return "\t".join([image_id, str(width), str(height), str(len(boxes)), b64(boxes), b64(features)]) + "\n"


def write_tsv(path: Path, lines: list[str] | None = None) -> Path:
    path.write_text("".join(lines if lines is not None else [tsv_line(i) for i in IMAGES]))
    return path


@pytest.fixture(params=["npz", "tsv"])
def reader_path(request, tmp_path) -> Path:
    if request.param == "npz":
        return write_npz_dir(tmp_path / "npz")
    return write_tsv(tmp_path / "features.tsv")


def test_get_pads_masks_and_normalises(reader_path):
    regions = RegionFeatures(reader_path)
    assert sorted(regions.image_ids()) == sorted(IMAGES) and len(regions) == 3 and regions.feature_size == D
    batch = regions.get(["101", "102", "103"])
    assert set(batch) == {"region_features", "region_boxes", "region_mask"}
    assert batch["region_features"].shape == (3, 5, D) and batch["region_features"].dtype == torch.float32
    assert batch["region_boxes"].shape == (3, 5, 4) and batch["region_mask"].dtype == torch.bool
    assert batch["region_mask"].sum(dim=1).tolist() == [3, 5, 2]
    for row, image_id in enumerate(["101", "102", "103"]):
        features, boxes, width, height = regions_of(image_id)
        n = len(features)
        assert torch.equal(batch["region_features"][row, :n], torch.from_numpy(features))
        expected = boxes / np.array([width, height, width, height], dtype=np.float32)
        assert torch.allclose(batch["region_boxes"][row, :n], torch.from_numpy(expected))
        assert not batch["region_features"][row, n:].any() and not batch["region_boxes"][row, n:].any()
    assert ((batch["region_boxes"] >= 0) & (batch["region_boxes"] <= 1)).all()
    single = regions.get(102)  # an int id, a batch of one
    assert single["region_features"].shape == (1, 5, D) and single["region_mask"].all()


def test_max_regions_keeps_the_first_ones(reader_path):
    regions = RegionFeatures(reader_path, max_regions=4)
    batch = regions.get(["102", "103"])
    assert batch["region_features"].shape == (2, 4, D) and batch["region_mask"].sum(dim=1).tolist() == [4, 2]
    assert torch.equal(batch["region_features"][0], torch.from_numpy(regions_of("102")[0][:4]))
    assert RegionFeatures(reader_path, max_regions=None).get(["102"])["region_features"].shape == (1, 5, D)
    with pytest.raises(ValueError, match="max_regions must be at least 1"):
        RegionFeatures(reader_path, max_regions=0)


CONFIDENCES = np.array([0.3, 0.9, 0.1, 0.9, 0.5], dtype=np.float32)  # image 102's 5 regions


def lxmert_line(image_id: str, confidences: np.ndarray) -> str:
    features, boxes, width, height = regions_of(image_id)
    ints = base64.b64encode(np.zeros(len(boxes), np.int64).tobytes()).decode()
    fields = [image_id, str(height), str(width), ints, b64(confidences), ints, ints, str(len(boxes))]
    return "\t".join([*fields, b64(boxes), b64(features)]) + "\n"


@pytest.mark.parametrize("layout", ["npz", "tsv"])
def test_max_regions_keeps_the_most_confident_in_the_file_order(tmp_path, layout):
    features, boxes, width, height = regions_of("102")
    if layout == "npz":
        (tmp_path / "npz").mkdir()
        np.savez(tmp_path / "npz" / "102.npz", x=features, bbox=boxes, image_w=width, image_h=height,
                 objects_conf=CONFIDENCES)  # fmt: skip
        path, options = tmp_path / "npz", {}
    else:
        path = write_tsv(tmp_path / "lxmert.tsv", [lxmert_line("102", CONFIDENCES)])
        options = {"tsv_fields": LXMERT_TSV_FIELDS}
    kept = np.sort(np.argsort(-CONFIDENCES, kind="stable")[:3])  # the 3 most confident: rows 1, 3 and 4
    assert kept.tolist() == [1, 3, 4]
    batch = RegionFeatures(path, max_regions=3, **options).get(["102"])
    assert torch.equal(batch["region_features"][0], torch.from_numpy(features[kept]))
    expected_boxes = boxes[kept] / np.array([width, height, width, height], dtype=np.float32)
    assert torch.allclose(batch["region_boxes"][0], torch.from_numpy(expected_boxes))
    # a tie at the cut goes to the earlier region: of the two 0.9s, row 1
    assert torch.equal(
        RegionFeatures(path, max_regions=1, **options).get(["102"])["region_features"][0],
        torch.from_numpy(features[[1]]),
    )
    assert RegionFeatures(path, max_regions=5, **options).get(["102"])["region_features"].shape == (1, 5, D)


def test_confidences_of_the_wrong_shape_are_refused_when_they_decide(tmp_path):
    features, boxes, width, height = regions_of("102")
    np.savez(tmp_path / "102.npz", x=features, bbox=boxes, image_w=width, image_h=height, scores=np.ones((5, 3)))
    assert RegionFeatures(tmp_path).get(["102"])["region_features"].shape == (1, 5, D)  # nothing to choose
    with pytest.raises(DataFormatError, match=r"102.npz \(image 102\): field 'confidences' has shape \(5, 3\)"):
        RegionFeatures(tmp_path, max_regions=2).get(["102"])


def test_ids_describe_and_missing_images(reader_path):
    regions = RegionFeatures(reader_path)
    assert "101" in regions and 101 in regions and "000101" in regions and "104" not in regions
    assert regions.describe() == (
        f"bottom-up region features from {reader_path} ({D}-d, up to 100 regions, 3 images, .{regions.kind})"
    )
    with pytest.raises(KeyError, match=r"no region features for image id '104'"):
        regions.get(["101", "104"])
    restored = pickle.loads(pickle.dumps(regions))  # DataLoader workers may receive a pickled reader
    assert torch.equal(restored.get(["103"])["region_features"], regions.get(["103"])["region_features"])


def test_npz_key_variants_and_coco_file_names(tmp_path):
    """bottom-up-attention.pytorch's keys (x, bbox, num_bbox, image_h/w, a pickled info) and COCO image names."""
    directory = tmp_path / "milvlg"
    directory.mkdir()
    features, boxes, width, height = regions_of("102")
    padded = np.concatenate([features, np.zeros((2, D), np.float32)])  # 2 padding rows beyond num_bbox
    padded_boxes = np.concatenate([boxes, np.zeros((2, 4), np.float32)])
    info = np.array([{"objects": [1, 2]}], dtype=object)
    np.savez(
        directory / "COCO_val2014_000000000042.npz",
        x=padded,
        bbox=padded_boxes,
        num_bbox=len(features),
        image_w=np.array([width]),
        image_h=height,
        info=info,
    )
    regions = RegionFeatures(directory)
    assert regions.image_ids() == ["COCO_val2014_000000000042"] and 42 in regions and "42" in regions
    batch = regions.get(["42"])
    assert batch["region_mask"].sum() == len(features) and torch.equal(
        batch["region_features"][0], torch.from_numpy(features)
    )


def test_normalised_boxes_without_image_size(tmp_path):
    directory = tmp_path / "normalised"
    directory.mkdir()
    features = np.ones((2, D), np.float32)
    np.savez(directory / "7.npz", feat=features, boxes=np.array([[0, 0, 0.5, 0.5], [0.25, 0.5, 1, 1]]))
    with pytest.raises(DataFormatError, match=r"7.npz \(image 7\): no image size .* pass normalised_boxes=True"):
        RegionFeatures(directory).get(["7"])
    batch = RegionFeatures(directory, normalised_boxes=True).get(["7"])
    assert batch["region_boxes"][0].tolist() == [[0, 0, 0.5, 0.5], [0.25, 0.5, 1, 1]]


def npz_error(tmp_path: Path, **arrays) -> str:
    directory = tmp_path / "bad"
    directory.mkdir(exist_ok=True)
    for stale in directory.iterdir():
        stale.unlink()
    np.savez(directory / "5.npz", **arrays)
    with pytest.raises(DataFormatError) as error:
        RegionFeatures(directory).get(["5"])
    return str(error.value)


def test_npz_errors_name_the_file_the_image_and_the_field(tmp_path):
    features, boxes = np.ones((2, D), np.float32), np.array([[0, 0, 10, 10], [5, 5, 20, 20]], np.float32)
    size = {"image_w": 20, "image_h": 20}
    message = npz_error(tmp_path, feats=features, bbox=boxes[:, :3], **size)
    assert "5.npz (image 5): field 'boxes' has shape (2, 3); expected (2, 4)" in message
    message = npz_error(tmp_path, boxes=boxes, **size)
    assert "5.npz (image 5): no features array (keys features, feat, feats, x)" in message and "'boxes'" in message
    message = npz_error(tmp_path, features=features, boxes=boxes * 2, **size)  # x2 = 40 > 20
    assert "5.npz (image 5): field 'boxes' row 1 [10.0, 10.0, 40.0, 40.0] is not x1 <= x2" in message
    assert "inside the 20 x 20 image" in message
    message = npz_error(tmp_path, features=features, boxes=boxes[:, [2, 1, 0, 3]], **size)  # x2 < x1
    assert "field 'boxes' row 0" in message
    message = npz_error(tmp_path, features=features[0], boxes=boxes, **size)
    assert "field 'features' has shape (6,); expected (regions, D)" in message
    message = npz_error(tmp_path, features=features[:0], boxes=boxes[:0], **size)
    assert "has no regions" in message
    message = npz_error(tmp_path, features=features, boxes=boxes, num_boxes=3, **size)
    assert "field 'num_boxes' is 3, but there are 2 rows" in message
    nan = features.copy()
    nan[1, 2] = np.nan  # would train NaN weights (captions "!!!") and exit 0
    message = npz_error(tmp_path, features=nan, boxes=boxes, **size)
    assert "5.npz (image 5): field 'features' holds NaN or infinite values" in message
    message = npz_error(tmp_path, features=features, boxes=np.where(boxes == 20, np.inf, boxes), **size)
    assert "field 'boxes' holds NaN or infinite values" in message


def test_feature_width_must_agree_and_ids_must_be_unique(tmp_path):
    directory = write_npz_dir(tmp_path / "npz")
    features, boxes, width, height = regions_of("103", d=D + 1)
    np.savez(directory / "103.npz", features=features, boxes=boxes, image_w=width, image_h=height)
    regions = RegionFeatures(directory)
    with pytest.raises(DataFormatError, match=r"103.npz \(image 103\): field 'features' is 7-d, other images' are 6-d"):
        regions.get(["101", "103"])
    np.savez(directory / "0101.npz", features=features, boxes=boxes, image_w=width, image_h=height)
    with pytest.raises(DataFormatError, match=r"101.npz: image id '101' is already in .*0101.npz"):
        RegionFeatures(directory)


def test_tsv_fields_beyond_the_csv_limit_and_python3_byte_strings(tmp_path):
    """2,048-d features of 20 regions: a 218 kB base64 field, past csv's default 131,072-character limit."""
    features = np.random.default_rng(0).normal(size=(20, 2048)).astype(np.float32)
    boxes = np.tile(np.array([[0, 0, 10, 10]], np.float32), (20, 1))
    line = "\t".join(["9", "10", "10", "20", f"b'{b64(boxes)}'", b64(features)]) + "\n"
    assert len(b64(features)) > 131_072
    regions = RegionFeatures(write_tsv(tmp_path / "big.tsv", [line, "\n", "10" + line[1:]]))  # a blank line between
    assert regions.image_ids() == ["9", "10"] and regions.feature_size == 2048
    batch = regions.get(["10"])
    assert torch.equal(batch["region_features"][0], torch.from_numpy(features))
    assert batch["region_boxes"][0].tolist() == [[0, 0, 1, 1]] * 20


def test_tsv_files_in_a_directory_and_lxmert_columns(tmp_path):
    directory = tmp_path / "tsvs"
    directory.mkdir()
    write_tsv(directory / "part.tsv.0", [tsv_line("101")])
    write_tsv(directory / "part.tsv.1", [tsv_line("102"), tsv_line("103")])
    assert RegionFeatures(directory).image_ids() == ["101", "102", "103"]
    features, boxes, width, height = regions_of("101")
    ints = base64.b64encode(np.zeros(len(boxes), np.int64).tobytes()).decode()
    fields = ["COCO_val2014_000000000101", str(height), str(width), ints, ints, ints, ints, str(len(boxes))]
    lxmert = write_tsv(tmp_path / "lxmert.tsv", ["\t".join([*fields, b64(boxes), b64(features)]) + "\n"])
    batch = RegionFeatures(lxmert, tsv_fields=LXMERT_TSV_FIELDS).get([101])
    assert torch.allclose(batch["region_boxes"][0], torch.from_numpy(boxes / [width, height, width, height]).float())


def test_tsv_errors_name_the_file_the_image_and_the_field(tmp_path):
    good = tsv_line("101")
    wrong_count = good.replace("\t3\t", "\t4\t", 1)  # num_boxes 4, but 3 boxes were written
    bad_base64 = "\t".join(good.split("\t")[:5] + ["not base64!\n"])
    short = "\t".join(good.split("\t")[:4]) + "\n"
    for line, expected in [
        (
            wrong_count,
            r"bad.tsv \(image 101, byte 0\): field 'features' holds 18 floats, not a multiple of num_boxes=4",
        ),
        (bad_base64, r"bad.tsv \(image 101, byte 0\): field 'features' is not base64 of float32 values"),
        (short, r"bad.tsv \(image 101, byte 0\): 4 tab-separated columns, expected 6"),
    ]:
        regions = RegionFeatures(write_tsv(tmp_path / "bad.tsv", [line]))
        with pytest.raises(DataFormatError, match=expected):
            regions.get(["101"])
    with pytest.raises(DataFormatError, match=r"bad.tsv line 2: image id '101' is already in .*bad.tsv line 1"):
        RegionFeatures(write_tsv(tmp_path / "bad.tsv", [good, good]))
    with pytest.raises(FileNotFoundError, match="no such region feature file"):
        RegionFeatures(tmp_path / "nothing")


def test_xgpt_takes_the_batches(reader_path):
    """The xgpt-tiny-random preset, reading precomputed regions of the reader's width: a loss and captions."""
    from itune_hf.models.xgpt import XGPTConfig, XGPTForCaptioning
    from itune_hf.presets import get_preset

    regions = RegionFeatures(reader_path)
    settings = {**get_preset("xgpt-tiny-random").settings, "visual_source": "regions"}
    config = XGPTConfig(**settings, region_feature_size=regions.feature_size)
    torch.manual_seed(0)
    model = XGPTForCaptioning(config).eval()
    batch = regions.get(["101", "102", "103"])
    labels = torch.randint(0, 1000, (3, 7))
    output = model(**batch, labels=labels)
    assert output.logits.shape[:2] == (3, 7) and torch.isfinite(output.loss)
    generated = model.generate(**batch, max_new_tokens=4, num_beams=2)
    assert generated.shape[0] == 3 and generated.shape[1] <= 5
    alone = model.generate(**regions.get(["103"]), max_new_tokens=4, num_beams=2)
    assert torch.equal(alone[0, : generated.shape[1]], generated[2, : alone.shape[1]])  # padding changes nothing


def test_reading_ids_and_describing_needs_no_torch(tmp_path):
    """Cards and commands may describe the regions without torch: only `get` imports it."""
    directory = write_npz_dir(tmp_path / "npz")
    script = (
        "import json, sys\n"
        "from itune_hf.data import RegionFeatures\n"
        f"regions = RegionFeatures({str(directory)!r})\n"
        "regions.describe(), regions.read('101'), regions.image_ids()\n"
        "print(json.dumps([name for name in ('torch', 'transformers', 'datasets') if name in sys.modules]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
