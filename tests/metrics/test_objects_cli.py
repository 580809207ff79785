"""The scene metric and the shuffled control through the CLI, as users run them: `itune eval --shuffled-control` on a
generated world, and `itune score --dataset`."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from itune_hf.cli import main
from itune_hf.data import load_captions, make_synthetic
from itune_hf.data.scenes import read_scenes
from itune_hf.evaluation import derangement
from itune_hf.metrics import score_captions

from conftest import train_tiny_adapter


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_synthetic(tmp_path_factory.mktemp("objects-world") / "data", num_images=40, seed=5, image_size=32)


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    return train_tiny_adapter(world, tmp_path_factory.mktemp("objects-model") / "adapter", steps=4)


def run(capsys, *args) -> tuple[int, dict]:
    code = main([str(a) for a in args])
    out = capsys.readouterr().out
    return code, json.loads(out.strip().splitlines()[-1])


def test_derangement_moves_every_image():
    for count in (2, 3, 10, 101):
        order = derangement(count, seed=0)
        assert sorted(order) == list(range(count)) and all(order[i] != i for i in range(count))
    assert derangement(10, seed=0) == derangement(10, seed=0) != derangement(10, seed=1)
    with pytest.raises(ValueError, match="at least 2 items; got 1"):
        derangement(1)


def test_eval_reports_objects_and_the_shuffled_control(world, trained, tmp_path, capsys):
    out = tmp_path / "eval"
    code, printed = run(
        capsys, "eval", "--model", trained, "--data", world, "--split", "test", "--num-beams", 1,
        "--max-new-tokens", 6, "--metrics", "CIDEr,Objects", "--shuffled-control", "--output-dir", out,
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "metrics.json").read_text())
    assert report["scores"] == printed
    test = load_captions(str(world), split="test")
    captions = {r["image_id"]: r["caption"] for r in json.loads((out / "results.json").read_text())}
    references = dict(zip(test["image_id"], test["captions"]))
    scenes = read_scenes(world)
    expected = score_captions(captions, references, metrics=["CIDEr", "Objects"], scenes=scenes)
    assert printed["Object_F1"] == pytest.approx(expected["Object_F1"]) and printed["CIDEr"] == expected["CIDEr"]

    # the control: image i's caption against image order[i]'s references and scene
    ids = list(captions)
    other = [ids[k] for k in derangement(len(ids), seed=report["shuffled_control"]["derangement_seed"])]
    moved = score_captions(
        captions,
        {key: references[o] for key, o in zip(ids, other)},
        metrics=["CIDEr", "Objects"],
        scenes={key: scenes[o] for key, o in zip(ids, other)},
    )
    control = report["shuffled_control"]
    assert control["scores"]["CIDEr"] == pytest.approx(moved["CIDEr"])
    assert printed["CIDEr (shuffled)"] == pytest.approx(moved["CIDEr"])
    assert printed["CIDEr drop"] == pytest.approx(expected["CIDEr"] - moved["CIDEr"])
    assert printed["Object_F1 drop"] == pytest.approx(expected["Object_F1"] - moved["Object_F1"])
    assert set(control["drop"]) >= {"CIDEr", "Object_P", "Object_F1", "Exact_scene"}

    # `itune score --dataset` on the written results agrees, and takes the references from the dataset
    code, scored = run(capsys, "score", out / "results.json", "--dataset", world, "--metrics", "CIDEr,objects")
    assert code == 0 and scored["CIDEr"] == pytest.approx(printed["CIDEr"])
    assert scored["Object_F1"] == pytest.approx(printed["Object_F1"])


def test_eval_adds_objects_by_default_only_where_the_data_records_scenes(world, tmp_path):
    from itune_hf.commands.eval import _metrics_and_scenes

    metrics, scenes = _metrics_and_scenes(argparse.Namespace(metrics=None, data=str(world), instances=None))
    assert metrics[-2:] == ("Objects", "CHAIR") and len(scenes) == 40
    real = tmp_path / "real.json"
    data = json.loads(world.read_text())
    data.pop("dataset")  # any Karpathy file that is not a generated world
    real.write_text(json.dumps(data))
    metrics, scenes = _metrics_and_scenes(argparse.Namespace(metrics=None, data=str(real), instances=None))
    assert "Objects" not in metrics and "CHAIR" not in metrics and scenes == {}
    chosen = _metrics_and_scenes(argparse.Namespace(metrics="cider", data=str(world), instances=None))
    assert chosen == (("CIDEr",), None)


def test_score_without_recorded_scenes_reports_objects_unavailable(world, tmp_path, capsys):
    data = json.loads(world.read_text())
    for entry in data["images"]:
        del entry["objects"], entry["relations"]
    (tmp_path / "images").symlink_to(world.parent / "images")
    real = tmp_path / "dataset.json"
    real.write_text(json.dumps(data))
    test = [e for e in data["images"] if e["split"] == "test"]
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps([{"image_id": e["filename"][:-4], "caption": "A red circle."} for e in test]))
    code, scores = run(capsys, "score", predictions, "--dataset", real, "--metrics", "cider,objects")
    assert code == 0 and isinstance(scores["CIDEr"], float) and not math.isnan(scores["CIDEr"])
    assert scores["Object_F1"] == f"unavailable: {len(test)} of {len(test)} images have no recorded scene " + (
        f"(e.g. {test[0]['filename'][:-4]!r}, {test[1]['filename'][:-4]!r}, {test[2]['filename'][:-4]!r}, ...)"
    )


def test_a_metric_with_no_value_is_standard_json_null(world, tmp_path, capsys):
    test = [e for e in json.loads(world.read_text())["images"] if e["split"] == "test"]
    predictions = tmp_path / "predictions.json"  # states no relation: Relation_acc has no value
    predictions.write_text(json.dumps([{"image_id": e["filename"][:-4], "caption": "A red circle."} for e in test]))
    assert main(["score", str(predictions), "--dataset", str(world), "--metrics", "cider,objects"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant} in {printed}")

    scores = json.loads(printed, parse_constant=refuse)
    assert scores["Relation_acc"] is None and isinstance(scores["Object_F1"], float)


def test_a_broken_dataset_is_an_error_naming_it(world, tmp_path, capsys):
    broken = tmp_path / "dataset.json"
    broken.write_text('{"images": [')
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps([{"image_id": "000036", "caption": "A red circle."}]))
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"annotations": [{"image_id": "000036", "caption": "A red circle."}]}))
    assert main(["score", str(predictions), str(refs), "--dataset", str(broken), "--metrics", "objects"]) == 2
    assert capsys.readouterr().err.startswith(f"itune score: error: {broken}: not a JSON file")
