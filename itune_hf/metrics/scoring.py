"""Score captions like coco-caption: PTB tokenisation, BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE.

```python
from itune_hf.metrics import score_captions

scores = score_captions(
    {1: "A dog runs on the grass."},
    {1: ["A dog running on grass.", "A brown dog runs outside."]},
    metrics=("BLEU", "ROUGE_L", "CIDEr"),
)
# {"Bleu_1": ..., "Bleu_2": ..., "Bleu_3": ..., "Bleu_4": ..., "ROUGE_L": ..., "CIDEr": ...}
```

Keys and scales are coco-caption's (`Bleu_1`..`Bleu_4`, `METEOR`, `ROUGE_L`, `CIDEr`, `SPICE`; unscaled, so
CIDEr is typically around 1, not 100). Given each image's recorded scene (`scenes=`, a generated world's), the
`Objects` metric checks what captions name and state against it (`itune_hf.metrics.objects`). BLEU, ROUGE-L and
CIDEr-D are pure Python and equal to pycocoevalcap 1.2;
METEOR and SPICE run pycocoevalcap's Java tools when possible and are otherwise the string
"unavailable: <reason>".

The metrics are entries of `itune_hf.metrics.registry` (`register_metric` adds one); this module tokenises the
captions once and hands them to each requested metric.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..utils.text import few
from .cider import DocumentFrequency
from .ptb_tokenizer import tokenize_captions
from .registry import ALL_METRICS, FAST_METRICS, TokenizedCaptions, get_metric, normalize_metrics

__all__ = [
    "ALL_METRICS",
    "FAST_METRICS",
    "CaptionScorer",
    "CaptionScores",
    "normalize_metrics",
    "score_caption_groups",
    "score_captions",
    "score_captions_detailed",
]


@dataclass
class CaptionScores:
    """Scores of a set of captions.

    Attributes:
        scores: coco-caption metric name -> corpus score, or "unavailable: <reason>" for a metric that could not
            run. In coco-caption's order: Bleu_1..Bleu_4, METEOR, ROUGE_L, CIDEr, SPICE (those requested).
        per_image: Image id -> metric name -> that image's score (metrics that ran).
    """

    scores: dict[str, float | str]
    per_image: dict[Hashable, dict[str, float]] = field(default_factory=dict)


def _check_inputs(predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]]) -> list[Hashable]:
    """The image ids to score (in the order of `references`); ValueError naming the problem otherwise."""
    missing = [key for key in references if key not in predictions]
    extra = [key for key in predictions if key not in references]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} image(s) have references but no prediction (e.g. {few(missing)})")
        if extra:
            parts.append(f"{len(extra)} image(s) have a prediction but no references (e.g. {few(extra)})")
        raise ValueError("Image ids of predictions and references differ: " + "; ".join(parts))
    if not references:
        raise ValueError("Nothing to score: no images")
    for key, refs in references.items():
        if isinstance(refs, str) or not isinstance(refs, Sequence):
            raise ValueError(f"References of image {key!r} must be a list of strings, got {type(refs).__name__}")
        if len(refs) == 0:
            raise ValueError(f"Image {key!r} has no reference caption")
        for ref in refs:
            if not isinstance(ref, str):
                raise ValueError(f"A reference of image {key!r} is {type(ref).__name__}, not a string")
        if not isinstance(predictions[key], str):
            raise ValueError(f"The prediction for image {key!r} is {type(predictions[key]).__name__}, not a string")
    return list(references)


class CaptionScorer:
    """Reusable caption scorer (keeps METEOR's language data and the Java processes between calls; use as a context
    manager).

    Args:
        metrics: Metrics to compute: any of "BLEU" (Bleu_1..Bleu_4), "METEOR", "ROUGE_L", "CIDEr", "SPICE",
            "Objects" (needs `scenes`), "METEOR_jar" (pycocoevalcap's METEOR jar), or a metric added with
            `register_metric` (case-insensitive); None for all those scored by default (coco-caption's five and the
            scene metrics, unless more were registered).
        idf_corpus: CIDEr-D document frequencies from this corpus instead of from the references being scored
            (self-critical training uses the training references): image id -> reference captions, an iterable
            of per-image reference lists, or a `DocumentFrequency`. Captions are tokenised like the others.
        tokenized: The captions are already tokenised (tokens separated by spaces): skip PTB tokenisation.
    """

    def __init__(
        self,
        metrics: Iterable[str] | None = None,
        *,
        idf_corpus: DocumentFrequency | Mapping[Hashable, Sequence[str]] | Iterable[Sequence[str]] | None = None,
        tokenized: bool = False,
    ) -> None:
        self.metrics = normalize_metrics(metrics)
        self.tokenized = tokenized
        self.document_frequency = self._document_frequency(idf_corpus)
        # kept between calls (METEOR's language data, the Java processes), closed by close()
        self._resources: dict[str, Any] = {}

    def _document_frequency(self, corpus) -> DocumentFrequency | None:
        if corpus is None or isinstance(corpus, DocumentFrequency):
            return corpus
        groups = [list(refs) for refs in (corpus.values() if isinstance(corpus, Mapping) else corpus)]
        if not groups:
            raise ValueError("idf_corpus is empty")
        for refs in groups:
            if isinstance(refs, str) or not all(isinstance(r, str) for r in refs):
                raise ValueError("idf_corpus must give a list of reference strings per image")
        if not self.tokenized:
            flat = tokenize_captions([r for refs in groups for r in refs])
            it = iter(flat)
            groups = [[next(it) for _ in refs] for refs in groups]
        return DocumentFrequency.from_references(groups)

    def tokenize(self, captions: Sequence[str]) -> list[str]:
        """Captions as the scorers see them (PTB-tokenised unless `tokenized`)."""
        return list(captions) if self.tokenized else tokenize_captions(captions)

    def score(
        self,
        predictions: Mapping[Hashable, str],
        references: Mapping[Hashable, Sequence[str]],
        *,
        scenes: Mapping[Hashable, Any] | None = None,
    ) -> CaptionScores:
        """Score predictions against references.

        Args:
            predictions: Image id -> predicted caption.
            references: Image id -> reference captions (at least one); the same ids as `predictions`.
            scenes: Image id -> recorded scene (`itune_hf.data.scenes.RecordedScene`, e.g. from `read_scenes`),
                for the scene metrics (`Objects`); an image missing here makes them "unavailable". None: no scenes.

        Returns:
            Corpus scores (coco-caption names) and per-image scores.

        Raises:
            ValueError: The image ids differ (the message lists a few), an image has no reference, a caption is
                not a string.
        """
        ids = _check_inputs(predictions, references)
        # one tokeniser call for all references and one for all predictions, in image order, like coco-caption
        ref_counts = [len(references[key]) for key in ids]
        ref_tokens = self.tokenize([r for key in ids for r in references[key]])
        hyp_tokens = self.tokenize([predictions[key] for key in ids])
        grouped: list[list[str]] = []
        position = 0
        for count in ref_counts:
            grouped.append(ref_tokens[position : position + count])
            position += count
        ordered_scenes = None if scenes is None else [scenes.get(key) for key in ids]
        return self._score_tokenized(ids, hyp_tokens, grouped, ordered_scenes)

    def _score_tokenized(
        self, ids: list[Hashable], hyps: list[str], refs: list[list[str]], scenes: list[Any] | None = None
    ) -> CaptionScores:
        captions = TokenizedCaptions(ids, hyps, refs, self.document_frequency, scenes, resources=self._resources)
        scores: dict[str, float | str] = {}
        per_image_columns: dict[str, Sequence[float]] = {}
        for name in self.metrics:
            metric = get_metric(name)
            result = metric.score(captions)
            for key in metric.keys:
                if isinstance(result, str):  # "unavailable: <reason>"
                    scores[key] = result
                elif key not in result:
                    raise ValueError(f"Metric {metric.name} returned no {key!r} (it gave {', '.join(result)})")
                else:
                    scores[key], per_image_columns[key] = result[key]
        per_image = {
            key: {name: float(column[index]) for name, column in per_image_columns.items()}
            for index, key in enumerate(ids)
        }
        return CaptionScores(scores=scores, per_image=per_image)

    def close(self) -> None:
        """Stop the Java processes (SPICE, METEOR_jar) and release anything else the metrics kept between calls."""
        for resource in self._resources.values():
            resource.close()

    def __enter__(self) -> CaptionScorer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def score_captions_detailed(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    metrics: Iterable[str] | None = None,
    idf_corpus: DocumentFrequency | Mapping[Hashable, Sequence[str]] | Iterable[Sequence[str]] | None = None,
    tokenized: bool = False,
    scenes: Mapping[Hashable, Any] | None = None,
) -> CaptionScores:
    """Corpus and per-image scores of predictions against references, as coco-caption computes them.

    Args:
        predictions: Image id -> predicted caption.
        references: Image id -> reference captions (at least one); the same ids as `predictions`.
        metrics: Any of "BLEU", "METEOR", "ROUGE_L", "CIDEr", "SPICE" (or a registered metric); None for all
            scored by default. SPICE starts Java (seconds), METEOR loads its language data (0.15 s; 30 s the first
            time on a machine); `FAST_METRICS` are ready at once.
        idf_corpus: CIDEr-D document frequencies from this corpus (e.g. the training references) instead of from
            `references`; see `CaptionScorer`.
        tokenized: The captions are already tokenised: skip PTB tokenisation.
        scenes: Image id -> recorded scene, for the scene metrics (`Objects`); see `CaptionScorer.score`.

    Returns:
        `CaptionScores` with `.scores` (coco-caption names) and `.per_image`.
    """
    with CaptionScorer(metrics, idf_corpus=idf_corpus, tokenized=tokenized) as scorer:
        return scorer.score(predictions, references, scenes=scenes)


def score_captions(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    metrics: Iterable[str] | None = None,
    idf_corpus: DocumentFrequency | Mapping[Hashable, Sequence[str]] | Iterable[Sequence[str]] | None = None,
    tokenized: bool = False,
    scenes: Mapping[Hashable, Any] | None = None,
) -> dict[str, float | str]:
    """Corpus scores of predictions against references, as coco-caption computes them.

    Args:
        predictions: Image id -> predicted caption.
        references: Image id -> reference captions (at least one); the same ids as `predictions`.
        metrics: Any of "BLEU", "METEOR", "ROUGE_L", "CIDEr", "SPICE"; None for all scored by default (see
            `CaptionScorer`).
        idf_corpus: CIDEr-D document frequencies from this corpus instead of from `references`.
        tokenized: The captions are already tokenised: skip PTB tokenisation.
        scenes: Image id -> recorded scene, for the scene metrics (`Objects`); see `CaptionScorer.score`.

    Returns:
        coco-caption metric name (`Bleu_1`..`Bleu_4`, `METEOR`, `ROUGE_L`, `CIDEr`, `SPICE`) -> score, or
        "unavailable: <reason>" for METEOR/SPICE when they cannot run.
    """
    return score_captions_detailed(
        predictions, references, metrics=metrics, idf_corpus=idf_corpus, tokenized=tokenized, scenes=scenes
    ).scores


def score_caption_groups(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    groups: Mapping[str, Iterable[Hashable]],
    *,
    metrics: Iterable[str] | None = None,
    idf_corpus: DocumentFrequency | Mapping[Hashable, Sequence[str]] | Iterable[Sequence[str]] | None = None,
    tokenized: bool = False,
    scenes: Mapping[Hashable, Any] | None = None,
) -> dict[str, dict[str, float | str]]:
    """Score groups of images separately (e.g. NoCaps in-domain / near-domain / out-domain / overall).

    Each group is scored on its own, as if it were the whole evaluation set (its own tokenisation call and its
    own CIDEr-D document frequencies), which is what the official NoCaps evaluation does per domain.

    Args:
        predictions: Image id -> predicted caption.
        references: Image id -> reference captions.
        groups: Group name -> image ids in the group (each must be in `references`).
        metrics: As for `score_captions`.
        idf_corpus: As for `score_captions` (the same fixed document frequencies for every group).
        tokenized: As for `score_captions`.
        scenes: As for `score_captions`.

    Returns:
        Group name -> scores (coco-caption names).
    """
    results: dict[str, dict[str, float | str]] = {}
    with CaptionScorer(metrics, idf_corpus=idf_corpus, tokenized=tokenized) as scorer:
        for name, members in groups.items():
            members = list(dict.fromkeys(members))
            unknown = [key for key in members if key not in references]
            if unknown:
                raise ValueError(f"Group {name!r} has image ids without references (e.g. {few(unknown)})")
            if not members:
                raise ValueError(f"Group {name!r} is empty")
            missing = [key for key in members if key not in predictions]
            if missing:
                raise ValueError(f"Group {name!r} has images without a prediction (e.g. {few(missing)})")
            results[name] = scorer.score(
                {key: predictions[key] for key in members},
                {key: references[key] for key in members},
                scenes=scenes,
            ).scores
    return results
