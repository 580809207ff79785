"""Grounded scores for real captions (the `ContentWords` metric): the content words a caption names, checked against
the content words the corpus recorded for the image (an `itune make-clipart` dataset.json: each image's
`content_words`, the nouns of its title, keywords and category; `itune_hf.data.scenes.RecordedWords`).

Which caption words count. Every word is folded to its singular (`fold`) on both sides. The vocabulary is the union
of the evaluated images' recorded words, folded, less `STOP_WORDS`; a caption names the words of its (PTB-tokenised,
lower-case) text that are in that vocabulary, each as often as it says it. A word no evaluated image records ("dog"
in a corpus without dogs) is not read at all: it neither matches nor counts against precision. The vocabulary is
that of the images scored together, so score a split, not one image alone: alone, an image's vocabulary is its own
words, and a wrong word costs nothing (an SCST reward over a micro-batch reads the batch's words only).

* `Words_P`, `Words_R`, `Words_F1`: a named word matches when the image records it, each recorded word at most once
  ("a cat and a cat" names two words and matches one). Corpus precision is matched / named over all captions (0
  when no caption names a word), recall is matched / recorded, and F1 is computed from them; per image, the same
  over its own counts (0 where it names nothing). Saying a word twice lowers precision, and a caption listing the
  whole vocabulary gets recall 1 and precision (words per image) / (words in the vocabulary).
* `Words_repeat`: the share of captions that name some content word more than once (per image: 1 or 0).

Folding (`fold`) is a small rule set, not a lemmatiser: a table of irregular plurals ("mice" -> "mouse", "leaves" ->
"leaf", "knives" -> "knife", "tomatoes" -> "tomato", "cookies" -> "cookie", ...), then "-ies" -> "-y" ("berries"),
"-sses", "-xes", "-zzes", "-ches", "-shes" -> less "-es" ("boxes", "benches"), and a final "-s" dropped from words
of four letters or more not ending in "-ss", "-us" or "-is" ("cats", "houses"; "glass", "cactus", "iris" kept; the
table's singulars, "bus", "lens", kept too). Both sides are folded by the same rules, so a word matches in either
form wherever its singular and plural fold alike, even to a non-word ("series" -> "sery"); where they do not, the
two forms do not match ("bonus" stays, "bonuses" folds to "bonuse").

Images without recorded content words. The metric is "unavailable: <reason>" when any evaluated image has no record or
a record of another kind (a generated world's scene: `Objects` reads those): that is not a clip-art corpus. An image
whose record names no content word (none left after folding and the stop words; 58 of 4,094 images of an
`itune make-clipart` corpus, titles like "B down" or "Tasto 10") cannot be graded: it is left out of every score
(its per-image values are NaN), and the metric is unavailable only when no image is left.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..data.words import fold

if TYPE_CHECKING:
    from .types import MetricResult, TokenizedCaptions

__all__ = ["CONTENT_WORD_KEYS", "STOP_WORDS", "fold", "recorded_words", "score_content_words"]

#: The keys of the `ContentWords` metric, in report order (the registry's entry reads them here).
CONTENT_WORD_KEYS: tuple[str, ...] = ("Words_P", "Words_R", "Words_F1", "Words_repeat")

#: Words never counted as content, in captions or in the records: function words, and the words of the medium
#: (a clip-art corpus's keywords say "clipart", "vector", "svg" of nearly every image; a caption saying them says
#: nothing of what the image shows).
STOP_WORDS: frozenset[str] = frozenset(
    """a an the this that these those some any one two three four five several many few of in on at to from by for
    with without into onto over under above below near beside behind between and or but not no is are was were be
    being been has have had it its it's he she they them his her their there here who which what while as up down
    out off very
    clipart clip art image picture illustration vector graphic icon svg png openclipart public domain media""".split()
)


def recorded_words(record) -> frozenset[str]:
    """The content words a record gives (`RecordedWords.content_words`: a phrase split at its spaces, each word
    folded, stop words left out); empty for None or a record without them (a generated world's scene).

    Args:
        record: An image's record (`itune_hf.data.scenes.read_scenes`), or None.
    """
    words = getattr(record, "content_words", None) or ()
    folded = {fold(part) for word in words for part in word.split()}
    return frozenset(folded - STOP_WORDS)


@dataclass(frozen=True)
class _Tally:
    """One caption against its image's words, as counts (corpus scores are ratios of their sums)."""

    named: int  # content words the caption says, each as often as it says it
    recorded: int  # the image's recorded content words
    matched: int  # named words the image records, each recorded word at most once
    repeats: bool  # some content word said more than once


def _tally(hypothesis: str, recorded: frozenset[str], vocabulary: frozenset[str]) -> _Tally:
    named = Counter(word for word in map(fold, hypothesis.split()) if word in vocabulary)
    return _Tally(
        named=sum(named.values()),
        recorded=len(recorded),
        matched=sum(1 for word in named if word in recorded),
        repeats=any(count > 1 for count in named.values()),
    )


def _scores(tallies: Sequence[_Tally]) -> list[float]:
    """The `CONTENT_WORD_KEYS` values of a set of captions (one caption: its per-image values)."""
    named, recorded = sum(t.named for t in tallies), sum(t.recorded for t in tallies)
    matched = sum(t.matched for t in tallies)
    precision = matched / named if named else 0.0
    recall = matched / recorded if recorded else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return [precision, recall, f1, sum(t.repeats for t in tallies) / len(tallies) if tallies else 0.0]


def score_content_words(captions: TokenizedCaptions) -> MetricResult:
    """The `ContentWords` metric of `captions` against their images' recorded content words (module docstring):
    images whose record names no word are left out (NaN per image); "unavailable: <reason>" when an image has no
    record of content words, none names a word, or no records were given.

    Args:
        captions: The tokenised captions, with `scenes` (one record per image: `RecordedWords`, or None).
    """
    if captions.scenes is None:
        return "unavailable: no recorded content words given (an itune make-clipart dataset.json records them)"
    unread = [
        key for key, record in zip(captions.ids, captions.scenes) if getattr(record, "content_words", None) is None
    ]
    recorded = [recorded_words(record) for record in captions.scenes]
    graded = [k for k, words in enumerate(recorded) if words]
    if unread or not graded:
        missing = unread or list(captions.ids)
        shown = ", ".join(repr(key) for key in missing[:3]) + (", ..." if len(missing) > 3 else "")
        return (
            f"unavailable: {len(missing)} of {len(captions.ids)} images have no recorded content words (e.g. {shown}; "
            "an itune make-clipart dataset.json records them, a generated world's scenes are scored by Objects)"
        )
    vocabulary = frozenset().union(*recorded)
    tallies = {k: _tally(captions.hypotheses[k], recorded[k], vocabulary) for k in graded}
    corpus = _scores(list(tallies.values()))
    nan = [float("nan")] * len(CONTENT_WORD_KEYS)
    per_image = list(zip(*(_scores([tallies[k]]) if k in tallies else nan for k in range(len(recorded)))))
    return {key: (corpus[k], list(per_image[k])) for k, key in enumerate(CONTENT_WORD_KEYS)}
