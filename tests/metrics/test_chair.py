"""CHAIR (object hallucination) on hand-made cases: how captions are read (synonyms, plurals, two-word names, the
paper's special cases), the counts against hand-computed values, repetition, references' objects, the three kinds of
record, and `itune score` on hand-made COCO caption and instance annotations, as a user runs it."""

from __future__ import annotations

import json
import math

import pytest

from itune_hf.cli import main
from itune_hf.data import DataFormatError
from itune_hf.data.scenes import RecordedObjects, RecordedScene, RecordedWords, read_instance_objects
from itune_hf.metrics import score_captions, score_captions_detailed
from itune_hf.metrics.chair import coco_object_words


@pytest.mark.parametrize(
    ("caption", "objects"),
    [
        ("two puppies and a kitten", {"dog", "cat"}),  # synonyms, plurals
        ("a woman and her children", {"person"}),  # irregular plurals, one category
        ("a hot dog on a plate", {"hot dog"}),  # a two-word name is not its last word
        ("a baby elephant beside an adult giraffe", {"elephant", "giraffe"}),  # no person
        ("a passenger jet on the runway", {"airplane"}),  # no person
        ("the seat of the toilet is up", {"toilet"}),  # no chair
        ("a man in a bow tie", {"person", "tie"}),
        ("teddy bears on a sofa", {"teddy bear", "couch"}),
        ("wine glasses on the dining table", {"wine glass", "dining table"}),
        ("people riding motor bikes past a stop sign", {"person", "motorcycle", "stop sign"}),
        ("a train on the train track", {"train"}),  # "train track" names no train
        ("a green field under a blue sky", set()),
    ],
)
def test_captions_are_read_with_the_coco_words_and_the_papers_rules(caption, objects):
    assert coco_object_words().objects(caption) == objects


def test_the_word_table_holds_the_80_coco_categories():
    categories = set(coco_object_words().category_of.values())
    assert len(categories) == 80 and {"person", "dining table", "hair drier", "toothbrush"} <= categories


def chair(hypotheses, references, records, ids=None):
    ids = ids or list(range(len(hypotheses)))
    return score_captions_detailed(
        dict(zip(ids, hypotheses)), dict(zip(ids, references)), metrics=["CHAIR"], scenes=dict(zip(ids, records))
    )


def test_counts_against_hand_computed_values():
    result = chair(
        ["a dog on a couch", "a man with a cat and a frisbee", "a green field"],
        [["a puppy on a sofa"], ["a person throws a frisbee"], ["grass"]],
        [RecordedObjects(frozenset({"dog"})), RecordedObjects(frozenset({"person", "frisbee", "dog"})),
         RecordedObjects(frozenset({"sheep"}))],
    )  # fmt: skip
    # image 0: mentions dog, couch; has dog and (its reference says) couch -> nothing hallucinated, both covered
    # image 1: mentions person, cat, frisbee; has person, frisbee, dog -> cat hallucinated, 2 of 3 covered
    # image 2: mentions nothing; has sheep
    assert result.scores["CHAIR_i"] == pytest.approx(1 / 5)
    assert result.scores["CHAIR_s"] == pytest.approx(1 / 3)
    assert result.scores["CHAIR_cover"] == pytest.approx(4 / 6)
    per_image = [result.per_image[k] for k in range(3)]
    assert [p["CHAIR_i"] for p in per_image[:2]] == pytest.approx([0.0, 1 / 3])
    assert math.isnan(per_image[2]["CHAIR_i"])  # mentions no object
    assert [p["CHAIR_s"] for p in per_image] == [0.0, 1.0, 0.0]
    assert [p["CHAIR_cover"] for p in per_image] == pytest.approx([1.0, 2 / 3, 0.0])


def test_repeating_an_object_changes_nothing_and_an_object_list_is_caught():
    record, refs = RecordedObjects(frozenset({"dog"})), [["a dog"]]
    once = chair(["a dog and a cat"], refs, [record]).scores
    repeated = chair(["a dog and a dog and a dog and a cat"], refs, [record]).scores
    assert once == repeated and once["CHAIR_i"] == pytest.approx(0.5)
    every = " ".join(sorted(set(coco_object_words().category_of.values())))  # all 80 categories named
    dump = chair([every], refs, [record]).scores
    assert dump["CHAIR_cover"] == 1.0 and dump["CHAIR_i"] == pytest.approx(79 / 80) and dump["CHAIR_s"] == 1.0


def test_a_generated_worlds_shapes_and_a_clipart_corpus_words_are_objects_too():
    scene = RecordedScene("captions", (("red", "circle"), ("blue", "square")), "row", "white")
    truth = [["a red circle to the left of a blue square."]]
    result = chair(["a red circle to the left of a blue triangle."], truth, [scene])
    assert result.scores["CHAIR_i"] == pytest.approx(0.5) and result.scores["CHAIR_cover"] == pytest.approx(0.5)
    wrong_colour = chair(["a blue circle to the left of a red square."], truth, [scene])
    assert wrong_colour.scores["CHAIR_i"] == 0.0  # a shape in the wrong colour: Objects' binding error, not CHAIR

    words = [RecordedWords(frozenset({"cat", "box"})), RecordedWords(frozenset({"dog", "ball"}))]
    result = chair(["a cat in a ball", "dogs"], [["a cat in a box"], ["a dog"]], words)
    assert result.scores["CHAIR_i"] == pytest.approx(1 / 3)  # "ball" is not in the cat's picture
    assert result.scores["CHAIR_cover"] == pytest.approx(2 / 4)


def test_an_instances_file_outside_the_80_categories_names_its_own_words():
    """Another instances file's category names are words of their own, two-word ones read as one, and a category of
    the file that an image lacks is a hallucination even when no evaluated image has it."""
    vocabulary = frozenset({"traffic cone", "dog", "kayak paddle"})
    records = [
        RecordedObjects(frozenset({"traffic cone"}), vocabulary),
        RecordedObjects(frozenset({"dog"}), vocabulary),
    ]
    result = chair(["a traffic cone and a dog", "a dog with a kayak paddle"], [["x"], ["y"]], records)
    # image 0: mentions traffic cone, dog (dog hallucinated); image 1: dog, kayak paddle (the paddle hallucinated)
    assert result.scores["CHAIR_i"] == pytest.approx(2 / 4) and result.scores["CHAIR_cover"] == 1.0
    assert result.per_image[0]["CHAIR_i"] == pytest.approx(0.5)


def test_unavailable_without_records_and_reported_beside_the_others():
    scores = score_captions({1: "a dog"}, {1: ["a dog"]}, metrics=["CHAIR", "CIDEr"])
    assert "unavailable" in str(scores["CHAIR_i"]) and isinstance(scores["CIDEr"], float)
    scores = score_captions(
        {1: "a dog", 2: "a cat"}, {1: ["a dog"], 2: ["a cat"]}, metrics=["CHAIR"],
        scenes={1: RecordedObjects(frozenset({"dog"}))},
    )  # fmt: skip
    assert "1 of 2 images have no recorded objects" in str(scores["CHAIR_s"])
    from itune_hf.metrics.chair import score_chair
    from itune_hf.metrics.types import TokenizedCaptions

    assert score_chair(TokenizedCaptions([], [], [], scenes=[])) == "unavailable: no images to score"


@pytest.fixture
def coco(tmp_path):
    """COCO caption and instance annotations of three images, in COCO's layout (instances beside captions)."""
    images = [{"id": k, "file_name": f"{k:012d}.jpg", "width": 64, "height": 48} for k in (1, 2, 3)]
    categories = [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}, {"id": 67, "name": "dining table"}]
    instances = [(1, 18), (1, 18), (2, 1), (2, 67), (3, 1)]  # (image, category)
    captions = [(1, "A puppy on the grass."), (2, "A man at a table."), (3, "A woman with a cat.")]
    (tmp_path / "instances_val.json").write_text(json.dumps({
        "images": images, "categories": categories,
        "annotations": [{"id": k, "image_id": i, "category_id": c, "bbox": [0, 0, 8, 8]}
                        for k, (i, c) in enumerate(instances)],
    }))  # fmt: skip
    (tmp_path / "captions_val.json").write_text(json.dumps({
        "images": images,
        "annotations": [{"id": k, "image_id": i, "caption": c} for k, (i, c) in enumerate(captions)],
    }))  # fmt: skip
    (tmp_path / "predictions.json").write_text(json.dumps([
        {"image_id": 1, "caption": "two dogs and a frisbee on the grass"},  # frisbee hallucinated
        {"image_id": 2, "caption": "people eating at a dining table"},
        {"image_id": 3, "caption": "a woman holding a cat"},  # the reference's cat is present
    ]))  # fmt: skip
    return tmp_path


def test_itune_score_reads_coco_instances_beside_the_captions_or_named(coco, capsys):
    assert main(["score", str(coco / "predictions.json"), str(coco / "captions_val.json")]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # mentioned: {dog, frisbee}, {person, dining table}, {person, cat}; present: {dog}, {person, dining table},
    # {person, cat (its reference)}
    assert scores["CHAIR_i"] == pytest.approx(1 / 6) and scores["CHAIR_s"] == pytest.approx(1 / 3)
    assert scores["CHAIR_cover"] == 1.0 and "CIDEr" in scores

    (coco / "instances_val.json").rename(coco / "objects.json")  # not beside: not read, unless named
    assert main(["score", str(coco / "predictions.json"), str(coco / "captions_val.json")]) == 0
    assert not any(key.startswith("CHAIR") for key in json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    named = ["score", "--instances", str(coco / "objects.json"), "--metrics", "CHAIR"]  # before the positionals too
    assert main([*named, str(coco / "predictions.json"), str(coco / "captions_val.json")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == scores_of(scores, "CHAIR_")


def scores_of(scores: dict, prefix: str) -> dict:
    return {key: value for key, value in scores.items() if key.startswith(prefix)}


def test_a_malformed_instances_file_names_the_file_and_the_entry(coco):
    data = json.loads((coco / "instances_val.json").read_text())
    data["annotations"][3]["category_id"] = 99
    (coco / "bad.json").write_text(json.dumps(data))
    with pytest.raises(DataFormatError, match=r"bad\.json: annotations\[3\]: category_id 99 is not among"):
        read_instance_objects(coco / "bad.json")
    del data["categories"]
    (coco / "bad.json").write_text(json.dumps(data))
    with pytest.raises(DataFormatError, match=r"bad\.json: expected COCO instances JSON.*'categories'"):
        read_instance_objects(coco / "bad.json")
    records = read_instance_objects(coco / "instances_val.json")
    assert records["2"].categories == frozenset({"person", "dining table"})
    assert records["3"].vocabulary == frozenset({"person", "dog", "dining table"})
