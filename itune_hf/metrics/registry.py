"""The caption metrics, as data: one `Metric` entry per metric, in coco-caption's order.

`CaptionScorer`, `normalize_metrics`, `ALL_METRICS`, `FAST_METRICS`, the `--metrics` options of `itune score` /
`itune eval` and the model cards all read this registry, so adding a metric is one `register_metric` call:

```python
from itune_hf.metrics import Metric, register_metric, score_captions

def words(captions):  # mean prediction length, per image too
    lengths = [len(h.split()) for h in captions.hypotheses]
    return {"Words": (sum(lengths) / len(lengths), lengths)}

register_metric(Metric("WORDS", keys=("Words",), score=words))
score_captions({1: "a dog"}, {1: ["a dog runs"]}, metrics=["words", "cider"])  # {"CIDEr": ..., "Words": 2.0}
```

This module imports only the standard library (the scorers import numpy when they run), so the CLI can build its
help from it without loading the metrics themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from .java_metrics import JavaMetric
from .objects import OBJECT_KEYS, score_objects

if TYPE_CHECKING:
    import numpy as np

    from ._ngrams import CorpusNgrams
    from .cider import DocumentFrequency

__all__ = [
    "ALL_METRICS",
    "FAST_METRICS",
    "PRIMARY_METRIC",
    "Metric",
    "MetricResult",
    "SCENE_METRICS",
    "TokenizedCaptions",
    "card_metrics",
    "describe_metrics",
    "get_metric",
    "list_metrics",
    "metric_names",
    "normalize_metrics",
    "register_metric",
    "unregister_metric",
]

#: What a metric's `score` returns: result key -> (corpus score, per-image scores in image order), one item per key
#: of the metric; or "unavailable: <reason>" when it cannot run here (reported under each of its keys).
MetricResult = Mapping[str, tuple[float, Sequence[float]]] | str


@dataclass
class TokenizedCaptions:
    """What a metric scores: each image's tokenised prediction and references, in image order.

    Args:
        ids: Image ids, in the order of the other lists.
        hypotheses: One tokenised prediction per image (tokens separated by spaces).
        references: The tokenised references of each image (at least one per image).
        document_frequency: Fixed CIDEr-D document frequencies (`idf_corpus`), or None: from `references`.
        scenes: Each image's recorded scene (`itune_hf.data.scenes.RecordedScene`, None where it has none), for
            the metrics that need them (`Metric.needs_scenes`); None: no scenes given.
        resources: State a `CaptionScorer` keeps between calls (e.g. a Java process), by name; see `resource`.
    """

    ids: list[Hashable]
    hypotheses: list[str]
    references: list[list[str]]
    document_frequency: DocumentFrequency | None = None
    scenes: list[Any] | None = None
    resources: dict[str, Any] = field(default_factory=dict, repr=False)

    @cached_property
    def ref_image(self) -> np.ndarray:
        """Image index of each reference, references flattened in image order."""
        import numpy as np

        return np.repeat(np.arange(len(self.ids), dtype=np.int64), [len(refs) for refs in self.references])

    @cached_property
    def ngrams(self) -> CorpusNgrams:
        """n-gram counts of the hypotheses followed by the references: counted once, shared by BLEU and CIDEr-D."""
        from ._ngrams import CorpusNgrams

        return CorpusNgrams.from_captions(self.hypotheses + [r for refs in self.references for r in refs])

    def resource(self, name: str, create: Callable[[], Any]) -> Any:
        """The scorer's resource `name`, made by `create()` on first use; the scorer `.close()`s it when closed.

        Args:
            name: Key of the resource (e.g. the metric name).
            create: Makes the resource; it must have a `close()` method.
        """
        if name not in self.resources:
            self.resources[name] = create()
        return self.resources[name]


@dataclass(frozen=True)
class Metric:
    """One caption metric: how it is named, what it reports and how it is scored.

    Args:
        name: Canonical name, as given to `metrics=` and `--metrics` (e.g. "BLEU").
        keys: Result keys it produces, in order (e.g. "Bleu_1".."Bleu_4"), as coco-caption names them.
        score: Scores `TokenizedCaptions`; returns a `MetricResult`.
        aliases: Other accepted names (matched case-insensitively, like `name` and `keys`).
        needs_java: Runs a Java tool (seconds to start); the others are pure Python (`FAST_METRICS`).
        needs_scenes: Scores captions against each image's recorded scene (`TokenizedCaptions.scenes`), not only
            against the references; "unavailable" where an image has none.
        card_key: The result key model cards report (e.g. "Bleu_4"); None: not on model cards.
        card_name: How model cards name it (e.g. "BLEU-4").
        hub_type: Its Hub `model-index` metric type (e.g. "bleu").
    """

    name: str
    keys: tuple[str, ...]
    score: Callable[[TokenizedCaptions], MetricResult] = field(compare=False)
    aliases: tuple[str, ...] = ()
    needs_java: bool = False
    needs_scenes: bool = False
    card_key: str | None = None
    card_name: str | None = None
    hub_type: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.keys:
            raise ValueError(f"A metric needs a name and at least one result key; got {self.name!r}, {self.keys!r}")
        if (self.card_key is None) != (self.card_name is None):
            raise ValueError(
                f"{self.name}: card_key and card_name go together; got {self.card_key!r}, {self.card_name!r}"
            )
        if self.card_key is not None and self.card_key not in self.keys:
            raise ValueError(f"{self.name}: card_key {self.card_key!r} is not one of its keys {self.keys}")

    def spellings(self) -> tuple[str, ...]:
        """Every lower-case name that selects this metric: its name, keys and aliases."""
        return tuple(dict.fromkeys(s.lower() for s in (self.name, *self.keys, *self.aliases)))


_REGISTRY: dict[str, Metric] = {}  # name -> metric, in report order
_SPELLINGS: dict[str, str] = {}  # lower-case name / key / alias -> name


def register_metric(metric: Metric, *, before: str | None = None) -> Metric:
    """Add `metric` to the registry; its keys are reported after those of the metrics before it.

    Args:
        metric: The entry.
        before: Name of a registered metric to insert it before; None appends it.

    Raises:
        ValueError: Its name, a key or an alias is already taken (names the metric that has it).
    """
    taken = {spelling: _SPELLINGS[spelling] for spelling in metric.spellings() if spelling in _SPELLINGS}
    if taken:
        clashes = [f"{spelling!r} (of {owner})" for spelling, owner in taken.items()]
        raise ValueError(f"Cannot register metric {metric.name!r}: {', '.join(clashes)} already taken")
    if before is not None and before not in _REGISTRY:
        raise ValueError(f"before={before!r} is not a registered metric; registered: {', '.join(_REGISTRY)}")
    entries = list(_REGISTRY.values())
    position = entries.index(_REGISTRY[before]) if before is not None else len(entries)
    entries.insert(position, metric)
    _REGISTRY.clear()
    _REGISTRY.update((entry.name, entry) for entry in entries)
    _SPELLINGS.update((spelling, metric.name) for spelling in metric.spellings())
    return metric


def unregister_metric(name: str) -> Metric:
    """Remove a metric from the registry and return its entry.

    Args:
        name: Its name or any spelling `get_metric` accepts.
    """
    metric = _REGISTRY.pop(get_metric(name).name)
    for spelling in metric.spellings():
        del _SPELLINGS[spelling]
    return metric


def get_metric(name: str) -> Metric:
    """The registered metric called `name` (its name, a result key or an alias; case-insensitive).

    Args:
        name: e.g. "BLEU", "Bleu_4", "rouge", "cider-d".

    Raises:
        ValueError: No metric has that name (lists the registered ones).
    """
    canonical = _SPELLINGS.get(name.strip().lower())
    if canonical is None:
        raise ValueError(f"Unknown metric {name!r}; choose from {', '.join(_REGISTRY)}")
    return _REGISTRY[canonical]


def list_metrics() -> tuple[Metric, ...]:
    """Every registered metric, in report order."""
    return tuple(_REGISTRY.values())


def metric_names(*, fast: bool | None = None) -> tuple[str, ...]:
    """Names of the registered metrics, in report order.

    Args:
        fast: True: only the pure-Python ones; False: only those needing Java; None: all.
    """
    return tuple(m.name for m in _REGISTRY.values() if fast is None or fast != m.needs_java)


def normalize_metrics(metrics: Iterable[str] | None) -> tuple[str, ...]:
    """Canonical metric names ("BLEU", "METEOR", "ROUGE_L", "CIDEr", "SPICE") in report (coco-caption) order.

    Args:
        metrics: Names, case-insensitive ("bleu", "Bleu_4", "rouge", "cider-d"...); any key of a metric selects
            the whole metric (Bleu_4 means Bleu_1..Bleu_4, as in coco-caption). None for every registered metric.

    Raises:
        ValueError: An unknown name, or none at all.
    """
    if metrics is None:
        return metric_names()
    if isinstance(metrics, str):
        metrics = [metrics]
    chosen = {get_metric(name).name for name in metrics}
    if not chosen:
        raise ValueError(f"No metric requested; choose from {', '.join(_REGISTRY)}")
    return tuple(name for name in _REGISTRY if name in chosen)


def card_metrics() -> tuple[Metric, ...]:
    """The metrics model cards report: `PRIMARY_METRIC` first, then the others with a `card_name`, in report order."""
    shown = [m for m in _REGISTRY.values() if m.card_name is not None]
    return tuple(sorted(shown, key=lambda m: m.name != PRIMARY_METRIC))  # stable: the others keep their order


def describe_metrics() -> str:
    """The registered metrics for help texts: "BLEU (Bleu_1..Bleu_4), METEOR (needs Java), ROUGE_L, ..."."""
    parts = []
    for metric in _REGISTRY.values():
        notes = []
        if metric.keys != (metric.name,):
            notes.append(f"{metric.keys[0]}..{metric.keys[-1]}" if len(metric.keys) > 2 else ", ".join(metric.keys))
        if metric.needs_java:
            notes.append("needs Java")
        parts.append(f"{metric.name} ({'; '.join(notes)})" if notes else metric.name)
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------------- the built-ins


def _bleu(captions: TokenizedCaptions) -> MetricResult:
    from .bleu import bleu_from_ngrams

    total, per_image = bleu_from_ngrams(captions.ngrams, len(captions.ids), captions.ref_image)
    return {f"Bleu_{n + 1}": (total[n], per_image[:, n]) for n in range(len(total))}


def _rouge_l(captions: TokenizedCaptions) -> MetricResult:
    from .rouge import rouge_l_scores

    return {"ROUGE_L": rouge_l_scores(captions.hypotheses, captions.references)}


def _cider_d(captions: TokenizedCaptions) -> MetricResult:
    from .cider import cider_d_from_ngrams

    result = cider_d_from_ngrams(
        captions.ngrams, len(captions.ids), captions.ref_image, document_frequency=captions.document_frequency
    )
    return {"CIDEr": result}


def _java(name: str) -> Callable[[TokenizedCaptions], MetricResult]:
    """Scoring through pycocoevalcap's Java tool `name`; its process is kept by the scorer between calls."""

    def score(captions: TokenizedCaptions) -> MetricResult:
        java = captions.resource(name, lambda: JavaMetric(name))
        result = java.score(
            dict(zip(captions.ids, captions.references)),
            {key: [hypothesis] for key, hypothesis in zip(captions.ids, captions.hypotheses)},
        )
        return result if isinstance(result, str) else {name: result}

    return score


#: The metric model cards and `itune train` lead with (checkpoints are selected by it).
PRIMARY_METRIC = "CIDEr"

for _metric in (
    Metric(
        "BLEU",
        keys=("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"),
        score=_bleu,
        card_key="Bleu_4",
        card_name="BLEU-4",
        hub_type="bleu",
    ),
    Metric(
        "METEOR",
        keys=("METEOR",),
        score=_java("METEOR"),
        needs_java=True,
        card_key="METEOR",
        card_name="METEOR",
        hub_type="meteor",
    ),
    Metric(
        "ROUGE_L",
        keys=("ROUGE_L",),
        score=_rouge_l,
        aliases=("rouge",),
        card_key="ROUGE_L",
        card_name="ROUGE-L",
        hub_type="rouge",
    ),
    Metric(
        "CIDEr",
        keys=("CIDEr",),
        score=_cider_d,
        aliases=("cider-d", "cider_d"),
        card_key="CIDEr",
        card_name="CIDEr",
        hub_type="cider",
    ),
    Metric(
        "SPICE",
        keys=("SPICE",),
        score=_java("SPICE"),
        needs_java=True,
        card_key="SPICE",
        card_name="SPICE",
        hub_type="spice",
    ),
):
    register_metric(_metric)
del _metric

#: coco-caption's metrics, in its order (`metric_names()` also lists the scene metrics and any registered later).
ALL_METRICS: tuple[str, ...] = metric_names()
#: coco-caption's pure-Python metrics (no Java): BLEU, ROUGE_L, CIDEr.
FAST_METRICS: tuple[str, ...] = metric_names(fast=True)

# The scene metrics: scored where the images' scenes are known (generated worlds); `itune_hf.metrics.objects`.
register_metric(
    Metric(
        "Objects",
        keys=OBJECT_KEYS,
        score=score_objects,
        aliases=("object", "scene"),
        needs_scenes=True,
        card_key="Object_F1",
        card_name="Object F1",
    )
)
#: The built-in metrics that need each image's recorded scene (`Metric.needs_scenes`).
SCENE_METRICS: tuple[str, ...] = tuple(m.name for m in list_metrics() if m.needs_scenes)
