"""Synthetic caption corpora with a fixed seed, for parity tests against coco-caption and for benchmarks.

`make_corpus(..., hard=False)` gives COCO-like captions: "a [adjective] noun [verb]ing [preposition] a noun"
sentences over a vocabulary with a Zipf-distributed long tail, with COCO's usual shapes (capitalised first word,
optional final period, some commas, possessives, contractions, numbers, hyphenated words). `hard=True` mixes in
what breaks tokenisers: quotes of every kind, brackets, abbreviations and acronyms, numbers with separators,
fractions, dashes, ellipses, URLs and e-mail addresses, accents, non-Latin scripts, emoji, non-breaking and
ideographic spaces, tabs, embedded newlines, upper case, empty captions and very long ones. Predictions are
perturbed references, so the scores are neither 0 nor 1.
"""

from __future__ import annotations

import itertools
import random

__all__ = ["make_corpus"]

_NOUNS = (
    "man woman person people men women child children boy girl group dog dogs cat cats horse bird birds bear "
    "elephant giraffe zebra cow sheep table plate food pizza sandwich cake bowl cup street road car bus train truck "
    "bike motorcycle boat plane kite frisbee ball bat racket surfboard skateboard snowboard skis wave beach water "
    "field grass snow park city building window room kitchen bathroom bed couch chair desk computer laptop phone "
    "clock sign light tree trees sky umbrella hat shirt jacket tie toilet sink mirror counter shelf oven vase "
    "flowers banana apple orange broccoli carrot donut player game fence wall floor plate"
).split()
_ADJECTIVES = "white black red blue green yellow brown large small big little young old tall wooden empty".split()
_VERBS = (
    "sitting standing walking riding holding playing eating looking flying laying parked wearing carrying "
    "watching throwing catching cutting"
).split()
_PREPOSITIONS = "on in with at near next to under over behind by of".split()
_DETERMINERS = "a a a a an the the the two three some his her their".split()
_PUNCT_ENDINGS = (".", ".", ".", "", "", "", " .", "!", "..")
_HARD_PIECES = (
    "\"quoted\" 'single' `back` \u2018curly\u2019 \u201cdouble\u201d \u00abguillemets\u00bb (in parentheses) "
    "[brackets] {braces} don't can't won't cannot gonna I'm it's he'll we'd they're o'clock y'all 'tis '90s "
    "Mr. Mrs. Dr. St. U.S. U.K. a.k.a. etc. e.g. i.e. Inc. vs. fig. 3 no. 5 A. I. 1,000 3.14 -5 +7 1/2 3 1/2 "
    "\u00bd 12/25/2014 555-1234 (555) 555-1234 5% $5 US$10 \u20ac20 \u00a33 \u00a2 # @user #tag e-mail t-shirt "
    "x-ray state-of-the-art -- --- ---- - ... .... \u2026 ; : ! ? !? & R&D AT&T &amp; &lt; &quot; c++ C# :) :-) "
    ";) ^_^ http://example.com/a?b=1 www.example.org example.com name@example.com file.jpg and/or w/ * ** / \\ | "
    "~ ^ = + caf\u00e9 na\u00efve \u00fcber Stra\u00dfe \u00c9COLE se\u00f1or \u6771\u4eac "
    "\u043f\u0440\u0438\u0432\u0435\u0442 \u039f\u0394\u039f\u03a3 \u0645\u0631\u062d\u0628\u0627 "
    "\u0928\u092e\u0938\u094d\u0924\u0947 \uff21\uff22\uff23\uff01 \U0001f600 \U0001f436 \u2764\ufe0f "
    "\u00a9 \u00ae \u00b0 \u00d7 \u2192 \u2605 e\u0301 soft\u00adhyphen"
).split()
_HARD_SEPARATORS = (" ", " ", " ", " ", " ", "  ", "\t", "\u00a0", "\u3000", "\n", "", ",", ", ", "-", "/", ". ")


def _made_up_words(rng: random.Random, count: int, taken: set[str]) -> list[str]:
    """Pronounceable made-up words: the long tail of a real caption vocabulary."""
    onsets = "b c d f g h j k l m n p r s t v w z br ch cl cr dr fl gr pl sh st th tr".split()
    vowels = "a e i o u ai ea ee oo ou".split()
    codas = ["", "", "n", "r", "s", "t", "l", "m", "ng", "ck", "st"]
    words: list[str] = []
    while len(words) < count:
        word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(1, 3))) + rng.choice(codas)
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


class _Vocabulary:
    """Nouns and adjectives with a Zipf-distributed long tail of made-up words, plus closed word classes."""

    def __init__(self, rng: random.Random, size: int) -> None:
        taken = set(_NOUNS) | set(_ADJECTIVES)
        extra = _made_up_words(rng, max(0, size - len(taken)), taken)
        self.nouns = list(_NOUNS) + extra[: len(extra) * 2 // 3]
        self.adjectives = list(_ADJECTIVES) + extra[len(extra) * 2 // 3 :]
        self.noun_weights = list(itertools.accumulate(1.0 / (rank + 1) ** 1.05 for rank in range(len(self.nouns))))
        self.adjective_weights = list(
            itertools.accumulate(1.0 / (rank + 1) ** 1.05 for rank in range(len(self.adjectives)))
        )

    def noun_phrase(self, rng: random.Random) -> list[str]:
        words = [rng.choice(_DETERMINERS)]
        if rng.random() < 0.5:
            words.append(rng.choices(self.adjectives, cum_weights=self.adjective_weights)[0])
        words.append(rng.choices(self.nouns, cum_weights=self.noun_weights)[0])
        if words[0] == "an" and words[1][0] not in "aeiou":
            words[0] = "a"
        return words

    def word(self, rng: random.Random) -> str:
        return rng.choices(self.nouns, cum_weights=self.noun_weights)[0]


def _sentence(rng: random.Random, vocabulary: _Vocabulary, hard: bool) -> str:
    tokens = vocabulary.noun_phrase(rng)
    if rng.random() < 0.3:
        tokens += ["and"] + vocabulary.noun_phrase(rng)
    tokens += [rng.choice(["is", "are", ""]), rng.choice(_VERBS)]
    tokens += vocabulary.noun_phrase(rng) if rng.random() < 0.4 else []
    for _ in range(rng.randint(1, 2)):
        tokens += [rng.choice(_PREPOSITIONS)] + vocabulary.noun_phrase(rng)
    tokens = [t for t in tokens if t]
    if hard and rng.random() < 0.03:  # very long
        for _ in range(rng.randint(40, 100)):
            tokens += [rng.choice(_PREPOSITIONS)] + vocabulary.noun_phrase(rng)
    if rng.random() < 0.1:
        tokens[rng.randrange(1, len(tokens))] = rng.choice(["man's", "dog's", "it's", "isn't", "they're", "woman's"])
    if rng.random() < 0.1:
        tokens[rng.randrange(len(tokens) - 1)] += ","
    if rng.random() < 0.1:
        tokens.insert(rng.randrange(len(tokens)), str(rng.randint(1, 12)))
    if rng.random() < 0.1:
        tokens.insert(rng.randrange(len(tokens)), rng.choice(["t-shirt", "hot-dog", "two-story", "black-and-white"]))
    if hard:
        for _ in range(rng.randint(0, 6)):
            tokens.insert(rng.randrange(len(tokens) + 1), rng.choice(_HARD_PIECES))
        text = "".join(token + rng.choice(_HARD_SEPARATORS) for token in tokens).strip(" ")
    else:
        text = " ".join(tokens)
    if rng.random() < 0.8:
        text = text[:1].upper() + text[1:]
    text += rng.choice(_PUNCT_ENDINGS)
    if hard:
        roll = rng.random()
        if roll < 0.04:
            text = ""
        elif roll < 0.08:
            text = text.upper()
        elif roll < 0.10:
            text = " " + text + "  "
    return text


def _perturb(rng: random.Random, reference: str, vocabulary: _Vocabulary) -> str:
    """A prediction made from a reference: some words dropped, replaced or added."""
    out = []
    for token in reference.split(" "):
        roll = rng.random()
        if roll < 0.1:
            continue
        if roll < 0.3:
            token = vocabulary.word(rng)
        out.append(token)
        if rng.random() < 0.05:
            out.append(vocabulary.word(rng))
    return " ".join(out)


def make_corpus(
    num_images: int, refs_per_image: int = 5, *, seed: int = 0, hard: bool = False, vocabulary_size: int = 3000
) -> tuple[dict[int, str], dict[int, list[str]]]:
    """A reproducible caption corpus: (predictions, references).

    Args:
        num_images: Number of images (ids 0..num_images-1).
        refs_per_image: References per image.
        seed: Random seed; the same arguments always give the same corpus.
        hard: Mix in tokeniser edge cases (punctuation, casing, unicode, empty and very long captions...).
        vocabulary_size: Number of distinct words to draw from (Zipf-distributed).

    Returns:
        `predictions` (image id -> one caption) and `references` (image id -> `refs_per_image` captions).
    """
    rng = random.Random(seed)
    vocabulary = _Vocabulary(rng, vocabulary_size)
    references: dict[int, list[str]] = {}
    predictions: dict[int, str] = {}
    for image in range(num_images):
        refs = [_sentence(rng, vocabulary, hard) for _ in range(refs_per_image)]
        references[image] = refs
        if hard and rng.random() < 0.05:
            predictions[image] = rng.choice(["", "a", "\U0001f600", " . ", _sentence(rng, vocabulary, hard)])
        else:
            predictions[image] = _perturb(rng, rng.choice(refs), vocabulary)
    return predictions, references
