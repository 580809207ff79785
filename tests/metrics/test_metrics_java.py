"""METEOR_jar and SPICE: pycocoevalcap's Java tools where they can run, "unavailable: <reason>" otherwise (METEOR
itself is pure Python: tests/metrics/test_meteor.py)."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import shutil

import pytest
from metrics_support import coco_tokenize

from itune_hf.metrics import java_metrics, score_captions, score_captions_detailed
from itune_hf.metrics.synthetic import make_corpus

JAVA_REASON = java_metrics.unavailable_reason("METEOR")


def _reference_meteor(predictions, references):
    """pycocoevalcap's own tokenizer and Meteor wrapper on the same captions."""
    from pycocoevalcap.meteor.meteor import Meteor

    gts = coco_tokenize(references)
    res = coco_tokenize({key: [predictions[key]] for key in references})
    meteor = Meteor()
    try:
        return meteor.compute_score(gts, res)
    finally:
        del meteor


@pytest.mark.slow
def test_meteor_jar_where_java_runs_else_unavailable():
    predictions, references = make_corpus(40, 5, seed=11)
    metrics = ["METEOR_jar", "METEOR", "BLEU"]
    if JAVA_REASON is not None:
        result = score_captions_detailed(predictions, references, metrics=metrics)
        assert result.scores["METEOR_jar"] == JAVA_REASON
        assert JAVA_REASON.startswith("unavailable: ")
        return
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # both start a JVM for seconds: overlap them
        reference = pool.submit(_reference_meteor, predictions, references)
        result = score_captions_detailed(predictions, references, metrics=metrics)
        expected, expected_per_image = reference.result()
    assert isinstance(result.scores["METEOR_jar"], float)
    for key in ("METEOR_jar", "METEOR"):  # the jar through the registry, and the pure-Python METEOR, equal it
        assert result.scores[key] == pytest.approx(expected, abs=1e-9)
        assert [result.per_image[k][key] for k in references] == pytest.approx(expected_per_image, abs=1e-9)
    assert 0.05 < result.scores["METEOR"] < 0.9


def test_java_metrics_without_java_are_unavailable_not_a_number(monkeypatch):
    monkeypatch.setattr(java_metrics.shutil, "which", lambda name: None)
    scores = score_captions({1: "a dog"}, {1: ["a dog runs"]}, metrics=["METEOR_jar", "SPICE", "CIDEr", "METEOR"])
    assert scores["METEOR_jar"] == "unavailable: METEOR needs Java (no `java` on PATH)"
    assert scores["SPICE"] == "unavailable: SPICE needs Java (no `java` on PATH)"
    assert isinstance(scores["CIDEr"], float)  # the pure-Python metrics never need Java
    assert isinstance(scores["METEOR"], float)  # nor does METEOR


def test_meteor_without_pycocoevalcap_is_unavailable(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        java_metrics.importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("pycocoevalcap") else real_find_spec(name, *a),
    )
    scores = score_captions({1: "a dog"}, {1: ["a dog runs"]}, metrics=["METEOR_jar"])
    assert scores["METEOR_jar"] == "unavailable: METEOR runs pycocoevalcap's Java tools; pycocoevalcap is not installed"


def test_spice_reports_why_it_cannot_run():
    scores = score_captions({1: "a dog runs"}, {1: ["a dog is running", "a dog"]}, metrics=["SPICE"])
    reason = java_metrics.unavailable_reason("SPICE")
    if reason is None:  # CoreNLP is installed: SPICE really runs
        assert isinstance(scores["SPICE"], float) or scores["SPICE"].startswith("unavailable: SPICE failed")
    else:
        assert scores["SPICE"] == reason
        if importlib.util.find_spec("pycocoevalcap") and shutil.which("java"):
            assert "Stanford CoreNLP 3.6.0" in reason and "nlp.stanford.edu" in reason


def test_a_failing_java_tool_is_reported_not_scored(monkeypatch):
    if JAVA_REASON is not None:
        pytest.skip(f"METEOR cannot start here: {JAVA_REASON}")
    import pycocoevalcap.meteor.meteor as meteor_module

    class Broken:
        def compute_score(self, gts, res):
            raise RuntimeError("the jar crashed")

    monkeypatch.setattr(meteor_module, "Meteor", Broken)
    scores = score_captions({1: "a dog"}, {1: ["a dog runs"]}, metrics=["METEOR_jar"])
    assert scores["METEOR_jar"] == "unavailable: METEOR failed: RuntimeError: the jar crashed"
