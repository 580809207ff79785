"""The grounded metric for real captions through the CLI, as users run it: `itune eval --constant-caption
--shuffled-control` on a tiny hand-written `itune-clipart` corpus (each image's `content_words` recorded), a tiny
trained I-Tuning adapter (`itune-tiny-random`) captioning it; `itune score --dataset` on the same file."""

from __future__ import annotations

import argparse
import json

import pytest

from itune_hf.cli import main
from itune_hf.data import load_captions
from itune_hf.data.scenes import read_scenes
from itune_hf.evaluation import derangement
from itune_hf.metrics import score_captions

from conftest import train_tiny_adapter, write_photo

# (name, content words, two captions): the images differ in colour, the captions in their content words
PICTURES = [
    ("cat", ["cat", "box"], ["A cat sits in a box.", "A cat in a cardboard box."]),
    ("dog", ["dog", "ball"], ["A dog plays with a ball.", "A dog with a ball by a tree, a car and a house."]),
    ("tree", ["tree", "leaf"], ["A tree with green leaves.", "A tall tree."]),
    ("car", ["car", "road"], ["A car on the road.", "A blue car drives on a road."]),
    ("sun", ["sun", "cloud"], ["The sun behind a cloud.", "A sun and two clouds."]),
    ("fish", ["fish", "bowl"], ["A fish in a bowl.", "A goldfish swims in a bowl."]),
    ("house", ["house", "door"], ["A house with a red door.", "A small house."]),
    ("flower", ["flower", "pot"], ["A flower in a pot.", "Flowers in a clay pot."]),
]
COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30), (30, 200, 200), (200, 30, 200), (90, 90, 90),
           (240, 140, 20)]  # fmt: skip
METRICS = "CIDEr,BLEU,ContentWords,CHAIR"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """An `itune-clipart` dataset.json: 24 images (16 train, 8 test), each picture three times in three shades."""
    root = tmp_path_factory.mktemp("clipart")
    (root / "images").mkdir()
    images = []
    for copy, split in enumerate(("train", "train", "test")):
        for (name, content, captions), colour in zip(PICTURES, COLOURS):
            filename = f"{name}_{copy}.png"
            write_photo(root / "images" / filename, size=(32, 32), color=tuple(max(0, c - 40 * copy) for c in colour))
            images.append({
                "filepath": "images", "filename": filename, "split": split, "content_words": content,
                "sentences": [{"raw": caption} for caption in captions],
            })  # fmt: skip
    path = root / "dataset.json"
    path.write_text(json.dumps({"dataset": "itune-clipart", "images": images}))
    return path


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    return train_tiny_adapter(corpus, tmp_path_factory.mktemp("clipart-model") / "adapter", steps=4)


def run(capsys, *args) -> tuple[int, dict]:
    code = main([str(a) for a in args])
    out = capsys.readouterr().out
    return code, json.loads(out.strip().splitlines()[-1])


def test_eval_reports_content_words_beside_the_constant_caption_and_the_shuffled_control(
    corpus, trained, tmp_path, capsys
):
    out = tmp_path / "eval"
    code, printed = run(
        capsys, "eval", "--model", trained, "--data", corpus, "--split", "test", "--num-beams", 1,
        "--max-new-tokens", 8, "--metrics", METRICS, "--constant-caption", "--shuffled-control", "--output-dir", out,
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "metrics.json").read_text())
    assert report["scores"] == printed
    assert not any(key.startswith("Object_") for key in printed)  # the corpus records no scenes
    for key in ("Words_F1", "CIDEr"):
        assert {key, f"{key} (shuffled)", f"{key} drop", f"{key} (constant caption)"} <= set(printed)

    # the model's scores: its written captions against the recorded content words
    splits, records = load_captions(str(corpus)), read_scenes(corpus)
    test, train = splits["test"], splits["train"]
    captions = {r["image_id"]: r["caption"] for r in json.loads((out / "results.json").read_text())}
    references = dict(zip(test["image_id"], test["captions"]))
    assert set(captions) == set(references) and len(captions) == 8
    expected = score_captions(captions, references, metrics=["CIDEr", "ContentWords", "CHAIR"], scenes=records)
    assert isinstance(printed["Words_F1"], float) and isinstance(printed["CHAIR_s"], float)
    assert printed["CHAIR_s"] == pytest.approx(expected["CHAIR_s"])  # hallucination beside the grounded F1
    assert {"CHAIR_i", "CHAIR_cover"} <= set(printed)
    assert [printed[key] for key in ("Words_P", "Words_R", "Words_F1", "Words_repeat")] == [
        pytest.approx(expected[key]) for key in ("Words_P", "Words_R", "Words_F1", "Words_repeat")
    ]

    # the shuffled control: image i's caption against image order[i]'s references and content words
    ids = list(captions)
    other = [ids[k] for k in derangement(len(ids), seed=report["shuffled_control"]["derangement_seed"])]
    moved = score_captions(
        captions,
        {key: references[o] for key, o in zip(ids, other)},
        metrics=["CIDEr", "ContentWords"],
        scenes={key: records[o] for key, o in zip(ids, other)},
    )
    assert printed["Words_F1 (shuffled)"] == pytest.approx(moved["Words_F1"])
    assert printed["Words_F1 drop"] == pytest.approx(expected["Words_F1"] - moved["Words_F1"])

    # the constant caption: the training caption with the best content-word F1 on the train split, for every
    # test image; and the one with the best CIDEr-D there
    constant = report["constant_caption"]
    train_refs = dict(zip(train["image_id"], train["captions"]))
    pool = sorted({c for refs in train_refs.values() for c in refs})
    assert constant["words_caption"] in pool and constant["caption"] in pool and "object_caption" not in constant
    assert constant["words_caption"] != constant["caption"]  # the corpus tells the two choices apart

    def on_train(caption: str) -> dict:
        return score_captions(dict.fromkeys(train_refs, caption), train_refs, metrics=["CIDEr", "ContentWords"],
                              scenes=records)  # fmt: skip

    train_scores = {caption: on_train(caption) for caption in pool}
    assert train_scores[constant["words_caption"]]["Words_F1"] == max(s["Words_F1"] for s in train_scores.values())
    assert train_scores[constant["caption"]]["CIDEr"] == max(s["CIDEr"] for s in train_scores.values())
    words_floor = score_captions(dict.fromkeys(captions, constant["words_caption"]), references,
                                 metrics=["ContentWords"], scenes=records)  # fmt: skip
    cider_floor = score_captions(dict.fromkeys(captions, constant["caption"]), references, metrics=["CIDEr"])
    assert printed["Words_F1 (constant caption)"] == pytest.approx(words_floor["Words_F1"])
    assert printed["CIDEr (constant caption)"] == pytest.approx(cider_floor["CIDEr"])
    # one caption for every image names mostly words its image does not record
    assert words_floor["Words_P"] <= 1 / 4

    # without the flags, the same evaluation reports the model's scores alone
    code, plain = run(
        capsys, "eval", "--model", trained, "--data", corpus, "--split", "test", "--num-beams", 1,
        "--max-new-tokens", 8, "--metrics", METRICS, "--output-dir", tmp_path / "plain",
    )  # fmt: skip
    assert code == 0 and set(plain) == {key for key in printed if "(" not in key and "drop" not in key}
    assert "constant_caption" not in json.loads((tmp_path / "plain" / "metrics.json").read_text())

    # `itune score --dataset` on the written results agrees, the content words chosen by default
    code, scored = run(capsys, "score", out / "results.json", "--dataset", corpus, "--metrics", "CIDEr,content-words")
    assert code == 0 and scored["Words_F1"] == pytest.approx(printed["Words_F1"])
    code, default = run(capsys, "score", out / "results.json", "--dataset", corpus)
    assert code == 0 and default["Words_F1"] == pytest.approx(printed["Words_F1"]) and "Object_F1" not in default


def test_eval_adds_content_words_by_default_where_the_data_records_them(corpus, world):
    from itune_hf.commands.eval import _metrics_and_scenes

    metrics, records = _metrics_and_scenes(argparse.Namespace(metrics=None, data=str(corpus), instances=None))
    assert metrics[-2:] == ("ContentWords", "CHAIR") and "Objects" not in metrics and len(records) == 24
    metrics, scenes = _metrics_and_scenes(argparse.Namespace(metrics=None, data=str(world), instances=None))
    assert metrics[-2:] == ("Objects", "CHAIR") and "ContentWords" not in metrics  # a generated world's


def test_constant_caption_without_a_train_split_is_refused_before_captioning(corpus, trained, tmp_path, capsys):
    data = json.loads(corpus.read_text())
    data["images"] = [e for e in data["images"] if e["split"] == "test"]
    (tmp_path / "images").symlink_to(corpus.parent / "images")
    (tmp_path / "dataset.json").write_text(json.dumps(data))
    code = main(["eval", "--model", str(trained), "--data", str(tmp_path), "--split", "test", "--constant-caption",
                 "--output-dir", str(tmp_path / "eval")])  # fmt: skip
    assert code == 2
    assert "--constant-caption chooses the caption on a train split" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()
