"""`benchmarks/study_vision_tower_shapes.py`: its per-object patch labels agree with the rendered scenes, and a run of
a few steps writes one evaluation per `--eval-every` (the accuracies themselves mean nothing at this size)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from itune_hf.data.synthetic import SHAPES, scene_of, shape_mask

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "study_vision_tower_shapes.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("study_vision_tower_shapes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_object_patch_labels_name_the_object_covering_the_patch(study):
    labels = study.object_patch_shapes(1, 0, 12, 64, 8, min_cover=8).numpy()
    for index, row in enumerate(labels):
        objects = scene_of(1, index).objects
        drawn = np.zeros((64, 64), dtype=bool)
        for obj in objects:
            drawn |= shape_mask(obj.shape, obj.cx * 64, obj.cy * 64, obj.size * 64, 64)
        covered = drawn.reshape(8, 8, 8, 8).sum((1, 3)).reshape(-1)
        # labelled only where objects cover 8 of its 64 pixels, and wherever they cover 16 (at most two objects
        # share a patch, so one shape has 8 of them)
        assert (covered[row > 0] >= 8).all() and (row[covered >= 16] > 0).all(), index
        # and only with shapes that the scene has
        assert set(row[row > 0].tolist()) <= {SHAPES.index(o.shape) + 1 for o in objects}, index


def test_a_short_run_writes_an_evaluation_per_interval(study, tmp_path):
    out = tmp_path / "study.json"
    argv = ["--steps", "4", "--batch-size", "4", "--num-images", "16", "--eval-images", "8", "--eval-every", "2",
            "--position-lr-scale", "30", "--patch-target", "object", "--json", str(out)]  # fmt: skip
    assert study.main(argv) == 0
    rows = json.loads(out.read_text())["evaluations"]
    assert [row["step"] for row in rows] == [2, 4]
    for row in rows:
        assert set(row["accuracy"]) == set(row["chance"]) >= {"shape_0", "shape_1", "shape_2", "patch_shape"}
        assert all(0.0 <= value <= 1.0 for value in [*row["accuracy"].values(), *row["chance"].values()])
