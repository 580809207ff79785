"""Caption corpora that exercise every METEOR module: the parity test against the jar and the benchmark score them.

`HARD_CASES` are hand-written (prediction, references) pairs of what a reimplementation gets wrong: empty captions,
identical ones, long runs of one word (the beam search's limits), words whose Java hashes collide, the "|||"
separator inside a caption, abbreviations, contractions, numbers with commas, dashes, quotes, accents and Cyrillic,
tabs and non-breaking spaces, upper case, reordered words.

`make_meteor_corpus` starts from `make_corpus`'s COCO-like references and makes each prediction from one of them with
what each module matches: WordNet synonyms, inflections (the synonym module's irregular forms and regular suffixes,
which the stem module matches), phrases of the paraphrase table put in the reference and their paraphrases in the
prediction, repeated, dropped and swapped words; some predictions equal their reference, some are empty.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from ..synthetic import make_corpus
from .language_data import LanguageData

__all__ = ["HARD_CASES", "make_meteor_corpus"]

HARD_CASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("", ("a dog",)),
    ("a dog", ("",)),
    ("", ("",)),
    ("a dog runs", ("a dog runs",)),
    ("a dog runs", ("a dog runs", "a dog runs .")),
    ("the the the the", ("the dog",)),
    (" ".join(["a"] * 45), (" ".join(["a"] * 52),)),
    (" ".join(["a", "man", "and"] * 12), (" ".join(["man", "and", "a"] * 13),)),
    ("Aa", ("BB",)),  # String.hashCode() collision: the jar matches them exactly
    ("dogs running quickly", ("a dog ran quick",)),
    ("a car on the road", ("an automobile on the street",)),
    ("Mr. Smith went to the U.S. in 1990's .", ("mr smith went to the US in the 1990s",)),
    ("it's a 1,000-pound dog -- really", ("its a 1000 pound dog - really",)),
    ("a ||| b", ("a b", "c ||| d")),
    ('"quoted" `word\' \u201ccurly\u201d \u2018single\u2019', ("quoted word curly single",)),
    ("caf\u00e9 na\u00efve \u043f\u0440\u0438\u0432\u0435\u0442 \u00dcBER", ("cafe naive privet uber",)),
    ("A MAN RIDING A HORSE", ("a man riding a horse",)),
    ("a\tman  riding\u00a0a horse", ("a man riding a horse",)),
    ("No. 5 is the answer", ("no 5 is the answer",)),
    ("e.g. dogs, cats etc. and Inc. profits", ("for example dogs and cats",)),
    ("one two three four five six seven eight nine ten", ("ten nine eight seven six five four three two one",)),
    ("a man... and a dog!!", ("a man and a dog",)),
    ("x-ray of a t-shirt \u2013 U.S.-based", ("x ray of a t shirt us based",)),
)

_SUFFIXES = ("s", "es", "ing", "ed", "er", "est", "ly")


def _neighbours(synsets: Mapping[str, Sequence[int]], words: set[str]) -> dict[str, list[str]]:
    """Each of `words`' synonyms: the other words of its synonym sets."""
    members: dict[int, list[str]] = {}
    for word, sets in synsets.items():
        for number in sets:
            members.setdefault(number, []).append(word)
    return {
        word: sorted({other for n in synsets.get(word, ()) for other in members[n] if other != word}) for word in words
    }


def _inflections(exceptions: Mapping[str, Sequence[str]], words: set[str]) -> dict[str, list[str]]:
    """Other forms of each of `words`: irregular ones (both ways) and regular suffixes."""
    forms: dict[str, set[str]] = {word: {word + suffix for suffix in _SUFFIXES} for word in words}
    for form, bases in exceptions.items():
        for base in bases:
            if base in forms:
                forms[base].add(form)
            if form in forms:
                forms[form].add(base)
    return {word: sorted(found - {word}) for word, found in forms.items()}


def _variant(rng: random.Random, words: list[str], synonyms: dict, inflections: dict) -> list[str]:
    out: list[str] = []
    for word in words:
        roll = rng.random()
        if roll < 0.05:
            continue
        if roll < 0.2 and synonyms.get(word):
            word = rng.choice(synonyms[word])
        elif roll < 0.35 and inflections.get(word):
            word = rng.choice(inflections[word])
        out.append(word)
        if rng.random() < 0.05:
            out.append(word)
    if len(out) > 2 and rng.random() < 0.3:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def make_meteor_corpus(
    num_images: int, refs_per_image: int = 5, *, seed: int = 0, data: LanguageData
) -> tuple[dict[int, str], dict[int, list[str]]]:
    """A reproducible corpus whose predictions match their references through every METEOR module.

    Args:
        num_images: Number of images (ids 0..num_images-1).
        refs_per_image: References per image.
        seed: Random seed.
        data: METEOR's language data (`load_language_data`): synonyms, irregular forms, paraphrases.

    Returns:
        (predictions, references) as `make_corpus` returns them.
    """
    rng = random.Random(seed)
    _, base = make_corpus(num_images, refs_per_image, seed=seed)
    references = {image: [r.lower().rstrip(" .!") for r in refs] for image, refs in base.items()}
    words = {w for refs in references.values() for r in refs for w in r.split()}
    synonyms, inflections = _neighbours(data.synsets, words), _inflections(data.exceptions, words)
    predictions = {}
    for image, refs in references.items():
        target = rng.randrange(len(refs))
        reference = refs[target].split()
        roll = rng.random()
        if roll < 0.03:
            predictions[image] = "" if rng.random() < 0.5 else refs[target]
            continue
        prediction = _variant(rng, reference, synonyms, inflections)
        if roll < 0.6:  # a paraphrase-table phrase in the reference, its paraphrase in the prediction
            phrase, paraphrase = data.paraphrases.entry(rng.randrange(len(data.paraphrases)))
            at = rng.randrange(len(reference) + 1)
            reference[at:at] = phrase
            near = min(len(prediction), max(0, at + rng.randint(-1, 1)))
            prediction[near:near] = paraphrase
            refs[target] = " ".join(reference)
        predictions[image] = " ".join(prediction)
    return predictions, references
