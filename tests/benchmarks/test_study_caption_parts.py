"""`benchmarks/study_caption_parts.py`: how a clip-art caption splits into its title and category phrase, and the
per-captioner measures, on hand-made captions whose answers are counted by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from script_support import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "study_caption_parts.py"
PHRASES = {"bird", "mammal", "meats and eggs", "flag"}


@pytest.fixture(scope="module")
def study():
    return load_script(SCRIPT)


@pytest.mark.parametrize(
    ("caption", "parts"),
    [
        ("Turkey on Platter, bird.", ("turkey on platter", "bird")),
        ("Turkey on Platter, meats and eggs.", ("turkey on platter", "meats and eggs")),
        ("A mammal.", (None, "mammal")),
        ("A mammal on a flag.", ("a mammal on a flag", None)),  # a sentence, not the bare phrase
        ("Tree whit fruits.", ("tree whit fruits", None)),  # a title or description alone
        ("United States - South Carolina, flag.", ("united states - south carolina", "flag")),
        ("Ready, set, go.", ("ready, set, go", None)),  # its last comma is not followed by a category phrase
        ("", (None, None)),
    ],
)
def test_a_caption_splits_into_its_title_and_its_category_phrase(study, caption, parts):
    assert study.caption_parts(caption, PHRASES) == parts


def test_category_phrases_come_from_the_folder_and_the_duplicates_folders(study):
    entries = [
        {"image_id": "t", "category": "animals/birds/",
         "duplicates": ["food/meats_and_eggs/t.svg", "recreation/holiday/thanksgiving/t.svg"]},
        {"image_id": "p", "category": "animals/mammals/"},
    ]  # fmt: skip
    phrases = study.category_phrases(entries)
    assert phrases["p"] == {"mammal"}
    assert {"bird", "meats and eggs"} <= phrases["t"]


def test_the_report_counts_named_categories_shared_title_words_and_bare_categories(study):
    references = {
        "a": ["Puffin md, bird."],
        "b": ["Turkey on Platter, bird.", "Turkey on Platter, meats and eggs."],
        "c": ["Blue whale, mammal."],
        "d": ["Flag of Peru, flag."],
    }
    categories = {"a": {"bird"}, "b": {"bird", "meats and eggs"}, "c": {"mammal"}, "d": {"flag"}}
    captions = {"a": "A bird.", "b": "Turkey, meats and eggs.", "c": "A bird.", "d": "Peru."}
    report = study.part_report(captions, references, categories)
    assert report["images"] == 4
    assert report["category_named_right"] == 0.5  # a and b; c names another category; d names none
    assert report["title_word_shared"] == 0.5  # b ("turkey") and d ("peru")
    assert report["category_only_captions"] == 2  # a and c
    assert report["distinct_captions"] == 3 and report["most_frequent"][0] == ("A bird.", 2)
    assert report["mean_words"] == 2.25  # (2 + 4 + 2 + 1) / 4
    exact = study.part_report({key: refs[0] for key, refs in references.items()}, references, categories)
    assert exact["CIDEr_title_part_only"] > 0 and exact["CIDEr_category_part_only"] > 0
    of_only = study.part_report({"d": "Map of Chile."}, references, categories)
    assert of_only["title_word_shared"] == 0  # "of" alone is not a shared title word
    bare = study.part_report({"a": "A bird.", "c": "A mammal."}, references, categories)
    assert bare["CIDEr_title_part_only"] == 0  # no caption has a title: every title part is empty


def test_the_study_runs_as_a_user_runs_it_on_a_results_file(study, tmp_path, capsys, monkeypatch):
    entries = [
        {"filepath": "images", "filename": f"{key}.png", "image_id": key, "split": "val", "category": folder,
         "sentences": [{"raw": caption}]}
        for key, folder, caption in [("a", "animals/birds/", "Puffin md, bird."),
                                     ("c", "animals/mammals/", "Blue whale, mammal.")]
    ]  # fmt: skip
    data = tmp_path / "dataset.json"
    data.write_text(json.dumps({"dataset": "itune-clipart", "images": entries}))
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": "a", "caption": "A bird."}, {"image_id": "c", "caption": "Whale."}]))
    monkeypatch.setattr(sys, "argv", ["study_caption_parts.py", "--data", str(data), "--split", "val",
                                      f"model={results}"])  # fmt: skip
    report = study.main()
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report))
    assert report["model"]["category_named_right"] == 0.5 and report["model"]["title_word_shared"] == 0.5
    with pytest.raises(SystemExit):
        study.main(["--data", str(data)])  # neither a results file nor a cache: refused
