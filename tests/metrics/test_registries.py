"""The metric and data-format registries: a toy entry registered is used end to end, then unregistered."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from itune_hf.cli import main
from itune_hf.data import DataFormatError, detect_format, load_captions
from itune_hf.data.formats import DataFormat, list_formats, register_format, unregister_format
from itune_hf.metrics import (
    ALL_METRICS,
    FAST_METRICS,
    SCENE_METRICS,
    CaptionScorer,
    Metric,
    metric_names,
    normalize_metrics,
    register_metric,
    score_caption_groups,
    score_captions,
    unregister_metric,
)
from itune_hf.metrics.registry import card_metrics, describe_metrics, get_metric


def _lengths(captions) -> dict:
    """Toy metric: the prediction's length in tokens and its ratio to the first reference's (two keys)."""
    words = np.array([len(h.split()) for h in captions.hypotheses], dtype=float)
    ratio = words / np.array([len(refs[0].split()) for refs in captions.references], dtype=float)
    return {"Words": (float(words.mean()), words), "Ratio": (float(ratio.mean()), ratio)}


@pytest.fixture
def toy_metric():
    metric = register_metric(
        Metric("LENGTH", keys=("Words", "Ratio"), score=_lengths, aliases=("len",), card_key="Words", card_name="Len")
    )
    try:
        yield metric
    finally:
        unregister_metric("LENGTH")
    assert metric_names() == (*ALL_METRICS, *SCENE_METRICS, "METEOR_jar")


def test_a_registered_metric_is_scored_end_to_end(toy_metric):
    predictions = {1: "A dog runs on the grass.", 2: "Two cats."}
    references = {1: ["A dog running on grass."], 2: ["Two cats sleep on a sofa.", "Cats."]}
    scores = score_captions(predictions, references, metrics=["len", "cider"])
    # report order is registration order; PTB tokenisation happened before the metric saw the captions
    assert list(scores) == ["CIDEr", "Words", "Ratio"]
    assert scores["Words"] == pytest.approx((6 + 2) / 2)  # "a dog runs on the grass" and "two cats"
    assert scores["Ratio"] == pytest.approx((6 / 5 + 2 / 6) / 2)
    assert score_captions(predictions, references, metrics=["Ratio"]) == {"Words": 4.0, "Ratio": scores["Ratio"]}
    # None means every metric scored by default; FAST_METRICS / ALL_METRICS stay the built-in ones
    assert normalize_metrics(None) == (*ALL_METRICS, *SCENE_METRICS, "LENGTH")
    assert metric_names(fast=True) == (*FAST_METRICS, *SCENE_METRICS, "LENGTH")
    groups = score_caption_groups(predictions, references, {"one": [1], "all": [1, 2]}, metrics=["length"])
    assert groups["one"] == {"Words": 6.0, "Ratio": pytest.approx(6 / 5)}
    with CaptionScorer(["LENGTH"]) as scorer:
        per_image = scorer.score(predictions, references).per_image
    assert per_image == {
        1: {"Words": 6.0, "Ratio": pytest.approx(1.2)},
        2: {"Words": 2.0, "Ratio": pytest.approx(1 / 3)},
    }
    assert card_metrics()[-1].card_name == "Len" and "LENGTH (Words, Ratio)" in describe_metrics()


def test_a_registered_metric_is_offered_by_itune_score(toy_metric, tmp_path, capsys):
    (tmp_path / "p.json").write_text(json.dumps([{"image_id": 1, "caption": "a dog"}]))
    (tmp_path / "r.json").write_text(json.dumps({"annotations": [{"image_id": 1, "caption": "a dog runs"}]}))
    assert main(["score", str(tmp_path / "p.json"), str(tmp_path / "r.json"), "--metrics", "bleu,len"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert list(scores) == ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "Words", "Ratio"]
    assert (scores["Words"], scores["Ratio"]) == (2.0, pytest.approx(2 / 3))


def test_metric_registration_is_checked():
    with pytest.raises(ValueError, match=r"Cannot register metric 'X': 'cider' \(of CIDEr\) already taken"):
        register_metric(Metric("X", keys=("cider",), score=_lengths))
    with pytest.raises(ValueError, match="before='nope' is not a registered metric"):
        register_metric(Metric("X", keys=("X",), score=_lengths), before="nope")
    with pytest.raises(ValueError, match="card_key 'Y' is not one of its keys"):
        Metric("X", keys=("X",), score=_lengths, card_key="Y", card_name="Y")
    with pytest.raises(ValueError, match="Unknown metric 'x'; choose from BLEU, METEOR, ROUGE_L, CIDEr, SPICE"):
        get_metric("x")
    assert ALL_METRICS == ("BLEU", "METEOR", "ROUGE_L", "CIDEr", "SPICE")
    assert SCENE_METRICS == ("Objects", "ContentWords", "CHAIR")
    assert metric_names() == (*ALL_METRICS, *SCENE_METRICS, "METEOR_jar")  # the jar: only asked for by name
    assert FAST_METRICS == ("BLEU", "ROUGE_L", "CIDEr")
    assert metric_names(fast=True) == (*FAST_METRICS, *SCENE_METRICS)
    assert metric_names(fast=False) == ("METEOR", "SPICE", "METEOR_jar")
    assert [m.card_name for m in card_metrics()] == [
        "CIDEr", "BLEU-4", "METEOR", "ROUGE-L", "SPICE", "Object F1", "Content-word F1",
    ]  # fmt: skip


def _load_pairs(parsed, path, image_root, split, *, on_missing, check_counts, prefix="") -> object:
    """Toy format: {"pairs": [[file name, caption], ...]}, all in the test split."""
    from datasets import DatasetDict

    from itune_hf.data._common import check_files, rows_to_dataset

    root = image_root or path.parent
    rows = [
        {"image_id": name, "image_path": str(root / name), "captions": [prefix + caption], "split": "test"}
        for name, caption in parsed["pairs"]
    ]
    rows, _ = check_files(rows, on_missing=on_missing, source=str(path), image_root=str(root))
    dataset = rows_to_dataset(rows)
    return dataset if split is not None else DatasetDict({"test": dataset})


@pytest.fixture
def toy_format():
    is_pairs = lambda data: isinstance(data, dict) and "pairs" in data  # noqa: E731
    entry = register_format(
        DataFormat("pairs", detect=is_pairs, load=_load_pairs, title="Caption pairs", shape="{'pairs': [[...]]}"),
        before="coco",
    )
    try:
        yield entry
    finally:
        unregister_format("pairs")
    assert [f.name for f in list_formats()] == ["webdataset", "visual_genome", "karpathy", "nocaps", "coco"]


def test_a_registered_format_is_detected_and_loaded_by_load_captions(toy_format, tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    data = {"pairs": [["a.png", "a black square"], ["gone.png", "nothing"]], "annotations": []}
    (tmp_path / "pairs.json").write_text(json.dumps(data))
    assert [f.name for f in list_formats()] == ["webdataset", "visual_genome", "karpathy", "nocaps", "pairs", "coco"]
    assert detect_format(data) == "pairs"  # before coco, which would claim it for its "annotations"
    with pytest.warns(UserWarning, match=r"gone.png \(no such file\)"):  # on_missing reaches the format's loader
        splits = load_captions(str(tmp_path / "pairs.json"), prefix="toy: ")  # and so do its own options
    assert list(splits) == ["test"] and splits["test"]["captions"] == [["toy: a black square"]]
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(DataFormatError, match=r"other.json: cannot tell the annotation format; .*Caption pairs"):
        load_captions(str(tmp_path / "other.json"), split="test")


def test_format_registration_is_checked():
    with pytest.raises(ValueError, match="'coco' is already registered"):
        register_format(DataFormat("coco", detect=bool, load=print, title="", shape=""))
    with pytest.raises(ValueError, match="'nope' is not a registered data format"):
        unregister_format("nope")
