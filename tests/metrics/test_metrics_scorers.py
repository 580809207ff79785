"""BLEU, ROUGE-L and CIDEr-D: hand-computed values, coco-caption's quirks, the scoring API."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from metrics_support import coco_scores, requires_coco

from itune_hf.metrics import (
    FAST_METRICS,
    DocumentFrequency,
    bleu_scores,
    cider_d_scores,
    rouge_l_scores,
    score_caption_groups,
    score_captions,
    score_captions_detailed,
)
from itune_hf.metrics.rouge import lcs_length
from itune_hf.metrics.scoring import normalize_metrics
from itune_hf.metrics.synthetic import make_corpus

TINY, SMALL = 1e-15, 1e-9  # coco-caption's BLEU smoothing constants


def smoothed(matches: float, total: float) -> float:
    return (matches + TINY) / (total + SMALL)


def brevity(hyp_len: float, ref_len: float) -> float:
    ratio = (hyp_len + TINY) / (ref_len + SMALL)
    return math.exp(1 - 1 / ratio) if ratio < 1 else 1.0


# ---------------------------------------------------------------------------------------------------------------- BLEU


def test_bleu_hand_computed():
    # unigrams 5/6 (the x2, cat, on, mat), bigrams 3/5 (the cat, on the, the mat), trigrams 1/4, 4-grams 0/3
    total, per_image = bleu_scores(["the cat sat on the mat"], [["the cat is on the mat"]])
    p = [smoothed(5, 6), smoothed(3, 5), smoothed(1, 4), smoothed(0, 3)]
    bp = brevity(6, 6)
    expected = [math.prod(p[: n + 1]) ** (1 / (n + 1)) * bp for n in range(4)]
    assert total == pytest.approx(expected, rel=1e-12)
    assert per_image[0] == pytest.approx(expected, rel=1e-12)
    assert total[1] == pytest.approx(math.sqrt(0.5), abs=1e-8)
    assert total[2] == pytest.approx(0.5, abs=1e-8)
    assert total[3] < 1e-3  # no 4-gram matches: only the 1e-15 smoothing is left


def test_bleu_closest_reference_length_prefers_the_shorter_on_a_tie():
    # hypothesis length 5; references 4 and 6 are equally close: coco-caption takes 4, so no brevity penalty
    total, _ = bleu_scores(["a b c d e"], [["a b c d", "a b c d e f"]])
    assert total[0] == pytest.approx(smoothed(5, 5) * brevity(5, 4), rel=1e-12)
    assert total[0] == pytest.approx(1.0, abs=1e-8)
    # references 6 and 7: the closest is 6, so the penalty is exp(1 - 6/5)
    total, _ = bleu_scores(["a b c d e"], [["a b c d e f", "a b c d e f g"]])
    assert total[0] == pytest.approx(math.exp(1 - 6 / 5), abs=1e-8)


def test_bleu_pools_counts_over_images_and_clips_by_the_best_single_reference():
    total, per_image = bleu_scores(["a b", "c d"], [["a b"], ["x y"]])
    assert total[0] == pytest.approx(smoothed(2, 4) * brevity(4, 4), rel=1e-12)
    assert per_image[:, 0] == pytest.approx([smoothed(2, 2) * brevity(2, 2), smoothed(0, 2) * brevity(2, 2)])
    # "a a a a" against refs with two and one "a": clipped to 2, the largest count in one reference
    total, _ = bleu_scores(["a a a a"], [["a a b c", "a d e f"]])
    assert total[0] == pytest.approx(smoothed(2, 4) * brevity(4, 4), rel=1e-12)


# ------------------------------------------------------------------------------------------------------------- ROUGE-L


def test_lcs_against_dynamic_programming():
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 70))]
        b = [rng.choice("abcd") for _ in range(rng.randint(0, 70))]
        table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i in range(1, len(a) + 1):
            for j in range(1, len(b) + 1):
                same = a[i - 1] == b[j - 1]
                table[i][j] = table[i - 1][j - 1] + 1 if same else max(table[i - 1][j], table[i][j - 1])
        assert lcs_length(a, b) == table[len(a)][len(b)]


def test_rouge_l_hand_computed():
    # LCS("a b c d", "a c d e f") = 3: precision 3/4, recall 3/5, beta = 1.2
    score, per_image = rouge_l_scores(["a b c d"], [["a c d e f"]])
    p, r, b2 = 3 / 4, 3 / 5, 1.2**2
    assert score == pytest.approx((1 + b2) * p * r / (r + b2 * p), rel=1e-15)
    assert per_image.tolist() == [score]


def test_rouge_l_maximises_precision_and_recall_separately():
    # best precision comes from one reference, best recall from the other: both are 1, so F = 1
    score, _ = rouge_l_scores(["a b c d"], [["a b", "a b c d e f g h"]])
    assert score == pytest.approx(1.0, rel=1e-15)


def test_rouge_l_empty_captions_are_one_empty_token():
    # coco-caption splits on " ": "" is [""], which matches an empty reference
    assert rouge_l_scores([""], [[""]])[0] == 1.0
    assert rouge_l_scores([""], [["a dog"]])[0] == 0.0
    assert rouge_l_scores(["a dog", ""], [["a dog"], ["x", ""]])[0] == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------------------- CIDEr-D


def test_cider_d_hand_computed():
    # df over the references: every n-gram is in one image's references, D = 2, so every weight is log 2 and the
    # cosines are those of the count vectors. Length penalty: bigram counts differ by 1 for both images.
    score, per_image = cider_d_scores(["a b c", "x"], [["a b"], ["x y"]])
    penalty = math.exp(-1 / (2 * 6.0**2))
    image0 = (2 / math.sqrt(6) + 1 / math.sqrt(2) + 0 + 0) / 4 * penalty * 10
    image1 = (1 / math.sqrt(2) + 0 + 0 + 0) / 4 * penalty * 10
    assert per_image == pytest.approx([image0, image1], rel=1e-12)
    assert score == pytest.approx((image0 + image1) / 2, rel=1e-12)


def test_cider_d_identical_captions_score_ten_and_one_image_scores_zero():
    score, per_image = cider_d_scores(["a b c d", "e f g h"], [["a b c d"], ["e f g h"]])
    assert per_image == pytest.approx([10.0, 10.0], rel=1e-12)
    # one image: idf = log(1) - log(1) = 0 for every reference n-gram, so coco-caption's CIDEr is 0
    assert cider_d_scores(["a b"], [["a b"]])[0] == 0.0


def test_cider_d_with_document_frequencies_from_another_corpus():
    corpus = [["a b", "a c"], ["a d"], ["x"]]  # D = 3; df: a 2, b c d x 1, "a b" "a c" "a d" 1
    df = DocumentFrequency.from_references(corpus)
    assert df.num_images == 3 and df.counts[("a",)] == 2 and df.counts[("a", "b")] == 1
    score, per_image = cider_d_scores(["a b c", "x"], [["a b"], ["x y"]], document_frequency=df)
    log3 = math.log(3)
    wa, wb, wc = log3 - math.log(2), log3, log3  # "c" is not in the corpus: df 0 counts as 1
    val1 = (wa**2 + wb**2) / (math.sqrt(wa**2 + wb**2 + wc**2) * math.sqrt(wa**2 + wb**2))
    penalty = math.exp(-1 / 72)
    image0 = (val1 + 1 / math.sqrt(2)) / 4 * penalty * 10
    image1 = (1 / math.sqrt(2)) / 4 * penalty * 10  # "x" vs "x y", both weighted log 3
    assert per_image == pytest.approx([image0, image1], rel=1e-12)
    assert score == pytest.approx((image0 + image1) / 2, rel=1e-12)


def test_idf_corpus_equal_to_the_references_gives_the_default_cider():
    hyps = ["a man rides a horse", "two dogs play", "a red car"]
    refs = [["a man riding a horse", "a person on a horse"], ["dogs playing", "two dogs in a park"], ["a car"]]
    default = cider_d_scores(hyps, refs)
    fixed = cider_d_scores(hyps, refs, document_frequency=DocumentFrequency.from_references(refs))
    assert fixed[0] == pytest.approx(default[0], rel=1e-12)
    assert fixed[1] == pytest.approx(default[1], rel=1e-12)


# ------------------------------------------------------------------------------------------------ edge cases vs coco

EDGE_PREDICTIONS = {
    1: "",
    2: "a a a a a a",
    3: "A dog.",
    4: "call (555) 555-1234 now",  # a phone-number token with a non-breaking space inside
    5: " ".join(["word"] * 120),
    6: "Caf\u00e9 \u6771\u4eac \U0001f436 na\u00efve",
    7: "a man riding a horse",
    8: "!!!",
}
EDGE_REFERENCES = {
    1: ["a cat", "a small cat on a mat"],
    2: ["a dog", "a a b"],
    3: ["", "a dog", "dog"],
    4: ["call (555) 555-1234", "a phone number"],
    5: ["word word", "many words"],
    6: ["caf\u00e9 \u6771\u4eac", "naive cafe"],
    7: ["a man riding a horse"] * 5,
    8: ["?", "wow!"],
}


@requires_coco
def test_edge_cases_agree_with_coco_caption():
    ours = score_captions_detailed(EDGE_PREDICTIONS, EDGE_REFERENCES, metrics=FAST_METRICS)
    theirs, theirs_per_image = coco_scores(EDGE_PREDICTIONS, EDGE_REFERENCES)
    assert ours.scores.keys() == theirs.keys()
    for name, value in theirs.items():
        assert ours.scores[name] == pytest.approx(value, abs=1e-9), name
        per_image = [ours.per_image[k][name] for k in EDGE_REFERENCES]
        assert per_image == pytest.approx(theirs_per_image[name], abs=1e-9), name


def test_edge_cases_score_without_errors_where_coco_caption_crashes():
    # all references empty: coco-caption's CIDEr fails on max() of no document frequencies; here it is 0
    scores = score_captions({1: "a dog", 2: ""}, {1: [""], 2: ["", ""]}, metrics=FAST_METRICS)
    assert scores["CIDEr"] == 0.0
    assert scores["Bleu_1"] < 1e-15  # no match: only coco-caption's 1e-15 smoothing


# --------------------------------------------------------------------------------------------------------------- API


def test_score_captions_keys_and_order():
    scores = score_captions({"x": "a dog runs"}, {"x": ["a dog runs", "a dog"]}, metrics=["cider", "Bleu_4", "rouge"])
    assert list(scores) == ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"]
    assert all(isinstance(v, float) for v in scores.values())
    assert normalize_metrics(None) == (
        "BLEU", "METEOR", "ROUGE_L", "CIDEr", "SPICE", "Objects", "ContentWords", "CHAIR",
    )  # fmt: skip
    assert normalize_metrics(["meteor-jar", "meteor"]) == ("METEOR", "METEOR_jar")
    with pytest.raises(ValueError, match="Unknown metric 'bleurt'"):
        normalize_metrics(["bleurt"])


def test_mismatched_image_ids_are_an_error_listing_a_few():
    predictions = {i: "a dog" for i in range(20)}
    references = {i: ["a dog"] for i in range(3, 30)}
    with pytest.raises(ValueError) as error:
        score_captions(predictions, references, metrics=FAST_METRICS)
    message = str(error.value)
    assert "10 image(s) have references but no prediction (e.g. 20, 21, 22, 23, 24, ...)" in message
    assert "3 image(s) have a prediction but no references (e.g. 0, 1, 2)" in message


@pytest.mark.parametrize(
    ("references", "message"),
    [
        ({1: []}, "Image 1 has no reference caption"),
        ({1: "a dog"}, "References of image 1 must be a list of strings"),
        ({1: ["a dog", 3]}, "A reference of image 1 is int"),
        ({}, "Image ids of predictions and references differ"),
    ],
)
def test_bad_references_are_errors_naming_the_image(references, message):
    with pytest.raises(ValueError, match=message):
        score_captions({1: "a dog"}, references, metrics=FAST_METRICS)


def test_per_image_scores_average_to_the_corpus_scores():
    predictions = {"a": "a man rides a horse", "b": "two dogs play", "c": "a red car on a road"}
    references = {"a": ["a man riding a horse"], "b": ["dogs playing", "two dogs"], "c": ["a car", "a red car"]}
    result = score_captions_detailed(predictions, references, metrics=FAST_METRICS)
    assert list(result.per_image) == ["a", "b", "c"]
    for name in ("ROUGE_L", "CIDEr"):
        mean = np.mean([result.per_image[k][name] for k in references])
        assert result.scores[name] == pytest.approx(mean, rel=1e-12)


def test_groups_are_scored_on_their_own():
    predictions, references = make_corpus(30, seed=5)
    groups = {"in-domain": range(0, 10), "near-domain": range(10, 20), "out-domain": range(20, 30)}
    groups = {name: list(ids) for name, ids in groups.items()}
    groups["overall"] = list(range(30))
    results = score_caption_groups(predictions, references, groups, metrics=FAST_METRICS)
    assert list(results) == ["in-domain", "near-domain", "out-domain", "overall"]
    for name, members in groups.items():
        alone = score_captions(
            {i: predictions[i] for i in members}, {i: references[i] for i in members}, metrics=FAST_METRICS
        )
        assert results[name] == alone
    # CIDEr-D of a group uses that group's document frequencies, so it is not the mean of the other groups
    assert results["overall"]["CIDEr"] != pytest.approx(np.mean([results[g]["CIDEr"] for g in list(groups)[:3]]))
    with pytest.raises(ValueError, match="Group 'bad' has image ids without references"):
        score_caption_groups(predictions, references, {"bad": [99]}, metrics=FAST_METRICS)


def test_tokenized_input_skips_ptb_tokenisation():
    raw = score_captions({1: "A dog, running."}, {1: ["A dog running"]}, metrics=["bleu"])
    assert raw["Bleu_1"] == pytest.approx(1.0, abs=1e-8)  # "a dog running" after tokenisation
    as_is = score_captions({1: "A dog, running."}, {1: ["A dog running"]}, metrics=["bleu"], tokenized=True)
    assert as_is["Bleu_1"] == pytest.approx(smoothed(1, 3) * brevity(3, 3), rel=1e-12)  # only "A" matches
