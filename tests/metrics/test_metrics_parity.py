"""Parity with pycocoevalcap 1.2 (Java PTB tokenizer + BLEU, ROUGE-L, CIDEr-D) on generated corpora.

Two corpora of 1,000 images x 5 references: COCO-like captions, and captions full of tokeniser edge cases
(punctuation of every kind, casing, empty and very long captions, unicode, odd spaces, embedded newlines). Every
caption's tokenisation, every corpus score and every per-image score must equal pycocoevalcap's (to 1e-9; the
requirement is 1e-6). Skipped, with the reason, where Java or pycocoevalcap is missing.
"""

from __future__ import annotations

import random

import pytest
from metrics_support import coco_scores, coco_tokenize, coco_tokenize_list, requires_coco

from itune_hf.metrics import FAST_METRICS, DocumentFrequency, score_captions_detailed, tokenize, tokenize_captions
from itune_hf.metrics.synthetic import make_corpus

pytestmark = requires_coco

NUM_IMAGES = 1000
TOLERANCE = 1e-9


@pytest.fixture(scope="module", params=["coco-like", "hard"])
def corpus(request):
    predictions, references = make_corpus(NUM_IMAGES, 5, seed=2026, hard=request.param == "hard")
    return request.param, predictions, references


@pytest.fixture(scope="module")
def reference(corpus):
    """pycocoevalcap's tokenisation and scores of the corpus (computed once per corpus)."""
    _, predictions, references = corpus
    gts = coco_tokenize(references)
    res = coco_tokenize({key: [predictions[key]] for key in references})
    scores, per_image = coco_scores({k: res[k][0] for k in references}, gts, tokenize=False)
    return gts, res, scores, per_image


def test_corpus_has_what_the_parity_must_cover(corpus):
    kind, predictions, references = corpus
    captions = [c for refs in references.values() for c in refs] + list(predictions.values())
    assert len(references) >= 1000 and all(len(refs) == 5 for refs in references.values())
    if kind == "hard":
        assert any(c == "" for c in captions)
        assert any(len(c.split()) > 150 for c in captions)
        assert any(not c.isascii() for c in captions)
        assert any(c.isupper() for c in captions)
        assert any("\n" in c for c in captions)
        assert sum(any(p in c for p in "()[]{}\"'`,;:!?") for c in captions) > 1000


def test_tokenisation_equals_coco_caption(corpus, reference):
    _, predictions, references = corpus
    gts, res, _, _ = reference
    assert tokenize(references) == gts
    assert tokenize({key: [predictions[key]] for key in references}) == res


def test_scores_equal_coco_caption(corpus, reference):
    _, predictions, references = corpus
    ours = score_captions_detailed(predictions, references, metrics=FAST_METRICS)
    _, _, theirs, theirs_per_image = reference
    assert list(ours.scores) == ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"]
    for name, value in theirs.items():
        assert abs(ours.scores[name] - value) <= TOLERANCE, (name, ours.scores[name], value)
        per_image = [ours.per_image[key][name] for key in references]
        worst = max(abs(a - b) for a, b in zip(per_image, theirs_per_image[name]))
        assert worst <= TOLERANCE, (name, worst)
    assert 0.05 < theirs["CIDEr"] < 5 and 0.1 < theirs["Bleu_4"] < 0.9  # a meaningful corpus, not all 0 or 1


def test_fixed_idf_corpus_of_the_references_themselves_equals_coco_caption(corpus, reference):
    _, predictions, references = corpus
    gts, _, theirs, _ = reference
    ours = score_captions_detailed(predictions, references, metrics=["CIDEr"], idf_corpus=references)
    assert abs(ours.scores["CIDEr"] - theirs["CIDEr"]) <= TOLERANCE
    df = DocumentFrequency.from_references(gts.values())
    assert score_captions_detailed(predictions, references, metrics=["CIDEr"], idf_corpus=df).scores == ours.scores


PIECES = (
    "I. A. a. B. U.S. U.K. fig. Fig. no. No. ca. pty. PTY. co. Co. etc. Inc. Mr. Ph.D. a.k.a. vs. St. Calif. "
    "The the An "
    "It Ltd ltd LTD lim 5 12 555 1234 5678 (555) 1/2 3/4 . .. ... .5 5. <b> </b> <!x> < > '90 ' \" x@y.com "
    "a\u3000b@c.d www.x.com http://x.y/z google.com example.org/a\u00a0 \u00a0 \u3000 dog Dog DOG o'clock don't - -- "
    ":) ;) ( ) 1990s 24/7 and/or e-mail \u00bd &amp; &lt;"
).split(" ") + ["<a href='x y'>", ". ."]
SEPARATORS = [" ", " ", " ", "  ", "", "\n", "\t", "\u00a0", " \u00a0", "\t\u3000", "\u2003 ", " \t ", "\u200b", "\x85"]


def test_tokenisation_of_dense_edge_cases_equals_coco_caption():
    # short captions packed with what interacts across spaces and lines: abbreviations and acronyms before
    # sentence starts, numbers, "Ltd"; spaced ellipses; phone numbers; markup; URLs after odd spaces
    rng = random.Random(20261122)
    captions = [
        "".join(rng.choice(PIECES) + rng.choice(SEPARATORS) for _ in range(rng.randint(0, 8))) for _ in range(3000)
    ]
    assert tokenize_captions(captions) == coco_tokenize_list(captions)


SOUP_CHARACTERS = list("aaaabcdeilmnostuxyzAIBCDLMNSTUX0123456789.,;:!?'\"`-_/\\()[]{}<>@#$%&*+=|~^") + [" "] * 12
SOUP_CHARACTERS += list("\t\u00a0\u3000\u2002\u200b\x85\n\u00e9\u00df\u03a3\u6771\u2018\u2019\u201c\u201d\u00ab\u00bb")
SOUP_CHARACTERS += list("\u2013\u2014\u2026\u00bd\u20ac\u00a3\u00a2\u00ad") + ["\U0001f600"]
SOUP_FRAGMENTS = [
    "&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&nbsp;", "&eacute;", "&mdash;", "http://", "www.", ".com", ".org",
    "n't", "'s", "'ll", "U.S.", "Mr.", "etc.", "Ltd", "The ", "A. ", "cannot", "gonna", "c++", "C#", "o'", "-LRB-",
    "<a b='c'>", ":)", "^_^", "(x_x)", "555-1234", "1 1/2", ". . .", "'90s", "y'all",
]  # fmt: skip


def test_tokenisation_of_character_soup_equals_coco_caption():
    # random characters and fragments: every rule against every other, quotes, entities, odd spaces, astral
    # characters (two UTF-16 units to the Java lexer), Greek capital sigma next to anything
    rng = random.Random(7)
    captions = [
        "".join(
            rng.choice(SOUP_FRAGMENTS) if rng.random() < 0.15 else rng.choice(SOUP_CHARACTERS)
            for _ in range(rng.randint(0, 30))
        )
        for _ in range(3000)
    ]
    assert tokenize_captions(captions) == coco_tokenize_list(captions)
