"""The grounded metric for real captions (`ContentWords`): the content words a caption names against those the corpus
recorded for the image, plurals folded, a repeated word counted again; an `itune-clipart` dataset.json read back by
`read_scenes`; `Objects` and `ContentWords` each unavailable on the other's records."""

from __future__ import annotations

import json
import math

import pytest

from itune_hf.data.scenes import RecordedScene, RecordedWords, read_scenes, scenes_of_data
from itune_hf.metrics import get_metric, scene_metrics_for, score_captions, score_captions_detailed
from itune_hf.metrics.content_words import STOP_WORDS, fold
from itune_hf.metrics.registry import card_metrics

KEYS = ["Words_P", "Words_R", "Words_F1", "Words_repeat"]


def words(*items: str) -> RecordedWords:
    return RecordedWords(frozenset(items))


def score(predictions: dict, records: dict) -> dict:
    return score_captions(predictions, dict.fromkeys(predictions, ["unused"]), metrics=["ContentWords"], scenes=records)


def detailed(predictions: dict, records: dict):
    references = dict.fromkeys(predictions, ["unused"])
    return score_captions_detailed(predictions, references, metrics=["content-words"], scenes=records)


def test_the_metric_is_registered_beside_objects_as_a_card_metric():
    metric = get_metric("ContentWords")
    assert metric.keys == tuple(KEYS) and metric.needs_scenes and not metric.needs_java
    assert (metric.card_key, metric.card_name) == ("Words_F1", "Content-word F1")
    assert [m.card_name for m in card_metrics()][-2:] == ["Object F1", "Content-word F1"]
    assert get_metric("words_f1") is metric and get_metric("content_words") is metric


def test_a_caption_naming_exactly_the_recorded_words_scores_one():
    scores = score({1: "A cat sits on a box."}, {1: words("cat", "box")})
    assert [scores[key] for key in KEYS] == [1.0, 1.0, 1.0, 0.0]


def test_a_wrong_word_lowers_precision_and_a_missed_word_recall():
    records = {1: words("cat", "box"), 2: words("dog", "tree")}
    # image 1 says "dog" (a word of the vocabulary, not of its image) and misses "box"; image 2 names both
    scores = score({1: "a dog and a cat", 2: "a dog under a tree"}, records)
    assert scores["Words_P"] == pytest.approx(3 / 4)  # cat, dog, tree of cat, dog, dog, tree
    assert scores["Words_R"] == pytest.approx(3 / 4)  # cat, dog, tree of cat, box, dog, tree
    assert scores["Words_F1"] == pytest.approx(3 / 4)
    # a word no evaluated image records is not read: it neither matches nor counts against precision
    assert score({1: "a cat on a sofa with a box"}, {1: words("cat", "box")})["Words_P"] == 1.0


def test_plurals_and_singulars_are_folded_on_both_sides():
    records = {1: words("box", "berry", "leaf", "mouse"), 2: words("cats", "dishes", "glass")}
    scores = score({1: "Boxes of berries on leaves and mice.", 2: "a cat and dishes and glasses"}, records)
    assert [scores[key] for key in KEYS[:3]] == [1.0, 1.0, 1.0]
    assert {fold(w) for w in ("boxes", "berries", "leaves", "mice", "knives", "benches", "houses")} == {
        "box", "berry", "leaf", "mouse", "knife", "bench", "house",
    }  # fmt: skip
    assert [fold(w) for w in ("bus", "buses", "glass", "cactus", "iris", "cookies", "cat")] == [
        "bus", "bus", "glass", "cactus", "iris", "cookie", "cat",
    ]  # fmt: skip


def test_a_repeated_word_is_counted_again_and_lowers_precision():
    records = {1: words("cat", "box"), 2: words("dog")}
    result = detailed({1: "a cat and a cat and a cat on a box", 2: "a dog"}, records)
    # image 1 names cat three times and box once: 2 of its 4 named words match
    assert result.per_image[1]["Words_P"] == pytest.approx(2 / 4) and result.per_image[1]["Words_R"] == 1.0
    assert result.per_image[1]["Words_repeat"] == 1.0 and result.per_image[2]["Words_repeat"] == 0.0
    assert result.scores["Words_P"] == pytest.approx(3 / 5)  # (2 + 1) matched of (4 + 1) named
    assert result.scores["Words_R"] == 1.0 and result.scores["Words_repeat"] == 0.5
    # plural and singular of one word are one word said twice
    assert score({1: "a cat and two cats"}, {1: words("cat")})["Words_repeat"] == 1.0


def test_a_caption_listing_the_whole_vocabulary_has_high_recall_and_low_precision():
    records = {i: words(*w) for i, w in enumerate([("cat", "box"), ("dog", "tree"), ("car", "road"), ("sun",)])}
    vocabulary = "cat box dog tree car road sun"
    result = detailed(dict.fromkeys(records, vocabulary), records)
    assert result.scores["Words_R"] == 1.0
    assert result.scores["Words_P"] == pytest.approx(7 / 28)  # 7 matched of 4 x 7 named
    assert result.scores["Words_F1"] == pytest.approx(2 * 0.25 / 1.25)
    assert result.scores["Words_repeat"] == 0.0
    assert result.per_image[3]["Words_P"] == pytest.approx(1 / 7) and result.per_image[3]["Words_R"] == 1.0


def test_the_per_image_values_are_each_captions_own():
    records = {"a": words("cat", "box"), "b": words("dog", "tree", "ball"), "c": words("sun")}
    result = detailed({"a": "a cat", "b": "a dog and a ball and a cat", "c": "a picture"}, records)
    assert result.per_image["a"] == {"Words_P": 1.0, "Words_R": 0.5, "Words_F1": pytest.approx(2 / 3),
                                     "Words_repeat": 0.0}  # fmt: skip
    b = result.per_image["b"]
    assert (b["Words_P"], b["Words_R"]) == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert result.per_image["c"] == dict.fromkeys(KEYS, 0.0)  # names nothing: 0, not NaN
    # the corpus values are ratios of the summed counts, not means of the per-image values
    assert result.scores["Words_P"] == pytest.approx(3 / 4) and result.scores["Words_R"] == pytest.approx(3 / 6)


def test_stop_words_are_never_content_words():
    assert {"a", "the", "of", "clipart", "vector"} <= STOP_WORDS
    records = {1: words("cat", "clipart", "vector")}  # a corpus that records the medium among the content
    scores = score({1: "clipart vector of a cat"}, records)
    assert (scores["Words_P"], scores["Words_R"]) == (1.0, 1.0)


def test_without_recorded_words_for_every_image_the_metric_is_unavailable():
    predictions = {1: "a cat", 2: "a dog"}
    assert score(predictions, None)["Words_F1"].startswith("unavailable: no recorded content words given")
    partial = score(predictions, {1: words("cat")})
    assert all(partial[key].startswith("unavailable: 1 of 2 images have no recorded content words (e.g. 2;")
               for key in KEYS)  # fmt: skip
    nothing = score(predictions, {1: words("the"), 2: words("the", "clipart")})  # nothing left after the stop words
    assert nothing["Words_F1"].startswith("unavailable: 2 of 2 images have no recorded content words (e.g. 1, 2;")


def test_an_image_whose_record_names_no_word_is_left_out_of_the_scores():
    predictions = {1: "a cat", 2: "a dog and a cat"}
    result = score_captions_detailed(predictions, {1: ["x"], 2: ["x"]}, metrics=["ContentWords"],
                                     scenes={1: words("cat"), 2: words("the", "clipart")})  # fmt: skip
    assert result.scores["Words_F1"] == 1.0  # image 2's "cat" would have cost precision had it been graded
    assert all(math.isnan(value) for value in result.per_image[2].values())
    assert result.per_image[1]["Words_F1"] == 1.0


def test_each_scene_metric_is_unavailable_on_the_others_records():
    scene = RecordedScene("captions", (("red", "circle"),), "single", "white")
    world = score_captions({1: "a red circle"}, {1: ["x"]}, metrics=["Objects", "ContentWords"], scenes={1: scene})
    assert world["Object_F1"] == 1.0
    assert world["Words_F1"].startswith("unavailable: 1 of 1 images have no recorded content words")
    clipart = score_captions({1: "a cat"}, {1: ["x"]}, metrics=["Objects", "ContentWords"], scenes={1: words("cat")})
    assert clipart["Words_F1"] == 1.0
    assert clipart["Object_F1"] == "unavailable: 1 of 1 images have no recorded scene (e.g. 1)"
    # the commands' defaults add only the scene metrics that read the data's records (CHAIR reads both kinds)
    assert scene_metrics_for({1: scene}) == ("Objects", "CHAIR")
    assert scene_metrics_for({1: words("cat")}) == ("ContentWords", "CHAIR")
    assert scene_metrics_for({}) == scene_metrics_for(None) == ()


def clipart_json(path, images: list[dict], kind: str = "itune-clipart"):
    path.write_text(json.dumps({"dataset": kind, "images": images}))
    return path


def entry(name: str, split: str, caption: str, content=None) -> dict:
    item = {"filename": f"{name}.png", "split": split, "sentences": [{"raw": caption}]}
    return item if content is None else {**item, "content_words": content}


def test_read_scenes_reads_an_itune_clipart_dataset(tmp_path):
    path = clipart_json(tmp_path / "dataset.json", [
        entry("cat_01", "train", "A cat on a box.", ["cat", "box"]),
        entry("tree", "test", "A tree.", ["Tree ", "leaves"]),
        entry("bare", "test", "Something.", []),
        entry("none", "test", "Something else."),
    ])  # fmt: skip
    records = read_scenes(path)
    assert records == {
        "cat_01": RecordedWords(frozenset({"cat", "box"})),
        "tree": RecordedWords(frozenset({"tree", "leaves"})),  # as the file spells them, lower case
        "bare": RecordedWords(frozenset()),
    }  # "none" records nothing
    assert scenes_of_data(str(tmp_path)) == records == scenes_of_data(str(path))
    assert score({"tree": "two trees and a leaf"}, records)["Words_R"] == 1.0  # folded when scored
    # another kind of Karpathy file records nothing, even with the field
    assert read_scenes(clipart_json(tmp_path / "other.json", [entry("x", "test", "A cat.", ["cat"])], "coco")) == {}


def test_malformed_content_words_name_the_entry(tmp_path):
    from itune_hf.data._common import DataFormatError

    images = [entry("a", "test", "A cat.", ["cat"]), entry("b", "test", "A dog.", "dog")]
    path = clipart_json(tmp_path / "dataset.json", images)
    with pytest.raises(DataFormatError, match=r"dataset.json: images\[1\]: content_words must be a list of strings"):
        read_scenes(path)
