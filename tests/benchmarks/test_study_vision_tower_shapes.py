"""`benchmarks/study_vision_tower_shapes.py`: its per-object patch labels agree with the rendered scenes, and a run of
a few steps writes one evaluation per `--eval-every` (the accuracies themselves mean nothing at this size)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from script_support import load_script

from itune_hf.data.synthetic import SHAPES, scene_of, shape_mask

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "study_vision_tower_shapes.py"


@pytest.fixture(scope="module")
def study():
    return load_script(SCRIPT)


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


@pytest.mark.parametrize("tower", ["resnet", "swin"])
def test_other_towers_give_the_same_grid_and_only_the_named_heads_train(study, tower, tmp_path):
    out = tmp_path / "study.json"
    argv = ["--steps", "2", "--batch-size", "2", "--num-images", "4", "--eval-images", "4", "--eval-every", "2",
            "--tower", tower, "--heads", "patch_shape", "--patch-target", "object", "--json", str(out)]  # fmt: skip
    assert study.main(argv) == 0
    pooled, grid = study.outputs_of(study.tower_of(tower), torch.zeros(1, 3, 64, 64))
    assert pooled.shape == (1, 128) and grid.shape == (1, 64, 128)


def test_the_loss_counts_only_the_named_heads(study):
    args = study.parse(["--heads", "count"])
    logits = {"count": torch.zeros(2, 3), "layout": torch.randn(2, 3) * 9}
    labels = {"count": torch.tensor([0, 1]), "layout": torch.tensor([2, 2])}
    assert study.loss_of(args, logits, labels).item() == pytest.approx(torch.log(torch.tensor(3.0)).item())


def test_unknown_heads_are_refused_by_name(study, capsys):
    with pytest.raises(SystemExit):
        study.parse(["--heads", "patch_shape,shapes"])
    assert "unknown ['shapes']" in capsys.readouterr().err
