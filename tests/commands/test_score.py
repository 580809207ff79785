"""`itune score PREDICTIONS.json REFERENCES.json`, run as a user runs it, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from metrics_support import coco_scores, coco_unavailable_reason

from itune_hf.cli import main
from itune_hf.metrics import FAST_METRICS, score_captions
from itune_hf.metrics.synthetic import make_corpus

ITUNE = Path(sys.executable).parent / "itune"
KEYS = ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE"]


def write_coco_files(directory: Path, num_images: int = 60, seed: int = 7) -> tuple[Path, Path, dict, dict]:
    directory.mkdir(parents=True, exist_ok=True)
    predictions, references = make_corpus(num_images, 5, seed=seed)
    pred_path = directory / "predictions.json"
    ref_path = directory / "captions_val.json"
    pred_path.write_text(json.dumps([{"image_id": k, "caption": c} for k, c in predictions.items()]))
    annotations = [
        {"image_id": k, "id": 10 * k + i, "caption": c} for k, refs in references.items() for i, c in enumerate(refs)
    ]
    ref_path.write_text(json.dumps({"images": [{"id": k} for k in references], "annotations": annotations}))
    return pred_path, ref_path, predictions, references


def start(*args: str | Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(ITUNE), "score", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


@pytest.mark.slow
def test_console_script_as_a_user_runs_it(tmp_path):
    pred_path, ref_path, predictions, references = write_coco_files(tmp_path)
    (tmp_path / "broken.json").write_text('[{"image_id": 1, "caption": "a dog"}')
    subset = [{"image_id": k, "caption": c} for k, c in predictions.items() if k >= 5] + [
        {"image_id": 1000 + k, "caption": "a dog"} for k in range(3)
    ]
    (tmp_path / "subset.json").write_text(json.dumps(subset))
    # independent runs of the console script: side by side
    runs = {
        "ok": start(pred_path, ref_path, "--per-image", tmp_path / "per_image.json"),
        "broken": start(tmp_path / "broken.json", ref_path),
        "mismatch": start(tmp_path / "subset.json", ref_path),
    }
    results = {name: finish(process) for name, process in runs.items()}

    code, out, err = results["ok"]
    assert code == 0, err
    assert len(out.strip().splitlines()) == 1
    scores = json.loads(out)
    assert list(scores) == KEYS
    assert (
        isinstance(scores["SPICE"], str)
        and scores["SPICE"].startswith("unavailable: ")
        or isinstance(scores["SPICE"], float)
    )
    assert isinstance(scores["METEOR"], float) or scores["METEOR"].startswith("unavailable: ")
    if coco_unavailable_reason() is None:  # the reference: coco-caption's own pipeline on the same captions
        expected, _ = coco_scores(predictions, references)
    else:
        expected = score_captions(predictions, references, metrics=FAST_METRICS)
    for name, value in expected.items():
        assert scores[name] == pytest.approx(value, abs=1e-9), name
    per_image = json.loads((tmp_path / "per_image.json").read_text())
    assert [row["image_id"] for row in per_image] == list(references)
    assert set(per_image[0]) >= {"image_id", "Bleu_4", "ROUGE_L", "CIDEr"}

    code, out, err = results["broken"]
    assert code == 2 and out == ""
    assert err.strip().startswith(f"itune score: error: {tmp_path / 'broken.json'}: not valid JSON")
    code, out, err = results["mismatch"]
    assert code == 2
    assert err.strip() == (
        f"itune score: error: image ids of {tmp_path / 'subset.json'} and {ref_path} differ: "
        f"3 predicted image id(s) not in {ref_path}: 1000, 1001, 1002; "
        f"5 image id(s) of {ref_path} without a prediction: 0, 1, 2, 3, 4"
    )
    assert len(err.strip().splitlines()) == 1


@pytest.fixture
def files(tmp_path):
    pred_path, ref_path, _, _ = write_coco_files(tmp_path, num_images=8)
    return tmp_path, pred_path, ref_path


def run_main(capsys, *args) -> tuple[int, str, str]:
    code = main(["score", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


PREDICTION_ERRORS = [
    ("{not json", "not valid JSON (line 1, column 2: Expecting property name enclosed in double quotes)"),
    (
        '{"image_id": 1, "caption": "x"}',
        'expected COCO results, a list of {"image_id", "caption"} objects; got an object',
    ),
    (
        '{"annotations": []}',
        'expected COCO results (a list of {"image_id", "caption"} objects), got an object with "annotations": '
        "COCO caption annotations (references), not results; were the two files swapped?",
    ),
    ('["a dog"]', 'entry 0 must be an object {"image_id", "caption"}, got a string'),
    ('[{"caption": "a dog"}]', 'entry 0 has no "image_id" field'),
    ('[{"image_id": 0}]', 'entry 0 has no "caption" field'),
    ('[{"image_id": 0, "caption": 5}]', 'entry 0: "caption" must be a string, got int'),
    ('[{"image_id": [0], "caption": "x"}]', 'entry 0: "image_id" must be a number or a string, got a list'),
    (
        '[{"image_id": 0, "caption": "a"}, {"image_id": 1, "caption": "b"}, {"image_id": 0, "caption": "c"}]',
        "duplicate prediction for image_id 0 (entries 0 and 2); give one caption per image",
    ),
    ("[]", "no predictions (the list is empty)"),
]


@pytest.mark.parametrize(("content", "problem"), PREDICTION_ERRORS)
def test_bad_predictions_file(files, capsys, content, problem):
    directory, _, ref_path = files
    bad = directory / "bad_predictions.json"
    bad.write_text(content)
    code, out, err = run_main(capsys, bad, ref_path)
    assert (code, out) == (2, "")
    assert err == f"itune score: error: {bad}: {problem}"


REFERENCE_ERRORS = [
    ("[1, 2", "not valid JSON (line 1, column 6: Expecting ',' delimiter)"),
    ("[]", 'expected COCO caption annotations, an object with an "annotations" list; got a list'),
    ('{"images": []}', 'no "annotations" field (COCO caption annotations format)'),
    ('{"annotations": {}}', '"annotations" must be a list, got an object'),
    ('{"annotations": [{"image_id": 0}]}', 'annotations[0] has no "caption" field'),
    ('{"annotations": [{"caption": "x"}]}', 'annotations[0] has no "image_id" field'),
    ('{"annotations": [{"image_id": 0, "caption": null}]}', 'annotations[0]: "caption" must be a string, got null'),
    ('{"annotations": []}', 'no captions ("annotations" is empty)'),
]


@pytest.mark.parametrize(("content", "problem"), REFERENCE_ERRORS)
def test_bad_references_file(files, capsys, content, problem):
    directory, pred_path, _ = files
    bad = directory / "bad_references.json"
    bad.write_text(content)
    code, out, err = run_main(capsys, pred_path, bad)
    assert (code, out) == (2, "")
    assert err.startswith(f"itune score: error: {bad}: {problem}")


def test_missing_file_and_unknown_metric(files, capsys):
    directory, pred_path, ref_path = files
    code, _, err = run_main(capsys, directory / "nope.json", ref_path)
    assert (code, err) == (2, f"itune score: error: {directory / 'nope.json'}: no such predictions file")
    code, _, err = run_main(capsys, pred_path, ref_path, "--metrics", "BLEU,WER")
    assert (code, err) == (
        2,
        "itune score: error: --metrics BLEU,WER: Unknown metric 'WER'; choose from BLEU, METEOR, ROUGE_L, CIDEr, "
        "SPICE, Objects, ContentWords, CHAIR, METEOR_jar",
    )


def test_metrics_and_idf_corpus_options(files, capsys):
    directory, pred_path, ref_path = files
    code, out, _ = run_main(capsys, pred_path, ref_path, "--metrics", "cider,bleu")
    assert code == 0
    scores = json.loads(out)
    assert list(scores) == ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"]
    # document frequencies from another corpus (a "training set") change CIDEr-D, and only CIDEr-D
    _, train_path, _, train = write_coco_files(directory / "train", num_images=50, seed=8)
    code, out, _ = run_main(capsys, pred_path, ref_path, "--metrics", "cider,bleu", "--idf-corpus", train_path)
    assert code == 0
    with_idf = json.loads(out)
    assert with_idf["Bleu_4"] == scores["Bleu_4"]
    assert with_idf["CIDEr"] != scores["CIDEr"]
    predictions = {entry["image_id"]: entry["caption"] for entry in json.loads(pred_path.read_text())}
    references: dict = {}
    for entry in json.loads(ref_path.read_text())["annotations"]:
        references.setdefault(entry["image_id"], []).append(entry["caption"])
    expected = score_captions(predictions, references, metrics=["CIDEr"], idf_corpus=train)
    assert with_idf["CIDEr"] == pytest.approx(expected["CIDEr"], rel=1e-12)
    # options that would change nothing are refused: an IDF corpus without CIDEr, a --split beside REFERENCES.json
    code, _, err = run_main(capsys, pred_path, ref_path, "--metrics", "bleu", "--idf-corpus", train_path)
    assert (code, err) == (2, f"itune score: error: --idf-corpus {train_path} gives CIDEr-D its document frequencies, "
                              "and --metrics bleu leaves CIDEr out: drop --idf-corpus or add CIDEr")  # fmt: skip
    code, _, err = run_main(capsys, pred_path, ref_path, "--split", "val")
    assert code == 2 and err.startswith("itune score: error: --split val picks the --dataset split whose captions")


def test_the_data_layer_reads_what_itune_score_scores(tmp_path, capsys):
    from itune_hf.data.coco_results import read_coco_references, read_coco_results

    references = tmp_path / "refs.json"
    annotations = [{"image_id": i, "caption": c} for i, c in [(2, "b"), ("x", "c"), (1.0, "a"), (2.0, "B ")]]
    images = [{"id": 1}, {"id": [7]}, {"id": 2}, "not an image"]  # an unusable id in "images" is not an error
    references.write_text(json.dumps({"images": images, "annotations": annotations}))
    # "images" order first (1 and 1.0 are one id), then images that only have captions; captions kept as written
    assert read_coco_references(references) == {1: ["a"], 2: ["b", "B "], "x": ["c"]}
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in [(2.0, "b"), ("x", "c"), (1, "a")]]))
    assert read_coco_results(predictions) == {2: "b", "x": "c", 1: "a"}
    code, _, err = run_main(capsys, predictions, predictions, "--idf-corpus", tmp_path / "nope.json")
    assert (code, err) == (
        2,
        f'itune score: error: {predictions}: expected COCO caption annotations, an object with an "annotations" '
        "list; got a list (a COCO results file? were the two files swapped?)",
    )
    code, _, err = run_main(capsys, predictions, references, "--idf-corpus", tmp_path / "nope.json")
    assert (code, err) == (2, f"itune score: error: {tmp_path / 'nope.json'}: no such idf corpus file")


def test_references_without_a_prediction_score_the_predicted_subset_unless_all_are_required(files, capsys):
    directory, pred_path, ref_path = files
    predictions = json.loads(pred_path.read_text())
    subset = directory / "subset.json"
    subset.write_text(json.dumps(predictions[3:]))  # 5 of the 8 reference images predicted, as pycocoevalcap scores
    code, out, err = run_main(capsys, subset, ref_path, "--metrics", "BLEU,CIDEr", "--per-image", directory / "p.json")
    assert code == 0, err
    assert err == (
        f"itune score: scoring the 5 predicted images; 3 of the 8 images of {ref_path} have no prediction and are not "
        "used (--require-all refuses this)"
    )
    references: dict = {}
    for entry in json.loads(ref_path.read_text())["annotations"]:
        references.setdefault(entry["image_id"], []).append(entry["caption"])
    predicted = {entry["image_id"]: entry["caption"] for entry in predictions[3:]}
    expected = score_captions(predicted, {k: references[k] for k in predicted}, metrics=["BLEU", "CIDEr"])
    assert json.loads(out) == pytest.approx(expected, rel=1e-12)
    assert [row["image_id"] for row in json.loads((directory / "p.json").read_text())] == list(predicted)
    code, out, err = run_main(capsys, subset, ref_path, "--require-all")
    assert (code, out) == (2, "")
    assert err.endswith(f"3 image id(s) of {ref_path} without a prediction: 0, 1, 2")


def test_dataset_references_need_no_image_files_and_match_numeric_coco_ids(tmp_path, capsys):
    """`--dataset` reads captions only: references whose image files are absent were dropped, and the predictions
    then blamed; COCO results give ids as numbers (`"image_id": 391895`), a dataset's are text."""
    entries = [{"filename": f"{i}.jpg", "cocoid": i, "split": "test", "sentences": [{"raw": f"a photo {i}"}]}
               for i in (391895, 522418)]  # fmt: skip
    dataset = tmp_path / "dataset_coco.json"
    dataset.write_text(json.dumps({"dataset": "coco", "images": entries}))  # and no image file at all
    predictions = tmp_path / "results.json"
    predictions.write_text(json.dumps([{"image_id": i, "caption": f"a photo {i}"} for i in (391895, 522418)]))
    code, out, err = run_main(capsys, predictions, "--dataset", dataset, "--metrics", "BLEU,CIDEr")
    assert code == 0, err
    assert json.loads(out)["Bleu_1"] == pytest.approx(1.0)
    (tmp_path / "folder").mkdir()  # --dataset names its folder, as --data does elsewhere
    (tmp_path / "folder" / "dataset.json").write_text(dataset.read_text())
    assert run_main(capsys, predictions, "--dataset", tmp_path / "folder", "--metrics", "BLEU")[0] == 0
    predictions.write_text(json.dumps([{"image_id": 391895, "caption": "a"}, {"image_id": "391895", "caption": "b"}]))
    code, _, err = run_main(capsys, predictions, "--dataset", dataset, "--metrics", "BLEU")
    assert code == 2 and "image ids '391895' and 391895 are both given; keep one" in err
