"""The built-in metrics: coco-caption's (BLEU, METEOR, ROUGE-L, CIDEr-D, SPICE, in its order), the scene metrics
(`Objects`, scored against the recorded scenes of a generated world; `ContentWords`, against the content words a
clip-art corpus records; `CHAIR`, object hallucination, against either or COCO instance annotations), and
`METEOR_jar`, pycocoevalcap's own METEOR jar (Java), to check the pure-Python METEOR against. `registry.py` registers
them, in this order.
"""

from __future__ import annotations

from collections.abc import Callable

from .chair import CHAIR_KEYS, score_chair
from .content_words import CONTENT_WORD_KEYS, score_content_words
from .java_metrics import JavaMetric
from .objects import OBJECT_KEYS, score_objects
from .types import Metric, MetricResult, TokenizedCaptions


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


def _meteor(captions: TokenizedCaptions) -> MetricResult:
    """METEOR 1.5 without Java (`itune_hf.metrics.meteor`); the language data is loaded once per scorer."""
    from .meteor import MeteorScorer, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        return reason
    try:
        scorer = captions.resource("METEOR", MeteorScorer)
        return {"METEOR": scorer.compute_score(*_coco_inputs(captions))}
    except (OSError, ValueError, RuntimeError, EOFError) as error:  # e.g. a cache it cannot write: never a number
        return f"unavailable: METEOR failed: {type(error).__name__}: {error}"


def _coco_inputs(captions: TokenizedCaptions) -> tuple[dict, dict]:
    """pycocoevalcap's `gts` and `res`: image id -> references, image id -> [prediction]."""
    return dict(zip(captions.ids, captions.references)), {k: [h] for k, h in zip(captions.ids, captions.hypotheses)}


def _java(name: str, key: str) -> Callable[[TokenizedCaptions], MetricResult]:
    """Scoring through pycocoevalcap's Java tool `name` (reported as `key`); its process is kept by the scorer
    between calls."""

    def score(captions: TokenizedCaptions) -> MetricResult:
        java = captions.resource(key, lambda: JavaMetric(name))
        result = java.score(*_coco_inputs(captions))
        return result if isinstance(result, str) else {key: result}

    return score


#: coco-caption's metrics, in its order.
COCO_METRICS: tuple[Metric, ...] = (
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
        score=_meteor,
        slow_start=True,
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
        score=_java("SPICE", "SPICE"),
        needs_java=True,
        card_key="SPICE",
        card_name="SPICE",
        hub_type="spice",
    ),
)

#: The scene metrics: scored where the data records what each image shows; `Objects` (`itune_hf.metrics.objects`)
#: reads a generated world's scenes, `ContentWords` (`itune_hf.metrics.content_words`) a clip-art corpus's words, and
#: `CHAIR` (`itune_hf.metrics.chair`: object hallucination) any of them or COCO instance annotations.
SCENE_METRIC_ENTRIES: tuple[Metric, ...] = (
    Metric(
        "Objects",
        keys=OBJECT_KEYS,
        score=score_objects,
        aliases=("object", "scene"),
        needs_scenes=True,
        scene_field="objects",
        card_key="Object_F1",
        card_name="Object F1",
    ),
    Metric(
        "ContentWords",
        keys=CONTENT_WORD_KEYS,
        score=score_content_words,
        aliases=("content-words", "content_words"),
        needs_scenes=True,
        scene_field="content_words",
        card_key="Words_F1",
        card_name="Content-word F1",
    ),
    Metric(
        "CHAIR",
        keys=CHAIR_KEYS,
        score=score_chair,
        aliases=("hallucination",),
        needs_scenes=True,
    ),
)

#: pycocoevalcap's METEOR jar itself (needs Java): not reported by default; `--metrics METEOR_jar` checks the
#: pure-Python METEOR against it.
METEOR_JAR = Metric(
    "METEOR_jar",
    keys=("METEOR_jar",),
    score=_java("METEOR", "METEOR_jar"),
    aliases=("meteor-jar",),
    needs_java=True,
    by_default=False,
)

__all__ = ["COCO_METRICS", "METEOR_JAR", "SCENE_METRIC_ENTRIES"]
