"""METEOR 1.5 scores from sufficient statistics, and `MeteorScorer`: pycocoevalcap's METEOR without Java.

The score is the jar's with `-l en -norm` (task "rank"): alpha 0.85, beta 0.2, gamma 0.6, delta 0.75; module
weights exact 1.0, stem 0.6, synonym 0.8, paraphrase 0.6. Per image, the hypothesis is aligned with each reference
and the reference with the highest score gives the image's statistics; the corpus score is computed once from the
statistics summed over images (a segment matched perfectly in one chunk adds no chunk), as pycocoevalcap's `EVAL`
line asks the jar to. Java's floating-point rules are kept: a division by zero gives infinity or NaN, and a NaN
score is 0.
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
from collections.abc import Hashable, Iterator, Mapping, Sequence

from .align import MODULES, Caption, CorpusIndex, WordFeatures, align
from .language_data import LanguageData, load_language_data, meteor_sources
from .normalize import java_split_words, java_trim, normalize_line

__all__ = ["ALPHA", "BETA", "DELTA", "GAMMA", "MODULE_WEIGHTS", "MeteorScorer", "meteor_score", "unavailable_reason"]

ALPHA, BETA, GAMMA, DELTA = 0.85, 0.2, 0.6, 0.75
#: The score's weights of exact, stem, synonym and paraphrase matches.
MODULE_WEIGHTS = (1.0, 0.6, 0.8, 0.6)
_SEPARATOR = re.compile(r"\|\|\|")
_PLAIN = re.compile("[A-Za-z0-9 ]*")
_MAX_REMEMBERED = 200_000  # normalised captions a scorer keeps
# Words whose English Snowball stem changed in Snowball 3.0; the jar has the older algorithm.
_STEMMER_PROBES = {"added": "ad", "emergence": "emerg", "biologist": "biologist"}


def _divide(numerator: float, denominator: float) -> float:
    """Java's double division: x / 0 is +-infinity, 0 / 0 and NaN operands are NaN."""
    if denominator == 0:
        if numerator == 0 or math.isnan(numerator):
            return math.nan
        return math.copysign(math.inf, numerator) * math.copysign(1.0, denominator)
    return numerator / denominator


def _perfect(stats: Sequence[float]) -> bool:
    """Every word of both captions matched, in one chunk."""
    modules = stats[4 : 4 + 4 * len(MODULES)]
    test_matched = sum(modules[0::4]) + sum(modules[2::4])
    reference_matched = sum(modules[1::4]) + sum(modules[3::4])
    return test_matched == stats[0] and reference_matched == stats[1] and stats[-3] == 1


def meteor_score(stats: Sequence[float]) -> float:
    """The METEOR score of sufficient statistics (`align.align`'s, or their sum; the jar's `computeMetrics`).

    Args:
        stats: Lengths, function words, four numbers per module, chunks, matched words of each caption.
    """
    test_length, reference_length, test_function, reference_function = stats[:4]
    modules = stats[4 : 4 + 4 * len(MODULES)]
    chunks, test_words, reference_words = stats[-3:]
    test_weighted_length = DELTA * (test_length - test_function) + (1.0 - DELTA) * test_function
    reference_weighted_length = DELTA * (reference_length - reference_function) + (1.0 - DELTA) * reference_function
    test_weighted = reference_weighted = 0.0
    for offset, factor in ((0, DELTA), (2, 1.0 - DELTA)):  # content matches, then function-word matches
        for module, weight in enumerate(MODULE_WEIGHTS):
            test_weighted += modules[4 * module + offset] * weight * factor
        for module, weight in enumerate(MODULE_WEIGHTS):
            reference_weighted += modules[4 * module + offset + 1] * weight * factor
    precision = _divide(test_weighted, test_weighted_length)
    recall = _divide(reference_weighted, reference_weighted_length)
    f_mean = _divide(1.0, _divide(1.0 - ALPHA, precision) + _divide(ALPHA, recall))
    fragmentation = 0.0 if _perfect(stats) else _divide(chunks, (test_words + reference_words) / 2)
    score = f_mean * (1.0 - GAMMA * math.pow(fragmentation, BETA))
    return 0.0 if math.isnan(score) else max(score, 0.0)


def corpus_statistics(per_image: Sequence[Sequence[float]]) -> list[float]:
    """The statistics summed over images; chunks only of the images not matched perfectly (the jar's `addStats`).

    Args:
        per_image: Each image's statistics (`MeteorScorer.statistics`).
    """
    total = [0.0] * (7 + 4 * len(MODULES))
    for stats in per_image:
        for position, value in enumerate(stats):
            if position != len(total) - 3 or not _perfect(stats):
                total[position] += value
    return total


def _stemmer():
    """The English Snowball stemmer the jar has, or why it is not installed."""
    try:
        import snowballstemmer
    except ImportError:
        return "METEOR's stem module needs snowballstemmer (pip install 'snowballstemmer>=2.2,<3')"
    stemmer = snowballstemmer.stemmer("english")
    wrong = {word: stemmer.stemWord(word) for word, stem in _STEMMER_PROBES.items() if stemmer.stemWord(word) != stem}
    if wrong:
        return (
            "METEOR's stem module needs the jar's English Snowball algorithm, which snowballstemmer 3 changed "
            f"({', '.join(f'{w!r} -> {s!r}' for w, s in wrong.items())}); pip install 'snowballstemmer>=2.2,<3'"
        )
    return stemmer.stemWord


def unavailable_reason() -> str | None:
    """Why METEOR cannot run without Java here ("unavailable: ..."), or None."""
    sources, stemmer = meteor_sources(), _stemmer()
    for problem in (sources, stemmer):
        if isinstance(problem, str):
            return f"unavailable: {problem}"
    return None


@contextlib.contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (reference counting still frees everything), as it was after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _segment(hypothesis: str, references: Sequence[str], key: Hashable) -> tuple[str, list[str]]:
    """The hypothesis and references as the jar reads pycocoevalcap's `SCORE` line for them."""
    hypothesis = hypothesis.replace("|||", "").replace("  ", " ")
    parts = _SEPARATOR.split(" ||| ".join(("SCORE", " ||| ".join(references), hypothesis)))
    while parts and parts[-1] == "":
        parts.pop()
    if len(parts) < 3:
        raise ValueError(f"METEOR cannot read image {key!r}'s captions: the jar needs a hypothesis and a reference")
    return java_trim(parts[-1]), [java_trim(part) for part in parts[1:-1]]


class MeteorScorer:
    """pycocoevalcap's METEOR 1.5 (`Meteor().compute_score`) in Python: the same scores without Java.

    The language data is read from the installed pycocoevalcap (`language_data.py`); the first scorer on a machine
    builds its cache (about 30 s), later ones load it in about 0.15 s.

    Args:
        data: Language data already loaded (`load_language_data`); None loads it.

    Raises:
        RuntimeError: pycocoevalcap or the jar's stemmer is not installed (says what to install).
        OSError: The cache cannot be written or read (`cache_dir()`, `$ITUNE_CACHE`).
    """

    def __init__(self, data: LanguageData | None = None) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason.removeprefix("unavailable: "))
        sources = meteor_sources()
        self.data = data if data is not None else load_language_data(sources)  # type: ignore[arg-type]
        self._features = WordFeatures(_stemmer(), self.data.synsets, self.data.exceptions, self.data.function_words)
        self._normalized: dict[str, tuple[str, ...]] = {}

    def words(self, caption: str) -> tuple[str, ...]:
        """A caption's words as the jar aligns them: normalised (`-norm`), lower-cased, split.

        Args:
            caption: The caption (trimmed as the jar trims it).
        """
        words = self._normalized.get(caption)
        if words is None:
            if len(self._normalized) > _MAX_REMEMBERED:  # a long-lived scorer (a reward) sees ever new captions
                self._normalized.clear()
            if _PLAIN.fullmatch(caption):  # letters, digits and spaces: the normaliser only collapses the spaces
                words = tuple(caption.lower().split())
            else:
                words = tuple(java_split_words(normalize_line(caption, self.data.prefixes).lower()))
            self._normalized[caption] = words
        return words

    def statistics(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> list[list[int]]:
        """Each hypothesis's statistics against its best reference (the jar's `SCORE` lines).

        Args:
            hypotheses: One caption per image (trimmed as the jar trims it).
            references: Each image's references.
        """
        with _without_cyclic_gc():  # millions of short-lived, acyclic objects: collecting them costs a third
            return self._statistics(hypotheses, references)

    def _statistics(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> list[list[int]]:
        captions = {self.words(c) for c in (*hypotheses, *(r for rs in references for r in rs))}
        features = {word: self._features(word) for words in captions for word in words}
        corpus = CorpusIndex(self.data.paraphrases.select(captions), features.values())
        prepared = {words: Caption([features[w] for w in words], corpus) for words in captions}
        result = []
        for hypothesis, refs in zip(hypotheses, references):
            if not refs:
                raise ValueError(f"METEOR needs at least one reference for {hypothesis!r}")
            line1 = prepared[self.words(hypothesis)]
            best, best_score = None, -1.0
            for reference in refs:
                stats = align(line1, prepared[self.words(reference)])
                score = meteor_score(stats)
                if score > best_score:
                    best, best_score = stats, score
            result.append(best)
        return result

    def compute_score(
        self, gts: Mapping[Hashable, Sequence[str]], res: Mapping[Hashable, Sequence[str]]
    ) -> tuple[float, list[float]]:
        """Corpus score and per-image scores, as `pycocoevalcap.meteor.meteor.Meteor.compute_score` returns them.

        Args:
            gts: Image id -> references.
            res: Image id -> [hypothesis]; the same ids.

        Raises:
            ValueError: The ids differ, an image has other than one hypothesis, or its captions cannot be read.
        """
        if gts.keys() != res.keys():
            raise ValueError("METEOR needs the same image ids in the references and the hypotheses")
        hypotheses, references = [], []
        for key in gts:
            if len(res[key]) != 1:
                raise ValueError(f"METEOR scores one hypothesis per image; image {key!r} has {len(res[key])}")
            hypothesis, refs = _segment(res[key][0], gts[key], key)
            hypotheses.append(hypothesis)
            references.append(refs)
        per_image = self.statistics(hypotheses, references)
        return meteor_score(corpus_statistics(per_image)), [meteor_score(stats) for stats in per_image]

    def close(self) -> None:
        """Nothing to stop (the Java scorer's counterpart stops its process)."""
