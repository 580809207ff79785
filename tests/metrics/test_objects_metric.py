"""The scene-grounded metric (`Objects`): every world's grammar reads its own references completely, and a caption's
objects, counts, bindings, relations and sizes are checked against the scene the world recorded; a repeated phrase
names its objects again."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from itune_hf.data import make_synthetic
from itune_hf.data.scenes import RecordedScene, grammar_of, read_scenes
from itune_hf.data.synthetic import WORLDS
from itune_hf.metrics import score_captions, score_captions_detailed

OBJECT_KEYS = ["Object_P", "Object_R", "Object_F1", "Binding_err", "Count_acc", "Relation_acc", "Exact_scene"]
ROW = (("left_of", 0, 1),)  # two objects side by side


@pytest.fixture(scope="module")
def captions_world(tmp_path_factory):
    path = make_synthetic(tmp_path_factory.mktemp("objects") / "captions", num_images=80, seed=3, image_size=24)
    return path, json.loads(path.read_text())


def scene(objects, layout="single", relations=(), background="white", world="captions", sizes=None):
    return RecordedScene(world, tuple(objects), layout, background, tuple(relations), sizes)


def objects_of(entry) -> Counter:
    return Counter((obj["color"], obj["shape"]) for obj in entry["objects"])


def score(caption: str, recorded: RecordedScene) -> dict:
    return score_captions({1: caption}, {1: ["unused"]}, metrics=["objects"], scenes={1: recorded})


@pytest.mark.parametrize("world", ["captions", "hard"])
def test_every_reference_of_a_templated_world_scores_exactly_one(world, tmp_path):
    path = make_synthetic(tmp_path / world, num_images=120, seed=3, image_size=32, world=world)
    data = json.loads(path.read_text())
    scenes = read_scenes(path)
    assert len(scenes) == len(data["images"])
    references = {key: ["unused"] for key in scenes}
    for number in range(5):
        predictions = {e["filename"][:-4]: e["sentences"][number]["raw"] for e in data["images"]}
        result = score_captions_detailed(predictions, references, metrics=["objects"], scenes=scenes)
        perfect = {"Object_P", "Object_R", "Object_F1", "Count_acc", "Exact_scene"}
        assert {key: result.scores[key] for key in perfect} == dict.fromkeys(perfect, 1.0)
        assert result.scores["Binding_err"] == 0.0
        if world == "hard":  # its captions state no relation
            assert math.isnan(result.scores["Relation_acc"])
        else:
            assert result.scores["Relation_acc"] == 1.0
        assert all(row["Exact_scene"] == 1.0 for row in result.per_image.values())
    vocabulary = set(data["vocabulary"])
    assert all(set(s["tokens"]) <= vocabulary for e in data["images"] for s in e["sentences"])


def test_every_world_records_scenes_with_relations_and_has_a_grammar(tmp_path):
    for world in WORLDS:
        path = make_synthetic(tmp_path / world, num_images=30, seed=1, image_size=24, world=world)
        data = json.loads(path.read_text())
        scenes = read_scenes(path)
        assert len(scenes) == 30 and all(scene.world == world for scene in scenes.values())
        for entry in data["images"]:
            count, boxes = len(entry["objects"]), [obj["bbox"] for obj in entry["objects"]]
            pairs = [r for r in entry["relations"] if r[0] != "between"]
            if entry["layout"] == "scatter":  # the hard world: by the objects' places
                for name, i, j in pairs:
                    axis = 0 if name == "left_of" else 1
                    assert boxes[i][axis] + boxes[i][axis + 2] < boxes[j][axis] + boxes[j][axis + 2]
                continue
            assert len(pairs) == count * (count - 1) // 2  # every ordered pair, in reading order
            assert {r[0] for r in pairs} <= ({"left_of"} if entry["layout"] == "row" else {"above"})
        grammar_of(world)


def test_the_hard_world_reads_synonyms_and_sizes_and_counts():
    grammar = grammar_of("hard")
    reading = grammar.read("On a grainy backdrop there are two crimson discs and a tiny cobalt lozenge.")
    assert reading.named == {("red", "circle"): 2, ("blue", "diamond"): 1}
    assert reading.claims == {("background", "noisy"), ("size", ("blue", "diamond"), "small")}
    assert grammar.read("An emerald moon.").named == {("green", "crescent"): 1}
    assert grammar.read("Two red circles beside a blue square.").named == {}  # "beside": outside the grammar


def test_alt_text_captions_name_a_colour_followed_by_a_shape():
    grammar = grammar_of("alt-text")
    assert grammar.read("stock photo blue diamond red star").named == {("blue", "diamond"): 1, ("red", "star"): 1}
    assert grammar.read("icon diamond blue").named == {}  # a shape before its colour binds nothing
    assert grammar.read("blue diamond with a dog").named == {}  # outside the grammar


def test_a_constant_caption_scores_what_the_scenes_say(captions_world):
    path, data = captions_world
    scenes = read_scenes(path)
    predictions = {key: "A red circle." for key in scenes}
    scores = score_captions(predictions, dict.fromkeys(scenes, ["unused"]), metrics=["objects"], scenes=scenes)
    # counted here from dataset.json's objects, apart from the metric
    present = [objects_of(entry) for entry in data["images"]]
    with_circle = sum(1 for objects in present if objects[("red", "circle")])
    precision, recall = with_circle / len(present), with_circle / sum(sum(o.values()) for o in present)
    assert scores["Object_P"] == pytest.approx(precision) and scores["Object_R"] == pytest.approx(recall)
    assert scores["Object_F1"] == pytest.approx(2 * precision * recall / (precision + recall))
    exact = sum(1 for objects in present if objects == Counter({("red", "circle"): 1}))
    assert scores["Exact_scene"] == pytest.approx(exact / len(present))
    assert math.isnan(scores["Relation_acc"])  # no caption states a relation


def test_a_colour_swap_is_two_binding_errors_and_a_wrong_relation_is_counted():
    recorded = scene([("red", "circle"), ("blue", "square")], "row", ROW)
    right = score("A red circle to the left of a blue square.", recorded)
    assert right["Object_F1"] == 1.0 and right["Relation_acc"] == 1.0 and right["Exact_scene"] == 1.0
    swapped = score("A blue circle to the left of a red square.", recorded)
    assert swapped["Object_P"] == 0.0 and swapped["Binding_err"] == 1.0 and swapped["Exact_scene"] == 0.0
    mirrored = score("A blue square to the left of a red circle.", recorded)  # in a row (true), wrong order
    assert mirrored["Object_F1"] == 1.0 and mirrored["Relation_acc"] == 0.5 and mirrored["Exact_scene"] == 0.0
    assert score("A red circle above a blue square.", recorded)["Relation_acc"] == 0.0
    wrong_background = score("There is a red circle to the left of a blue square on a black background.", recorded)
    assert wrong_background["Relation_acc"] == 1.0 and wrong_background["Exact_scene"] == 0.0


def test_counts_are_matched_as_a_multiset():
    two = scene([("red", "circle")] * 2, "row", ROW)
    three = score("Three red circles.", two)
    assert three["Object_P"] == pytest.approx(2 / 3) and three["Object_R"] == 1.0
    assert three["Count_acc"] == 0.0 and three["Exact_scene"] == 0.0 and three["Binding_err"] == 0.0
    one = score("A red circle.", two)
    assert one["Object_P"] == 1.0 and one["Object_R"] == 0.5 and one["Count_acc"] == 0.0
    assert score("Two red circles side by side.", two)["Exact_scene"] == 1.0
    assert score("Two red circles one above the other.", two)["Relation_acc"] == 0.0


#: world -> (a one-object scene, a caption that says its one object's phrase five times)
REPEATED = {
    "captions": (scene([("red", "circle")]), "A red circle and a red circle side by side."),
    "hard": (
        scene([("green", "pentagon")], "scatter", background="plain", world="hard", sizes=("large",)),
        "a large green pentagon, a large green pentagon, a large green pentagon, a large green pentagon and a large "
        "green pentagon",
    ),
    "alt-text": (scene([("red", "star")], world="alt-text"), "stock photo red star red star red star red star"),
}


@pytest.mark.parametrize("world", sorted(REPEATED))
def test_a_repeated_phrase_names_its_object_again_in_every_world(world):
    recorded, caption = REPEATED[world]
    times = caption.lower().count(" ".join(recorded.objects[0]))
    assert grammar_of(world).read(caption).named == {recorded.objects[0]: times}  # read, not outside the grammar
    result = score(caption, recorded)
    assert result["Object_P"] == pytest.approx(1 / times) and result["Object_R"] == 1.0
    assert result["Count_acc"] == 0.0 and result["Exact_scene"] == 0.0
    assert result["Object_F1"] == pytest.approx(2 / (times + 1))


def test_a_wrong_size_is_not_an_exact_scene_where_the_world_records_sizes():
    recorded = scene([("red", "circle")], "scatter", background="plain", world="hard", sizes=("large",))
    assert score("A big crimson disc.", recorded)["Exact_scene"] == 1.0  # "big" is "large"
    wrong = score("A small red circle.", recorded)
    assert wrong["Object_F1"] == 1.0 and wrong["Count_acc"] == 1.0 and wrong["Exact_scene"] == 0.0
    group = scene([("red", "circle")] * 2, "scatter", background="plain", world="hard", sizes=("large", "small"))
    assert score("Two red circles.", group)["Exact_scene"] == 1.0  # a group's size is never said
    unrecorded = scene([("red", "circle")], "scatter", background="plain", world="hard")  # make-synthetic version 2
    assert score("A small red circle.", unrecorded)["Exact_scene"] == 1.0


def test_the_hard_world_records_the_size_word_its_captions_say(tmp_path):
    path = make_synthetic(tmp_path / "hard", num_images=40, seed=5, image_size=32, world="hard")
    data = json.loads(path.read_text())
    said = 0
    for entry in data["images"]:
        assert all(obj["size"] in ("small", "large") for obj in entry["objects"])
        for caption in entry["sentences"]:
            for claim in grammar_of("hard").read(caption["raw"]).claims:
                if claim[0] == "size":
                    said += 1
                    look = claim[1]
                    sizes = [o["size"] for o in entry["objects"] if (o["color"], o["shape"]) == look]
                    assert sizes == [claim[2]], (caption["raw"], entry["objects"])
    assert said > 20  # sizes are said in about half the captions of single objects


def test_a_caption_outside_the_grammar_names_nothing():
    recorded = scene([("red", "circle")])
    for caption in ("A red circle to the left of", "A red circle and a dog.", ""):
        scores = score(caption, recorded)
        assert (scores["Object_P"], scores["Object_R"], scores["Object_F1"], scores["Exact_scene"]) == (0, 0, 0, 0)
        assert math.isnan(scores["Count_acc"])


def test_without_a_scene_for_every_image_the_metric_is_unavailable():
    predictions, references = {1: "a red circle", 2: "a dog"}, {1: ["a red circle"], 2: ["a dog"]}
    scores = score_captions(predictions, references, metrics=["cider", "objects"])
    assert isinstance(scores["CIDEr"], float)
    assert all(scores[key].startswith("unavailable: no scenes given") for key in OBJECT_KEYS)
    partial = score_captions(predictions, references, metrics=["objects"], scenes={1: scene([("red", "circle")])})
    assert partial["Object_F1"] == "unavailable: 1 of 2 images have no recorded scene (e.g. 2)"


def alt_text_arm(directory, *noise: str) -> tuple[dict, dict]:
    """An alt-text world of 60 images written by `itune make-synthetic` with `noise` flags: (dataset, scenes)."""
    from itune_hf.cli import main

    assert main(["make-synthetic", "--world", "alt-text", "--num-images", "60", "--seed", "4", "--image-size", "24",
                 "--output-dir", str(directory), *noise]) == 0  # fmt: skip
    return json.loads((directory / "dataset.json").read_text()), read_scenes(directory / "dataset.json")


def reference_f1(data: dict, scenes: dict) -> list[float]:
    """Object F1 of every reference caption against its own image's recorded scene."""
    references = {key: ["unused"] for key in scenes}
    values = []
    for number in range(5):
        predictions = {e["filename"][:-4]: e["sentences"][number]["raw"] for e in data["images"]}
        result = score_captions_detailed(predictions, references, metrics=["objects"], scenes=scenes)
        values += [row["Object_F1"] for row in result.per_image.values()]
    return values


def test_the_clean_alt_text_arm_describes_every_image_and_the_noisy_one_does_not(tmp_path, capsys):
    clean, clean_scenes = alt_text_arm(tmp_path / "clean", "--caption-noise", "0")
    noisy, noisy_scenes = alt_text_arm(tmp_path / "noisy")  # the default rates: 0.2 unrelated, 0.25 words dropped
    assert clean["generator"]["caption_noise"] == {"unrelated": 0.0, "word_drop": 0.0}
    assert "caption_noise" not in noisy["generator"]  # the defaults: the world every earlier study used
    assert reference_f1(clean, clean_scenes) == [1.0] * 300  # every caption names exactly its image's objects
    noisy_f1 = reference_f1(noisy, noisy_scenes)
    assert len(noisy_f1) == 300 and sum(f < 1.0 for f in noisy_f1) > 60  # a fifth unrelated, words dropped
    assert clean_scenes == noisy_scenes  # the arms differ in their captions only
    for name in ("000000.png", "000059.png"):
        clean_image, noisy_image = (tmp_path / arm / "images" / name for arm in ("clean", "noisy"))
        assert clean_image.read_bytes() == noisy_image.read_bytes()


def test_caption_noise_is_refused_outside_the_alt_text_world_and_out_of_range(tmp_path, capsys):
    from itune_hf.cli import main
    from itune_hf.data.synthetic import CaptionNoise

    assert main(["make-synthetic", "--num-images", "3", "--caption-noise", "0", "--output-dir", str(tmp_path)]) == 2
    assert "only the alt-text world has caption noise (--world captions)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["make-synthetic", "--world", "alt-text", "--caption-noise", "0.1,1.5", "--output-dir", str(tmp_path)])
    assert "word_drop must be a rate from 0 to 1; got 1.5" in capsys.readouterr().err
    with pytest.raises(ValueError, match="alt-text world only"):
        make_synthetic(tmp_path / "hard", num_images=3, world="hard", caption_noise=CaptionNoise(0, 0))
