"""Caption evaluation metrics equal to coco-caption's (pycocoevalcap 1.2), in pure Python.

* `score_captions(predictions, references, metrics=...)`: BLEU-1..4, METEOR, ROUGE-L, CIDEr(-D), SPICE with
  coco-caption's names and scales; `score_captions_detailed` adds per-image scores, `score_caption_groups` scores
  groups of images separately (NoCaps domains), `CaptionScorer` keeps state between calls.
* `tokenize_captions` / `tokenize`: coco-caption's PTB tokenisation without Java.
* `bleu_scores`, `rouge_l_scores`, `cider_d_scores` (with `DocumentFrequency` for a fixed idf corpus): the scorers
  on already tokenised captions.
"""

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

__all__ = [
    "ALL_METRICS",
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
