"""Scene-grounded scores (the `Objects` metric): what a caption names and states, checked against the image's scene.

Each caption is read with its world's grammar (`itune_hf.data.scenes.grammar_of`): the `(colour, shape)` objects it
names, counted, and the facts it states. Against the scene the world recorded for the image:

* `Object_P`, `Object_R`, `Object_F1`: count-aware matching of the named multiset with the scene's ("two red
  circles" matches two red circles, at most). Corpus precision is matched / named over all captions (a caption that
  names nothing, e.g. one outside the grammar, adds 0 to both, and precision is 0 when no caption names anything),
  recall is matched / present, and F1 is computed from them; per image, the same over its own counts (0 where it
  names nothing).
* `Binding_err`: of the distinct looks captions name, the share that are not in the scene although its colour and
  its shape both are (a colour bound to the wrong shape: "a red square" for a red circle beside a blue square).
* `Count_acc`: of the named looks that are in the scene, the share named with the scene's count.
* `Relation_acc`: of the stated relations (left of, above, between, in a row or column), the share that hold.
* `Exact_scene`: the share of captions that name exactly the scene's objects, counts included, and whose every stated
  fact holds: relations, the background, and the size said of an object (where the world records sizes: the hard
  world).

A repeated phrase names its objects again ("a red circle and a red circle" names two): precision and counts fall.

`Count_acc` and `Relation_acc` are NaN for an image that states no count of a present look or no relation, and for
the corpus when no image does; `itune eval` and `itune score` write such a value as JSON `null`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .types import MetricResult, TokenizedCaptions

__all__ = ["OBJECT_KEYS", "score_objects"]

#: The keys of the `Objects` metric, in report order (the registry's entry reads them here).
OBJECT_KEYS: tuple[str, ...] = (
    "Object_P", "Object_R", "Object_F1", "Binding_err", "Count_acc", "Relation_acc", "Exact_scene",
)  # fmt: skip


@dataclass(frozen=True)
class _Tally:
    """What one caption got right of its scene, as counts (corpus scores are ratios of their sums)."""

    named: int  # objects named, counted
    present: int  # objects in the scene
    matched: int  # named objects in the scene, counts capped by the scene's
    looks: int  # distinct looks named
    misbound: int  # named looks absent from the scene whose colour and shape are both in it
    counted: int  # named looks present in the scene
    counts_right: int  # ... named with the scene's count
    relations: int  # relation facts stated
    relations_right: int  # ... that hold
    exact: bool


def _tally(reading, scene) -> _Tally:
    """Compare a caption's `Reading` with a `RecordedScene`."""
    from ..data.scenes import RELATION_FACTS

    named, present = Counter(reading.named), scene.looks
    colours, shapes = {c for c, _ in present}, {s for _, s in present}
    relations = [fact for fact in reading.claims if fact[0] in RELATION_FACTS]
    in_scene = [look for look in named if look in present]
    checked = reading.claims if scene.sizes is not None else {fact for fact in reading.claims if fact[0] != "size"}
    return _Tally(
        named=sum(named.values()),
        present=sum(present.values()),
        matched=sum((named & present).values()),
        looks=len(named),
        misbound=sum(1 for c, s in named if (c, s) not in present and c in colours and s in shapes),
        counted=len(in_scene),
        counts_right=sum(1 for look in in_scene if named[look] == present[look]),
        relations=len(relations),
        relations_right=sum(1 for fact in relations if fact in scene.facts),
        exact=named == present and checked <= scene.facts,
    )


def _ratio(part: int, whole: int, empty: float) -> float:
    return part / whole if whole else empty


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def _scores(tallies: Sequence[_Tally]) -> list[float]:
    """The `OBJECT_KEYS` values of a set of captions (one caption: its per-image values)."""

    def total(name: str) -> int:
        return sum(getattr(tally, name) for tally in tallies)

    precision = _ratio(total("matched"), total("named"), 0.0)
    recall = _ratio(total("matched"), total("present"), 0.0)
    return [
        precision,
        recall,
        _f1(precision, recall),
        _ratio(total("misbound"), total("looks"), 0.0),
        _ratio(total("counts_right"), total("counted"), math.nan),
        _ratio(total("relations_right"), total("relations"), math.nan),
        _ratio(total("exact"), len(tallies), 0.0),
    ]


def score_objects(captions: TokenizedCaptions) -> MetricResult:
    """The `Objects` metric of `captions` against their `scenes` (module docstring); "unavailable: <reason>" when an
    image has no recorded scene (real data, or a clip-art corpus, which records content words only) or no scenes
    were given.

    Args:
        captions: The tokenised captions, with `scenes` (one `RecordedScene` or None per image).
    """
    from ..data.scenes import grammar_of

    if captions.scenes is None:
        return "unavailable: no scenes given (a generated world's dataset.json records them: itune make-synthetic)"
    missing = [key for key, scene in zip(captions.ids, captions.scenes) if getattr(scene, "objects", None) is None]
    if missing:
        shown = ", ".join(repr(key) for key in missing[:3]) + (", ..." if len(missing) > 3 else "")
        return f"unavailable: {len(missing)} of {len(captions.ids)} images have no recorded scene (e.g. {shown})"
    tallies = [
        _tally(grammar_of(scene.world).read(hypothesis), scene)
        for hypothesis, scene in zip(captions.hypotheses, captions.scenes)
    ]
    corpus = _scores(tallies)
    per_image = list(zip(*(_scores([tally]) for tally in tallies)))
    return {key: (corpus[k], list(per_image[k])) for k, key in enumerate(OBJECT_KEYS)}
