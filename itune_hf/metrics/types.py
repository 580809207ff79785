"""What a caption metric is: the `Metric` entry (how it is named, what it reports, how it is scored), what it scores
(`TokenizedCaptions`) and what it returns (`MetricResult`). The registry (`registry.py`) holds the entries.

This module imports only the standard library (numpy when a scorer reads `ngrams` or `ref_image`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from ._ngrams import CorpusNgrams
    from .cider import DocumentFrequency

__all__ = ["Metric", "MetricResult", "TokenizedCaptions"]

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
        scenes: Each image's record (`itune_hf.data.scenes.read_scenes`: a generated world's `RecordedScene`, a
            clip-art corpus's `RecordedWords`; None where it has none), for the metrics that need them
            (`Metric.needs_scenes`); None: no scenes given.
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
        needs_java: Runs a Java tool (seconds to start).
        needs_scenes: Scores captions against each image's recorded scene (`TokenizedCaptions.scenes`), not only
            against the references; "unavailable" where an image has none.
        scene_field: For a metric that needs scenes, the field of each image's record it reads (`objects` of a
            `RecordedScene`, `content_words` of a `RecordedWords`); a record without it is no scene to this metric
            (`reads`). None: any record.
        card_key: The result key model cards report (e.g. "Bleu_4"); None: not on model cards.
        card_name: How model cards name it (e.g. "BLEU-4").
        hub_type: Its Hub `model-index` metric type (e.g. "bleu").
        slow_start: Pure Python, but loads data on first use (METEOR: its language data, about 0.15 s; the first run
            on a machine builds a cache, 25-33 s). Neither these nor the Java ones are in `FAST_METRICS`, the
            metrics training validation and the demo report.
        by_default: Scored when no metrics are named (`metrics=None`); False for a metric only asked for by name
            (`METEOR_jar`).
    """

    name: str
    keys: tuple[str, ...]
    score: Callable[[TokenizedCaptions], MetricResult] = field(compare=False)
    aliases: tuple[str, ...] = ()
    needs_java: bool = False
    needs_scenes: bool = False
    scene_field: str | None = None
    card_key: str | None = None
    card_name: str | None = None
    hub_type: str | None = None
    slow_start: bool = False
    by_default: bool = True

    def __post_init__(self) -> None:
        if not self.name or not self.keys:
            raise ValueError(f"A metric needs a name and at least one result key; got {self.name!r}, {self.keys!r}")
        if (self.card_key is None) != (self.card_name is None):
            raise ValueError(
                f"{self.name}: card_key and card_name go together; got {self.card_key!r}, {self.card_name!r}"
            )
        if self.card_key is not None and self.card_key not in self.keys:
            raise ValueError(f"{self.name}: card_key {self.card_key!r} is not one of its keys {self.keys}")

    @property
    def fast(self) -> bool:
        """Pure Python and ready at once (`FAST_METRICS`): no Java, no data to load."""
        return not (self.needs_java or self.slow_start)

    def reads(self, record: Any) -> bool:
        """Whether this metric scores an image whose record (`TokenizedCaptions.scenes`' item) is `record`: a metric
        that needs scenes reads a record that has its `scene_field`; any other metric reads every image.

        Args:
            record: An image's record, or None (none recorded).
        """
        if not self.needs_scenes:
            return True
        return record is not None and (self.scene_field is None or getattr(record, self.scene_field, None) is not None)

    def spellings(self) -> tuple[str, ...]:
        """Every lower-case name that selects this metric: its name, keys and aliases."""
        return tuple(dict.fromkeys(s.lower() for s in (self.name, *self.keys, *self.aliases)))
