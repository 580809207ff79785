"""Caption evaluation metrics equal to coco-caption's (pycocoevalcap 1.2), in pure Python.

* `score_captions(predictions, references, metrics=...)`: BLEU-1..4, METEOR, ROUGE-L, CIDEr(-D), SPICE with
  coco-caption's names and scales; `score_captions_detailed` adds per-image scores, `score_caption_groups` scores
  groups of images separately (NoCaps domains), `CaptionScorer` keeps state between calls.
* `Objects` (`SCENE_METRICS`): object precision / recall / F1, binding errors, counts, relations and exact scenes of
  captions of a generated world, given its recorded scenes (`scenes=`; `itune_hf.metrics.objects`).
* `ContentWords` (`SCENE_METRICS`): content-word precision / recall / F1 and repeats of captions of a clip-art
  corpus, given each image's recorded content words (`scenes=`; `itune_hf.metrics.content_words`).
* `CHAIR` (`SCENE_METRICS`): object hallucination (CHAIR_i, CHAIR_s) and the share of present objects named, against
  COCO instance annotations, a generated world's scenes or a clip-art corpus's words (`itune_hf.metrics.chair`).
* `Metric`, `register_metric`, `metric_names`: the metric registry (`itune_hf.metrics.registry`); a registered metric
  is scored by all of the above and offered by `itune score` / `itune eval --metrics`.
* `tokenize_captions` / `tokenize`: coco-caption's PTB tokenisation without Java.
* `MeteorScorer`: pycocoevalcap's METEOR 1.5 without Java, equal to its jar (`itune_hf.metrics.meteor`); the
  `METEOR` metric. `METEOR_jar` runs the jar itself, for comparison.
* `EVALUATE_MODULE_DIR`: a Hugging Face `evaluate` metric module with the same scores (`evaluate.load(...)`).
* `bleu_scores`, `rouge_l_scores`, `cider_d_scores` (with `DocumentFrequency` for a fixed idf corpus): the scorers
  on already tokenised captions.

Names are imported on first use: `import itune_hf.metrics` (and the registry, which the CLI's help reads) does not
import numpy or compile the tokeniser.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..utils.lazy import lazy_exports

if TYPE_CHECKING:
    from .bleu import bleu_scores
    from .cider import DocumentFrequency, cider_d_scores
    from .meteor import MeteorScorer
    from .ptb_tokenizer import PUNCTUATIONS, tokenize, tokenize_captions
    from .registry import (
        ALL_METRICS,
        FAST_METRICS,
        SCENE_METRICS,
        Metric,
        TokenizedCaptions,
        get_metric,
        list_metrics,
        metric_names,
        normalize_metrics,
        register_metric,
        scene_metrics_for,
        unregister_metric,
    )
    from .rouge import rouge_l_scores
    from .scoring import CaptionScorer, CaptionScores, score_caption_groups, score_captions, score_captions_detailed

# Directory of the `evaluate` metric module: `evaluate.load(EVALUATE_MODULE_DIR)` (local, works offline).
EVALUATE_MODULE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "coco_caption")

# public name -> submodule defining it, imported on first access
_EXPORTS: dict[str, str] = {
    "ALL_METRICS": "registry",
    "FAST_METRICS": "registry",
    "SCENE_METRICS": "registry",
    "Metric": "registry",
    "TokenizedCaptions": "registry",
    "get_metric": "registry",
    "list_metrics": "registry",
    "metric_names": "registry",
    "normalize_metrics": "registry",
    "register_metric": "registry",
    "scene_metrics_for": "registry",
    "unregister_metric": "registry",
    "CaptionScorer": "scoring",
    "CaptionScores": "scoring",
    "score_caption_groups": "scoring",
    "score_captions": "scoring",
    "score_captions_detailed": "scoring",
    "PUNCTUATIONS": "ptb_tokenizer",
    "tokenize": "ptb_tokenizer",
    "tokenize_captions": "ptb_tokenizer",
    "DocumentFrequency": "cider",
    "bleu_scores": "bleu",
    "cider_d_scores": "cider",
    "rouge_l_scores": "rouge",
    "MeteorScorer": "meteor",
}

__all__ = [
    "ALL_METRICS",
    "CaptionScorer",
    "CaptionScores",
    "DocumentFrequency",
    "EVALUATE_MODULE_DIR",
    "FAST_METRICS",
    "MeteorScorer",
    "Metric",
    "PUNCTUATIONS",
    "SCENE_METRICS",
    "TokenizedCaptions",
    "bleu_scores",
    "cider_d_scores",
    "get_metric",
    "list_metrics",
    "metric_names",
    "normalize_metrics",
    "register_metric",
    "rouge_l_scores",
    "scene_metrics_for",
    "score_caption_groups",
    "score_captions",
    "score_captions_detailed",
    "tokenize",
    "tokenize_captions",
    "unregister_metric",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
