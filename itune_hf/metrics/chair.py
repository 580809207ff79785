"""Object hallucination: the `CHAIR` metric (Rohrbach, Hendricks, Burns, Darrell and Saenko, "Object Hallucination in
Image Captioning", EMNLP 2018), scored wherever the data records what each image holds.

A caption *mentions* a set of object categories; the image *has* a set. A mentioned category the image does not have
is a hallucinated object. Over the evaluated captions:

* `CHAIR_i`: hallucinated objects / mentioned objects (the paper's CHAIR_i); NaN where no caption mentions one.
* `CHAIR_s`: the share of captions that mention at least one hallucinated object (the paper's CHAIR_s).
* `CHAIR_cover`: objects mentioned that the image has / objects the image has: how much of what there is to see the
  captions name (a captioner that says nothing hallucinates nothing; this is the column that shows it).

Per image, the same over its own sets (`CHAIR_i` NaN where it mentions no object, `CHAIR_cover` NaN where the image
has none). Each category counts once per caption, as the paper defines CHAIR_i over the objects a caption mentions:
"a dog and a dog" mentions one dog. (The paper's public code counts each mention, so repeating a right word there
lowers CHAIR_i and repeating a wrong one raises it; here repetition changes nothing.)

What a caption mentions and what an image has, by the record the data keeps of it (`itune_hf.data.scenes`):

* COCO instance annotations (`RecordedObjects`: `itune eval/score --instances instances_val2014.json`): the 80 COCO
  categories with the word lists of the paper's public code (`chair_synonyms.txt`, its source named there), read
  as that code reads them: lower-cased words, plurals folded (`itune_hf.data.words.fold`, where the code used a
  singulariser), its two-word names joined ("hot dog" is no dog, "teddy bear" no bear, "stop sign", ...), "baby" and
  "adult" before an animal and "passenger" before "jet" or "train" dropped ("baby elephant" is no person), "toilet
  seat" a toilet and no chair. The image has its annotated categories and, as in the paper, the objects its
  reference captions mention. A category name outside the 80 (another instances file) is its own word.
* A generated world's scene (`RecordedScene`): the categories are shapes. A caption mentions the shapes its world's
  grammar reads in it (`grammar_of`); the image has its scene's shapes. A shape in the wrong colour is no
  hallucination here (`Objects`' `Binding_err` counts those).
* A clip-art corpus's content words (`RecordedWords`): the categories are the content words (folded, less
  `content_words.STOP_WORDS`) that any evaluated image records, as `ContentWords` reads them; the image has its own
  and those its references say.

"unavailable: <reason>" when an image has no record.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.words import fold

if TYPE_CHECKING:
    from .types import MetricResult, TokenizedCaptions

__all__ = ["CHAIR_KEYS", "CocoObjectWords", "coco_object_words", "score_chair"]

#: The keys of the `CHAIR` metric, in report order (the registry's entry reads them here).
CHAIR_KEYS: tuple[str, ...] = ("CHAIR_i", "CHAIR_s", "CHAIR_cover")

SYNONYMS_FILE = Path(__file__).with_name("chair_synonyms.txt")
#: Two-word names read as one word (the paper's code's list): each stands for itself unless `_PHRASE_MEANING` says.
_PHRASES = (
    "motor bike", "motor cycle", "air plane", "traffic light", "street light", "traffic signal", "stop light",
    "fire hydrant", "stop sign", "parking meter", "suit case", "sports ball", "baseball bat", "baseball glove",
    "tennis racket", "wine glass", "hot dog", "cell phone", "mobile phone", "teddy bear", "hair drier", "potted plant",
    "bow tie", "laptop computer", "home plate", "train track",
)  # fmt: skip
#: Qualifiers that name no person before these words ("baby bird" is a bird), and the phrases that mean another word.
_ANIMALS = ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "animal", "cub")
_PHRASE_MEANING = {
    **{f"{age} {animal}": animal for age in ("baby", "adult") for animal in _ANIMALS},
    "passenger jet": "jet",
    "passenger train": "train",
    "bow tie": "tie",
    "toilet seat": "toilet",
}


def _folded(phrase: str) -> str:
    return " ".join(fold(word) for word in phrase.split())


@dataclass(frozen=True)
class CocoObjectWords:
    """The COCO categories' words, as CHAIR reads captions with them (module docstring).

    Args:
        category_of: Folded word or two-word name -> its category (the COCO name that starts its line).
        phrases: Folded two-word phrase -> the folded word it is read as.
    """

    category_of: dict[str, str]
    phrases: dict[str, str]

    def words(self, caption: str) -> list[str]:
        """The caption's words, lower-cased, folded, with two-word phrases joined (the paper's code's reading).

        Args:
            caption: A (tokenised) caption.
        """
        words, joined, k = [fold(word) for word in caption.lower().split()], [], 0
        while k < len(words):
            pair = " ".join(words[k : k + 2])
            if k + 1 < len(words) and pair in self.phrases:
                joined.append(self.phrases[pair])
                k += 2
            else:
                joined.append(words[k])
                k += 1
        if "toilet" in joined:  # "the seat of the toilet" is no chair
            joined = [word for word in joined if word != "seat"]
        return joined

    def objects(self, caption: str) -> frozenset[str]:
        """The categories `caption` mentions.

        Args:
            caption: A (tokenised) caption.
        """
        return frozenset(self.category_of[word] for word in self.words(caption) if word in self.category_of)

    def with_names(self, names: Iterable[str]) -> CocoObjectWords:
        """These words with other category names as words of their own (an instances file's categories outside the
        80: "traffic cone"; a two-word name is read as one word, as the table's are).

        Args:
            names: Category names.
        """
        extra = {_folded(name.lower()): _folded(name.lower()) for name in names}
        extra = {word: category for word, category in extra.items() if word not in self.category_of}
        pairs = {word: word for word in extra if len(word.split()) == 2}
        return CocoObjectWords({**extra, **self.category_of}, {**pairs, **self.phrases})

    def category(self, name: str) -> str:
        """The category a recorded category name is (itself, folded, when outside the table).

        Args:
            name: A category name as an instances file gives it ("dining table", "tv").
        """
        return self.category_of.get(_folded(name.lower()), _folded(name.lower()))


@cache
def coco_object_words() -> CocoObjectWords:
    """The COCO categories' words of `chair_synonyms.txt` (read once)."""
    category_of: dict[str, str] = {}
    for line in SYNONYMS_FILE.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        names = [name.strip().lower() for name in line.split(",") if name.strip()]
        for name in names:
            category_of[_folded(name)] = names[0]
    phrases = {_folded(phrase): _folded(phrase) for phrase in _PHRASES}
    phrases.update({_folded(phrase): _folded(word) for phrase, word in _PHRASE_MEANING.items()})
    return CocoObjectWords(category_of, phrases)


@dataclass(frozen=True)
class _Tally:
    """One caption's objects against its image's, as counts (corpus scores are ratios of their sums)."""

    mentioned: int
    hallucinated: int
    present: int
    covered: int


def _tally(mentioned: frozenset[str], present: frozenset[str]) -> _Tally:
    return _Tally(len(mentioned), len(mentioned - present), len(present), len(mentioned & present))


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else math.nan


def _scores(tallies: Sequence[_Tally]) -> list[float]:
    """The `CHAIR_KEYS` values of a set of captions (one caption: its per-image values)."""
    mentioned, present = sum(t.mentioned for t in tallies), sum(t.present for t in tallies)
    return [
        _ratio(sum(t.hallucinated for t in tallies), mentioned),
        _ratio(sum(1 for t in tallies if t.hallucinated), len(tallies)),
        _ratio(sum(t.covered for t in tallies), present),
    ]


class _Reader:
    """What captions mention and images have, for the evaluated images' records (module docstring)."""

    def __init__(self, records: Sequence[Any]) -> None:
        from ..data.scenes import RecordedObjects
        from .content_words import recorded_words

        annotated = [record for record in records if isinstance(record, RecordedObjects)]
        self.coco = coco_object_words().with_names(
            {name for record in annotated for name in record.categories | record.vocabulary}
        )
        self.vocabulary = frozenset().union(*(recorded_words(record) for record in records))

    def mentioned(self, caption: str, record: Any) -> frozenset[str]:
        from ..data.scenes import RecordedObjects, RecordedScene, grammar_of

        if isinstance(record, RecordedObjects):
            return self.coco.objects(caption)
        if isinstance(record, RecordedScene):
            return frozenset(shape for _, shape in grammar_of(record.world).read(caption).named)
        return frozenset(word for word in map(fold, caption.split()) if word in self.vocabulary)

    def present(self, record: Any, references: Iterable[str]) -> frozenset[str]:
        from ..data.scenes import RecordedObjects, RecordedScene
        from .content_words import recorded_words

        if isinstance(record, RecordedObjects):
            recorded = frozenset(self.coco.category(name) for name in record.categories)
        elif isinstance(record, RecordedScene):
            recorded = frozenset(shape for _, shape in record.objects)
        else:
            recorded = recorded_words(record)
        return recorded.union(*(self.mentioned(reference, record) for reference in references))


def _readable(record: Any) -> bool:
    from ..data.scenes import RecordedObjects, RecordedScene

    return isinstance(record, (RecordedObjects, RecordedScene)) or getattr(record, "content_words", None) is not None


def score_chair(captions: TokenizedCaptions) -> MetricResult:
    """The `CHAIR` metric of `captions` against what their images' records hold (module docstring); "unavailable:
    <reason>" when an image has no record, or no records were given.

    Args:
        captions: The tokenised captions, with `scenes` (one record per image: `RecordedObjects`, `RecordedScene`
            or `RecordedWords`; None where it has none).
    """
    if not captions.ids:
        return "unavailable: no images to score"
    if captions.scenes is None:
        return (
            "unavailable: no recorded objects given (COCO instance annotations: --instances; a generated world's or "
            "a clip-art corpus's dataset.json records them)"
        )
    missing = [key for key, record in zip(captions.ids, captions.scenes) if not _readable(record)]
    if missing:
        shown = ", ".join(repr(key) for key in missing[:3]) + (", ..." if len(missing) > 3 else "")
        return f"unavailable: {len(missing)} of {len(captions.ids)} images have no recorded objects (e.g. {shown})"
    reader = _Reader(captions.scenes)
    tallies = [
        _tally(reader.mentioned(hypothesis, record), reader.present(record, references))
        for hypothesis, references, record in zip(captions.hypotheses, captions.references, captions.scenes)
    ]
    corpus = _scores(tallies)
    per_image = list(zip(*(_scores([tally]) for tally in tallies)))
    return {key: (corpus[k], list(per_image[k])) for k, key in enumerate(CHAIR_KEYS)}
