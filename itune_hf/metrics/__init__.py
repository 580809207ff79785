"""Caption evaluation metrics equal to coco-caption's (pycocoevalcap 1.2), in pure Python.

* `score_captions(predictions, references, metrics=...)`: BLEU-1..4, METEOR, ROUGE-L, CIDEr(-D), SPICE with
  coco-caption's names and scales; `score_captions_detailed` adds per-image scores, `score_caption_groups` scores
  groups of images separately (NoCaps domains), `CaptionScorer` keeps state between calls.
* `tokenize_captions` / `tokenize`: coco-caption's PTB tokenisation without Java.
* `EVALUATE_MODULE_DIR`: a Hugging Face `evaluate` metric module with the same scores (`evaluate.load(...)`).
* `bleu_scores`, `rouge_l_scores`, `cider_d_scores` (with `DocumentFrequency` for a fixed idf corpus): the scorers
  on already tokenised captions.
"""

import os

from .bleu import bleu_scores
from .cider import DocumentFrequency, cider_d_scores
from .ptb_tokenizer import PUNCTUATIONS, tokenize, tokenize_captions
from .rouge import rouge_l_scores
from .scoring import (
    ALL_METRICS,
    FAST_METRICS,
    CaptionScorer,
    CaptionScores,
    score_caption_groups,
    score_captions,
    score_captions_detailed,
)

# Directory of the `evaluate` metric module: `evaluate.load(EVALUATE_MODULE_DIR)` (local, works offline).
EVALUATE_MODULE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "coco_caption")

__all__ = [
    "ALL_METRICS",
    "EVALUATE_MODULE_DIR",
    "FAST_METRICS",
    "PUNCTUATIONS",
    "CaptionScorer",
    "CaptionScores",
    "DocumentFrequency",
    "bleu_scores",
    "cider_d_scores",
    "rouge_l_scores",
    "score_caption_groups",
    "score_captions",
    "score_captions_detailed",
    "tokenize",
    "tokenize_captions",
]
