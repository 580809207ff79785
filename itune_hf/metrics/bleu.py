"""BLEU-1..4 as coco-caption computes it (corpus level, "closest" reference length).

Per image: clipped n-gram matches (each hypothesis n-gram count clipped by its largest count in one reference),
the number of hypothesis n-grams, the hypothesis length and the reference length closest to it (the shorter one on
a tie). Corpus BLEU-n is the geometric mean of the pooled precisions of orders 1..n, each smoothed as
(matches + 1e-15) / (n-grams + 1e-9), times the brevity penalty exp(1 - r/c) when the pooled hypothesis length c
is below the pooled reference length r (computed as (c + 1e-15) / (r + 1e-9)). Per-image scores use the same
formula on the image's own counts. Captions are split on whitespace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._ngrams import CorpusNgrams

__all__ = ["bleu_from_ngrams", "bleu_scores"]

_TINY = 1e-15
_SMALL = 1e-9


def bleu_scores(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]], n: int = 4
) -> tuple[list[float], np.ndarray]:
    """Corpus and per-image BLEU-1..n of tokenised captions.

    Args:
        hypotheses: One tokenised caption per image.
        references: The tokenised reference captions of each image (at least one per image).
        n: Highest order.

    Returns:
        (corpus scores [BLEU-1, ..., BLEU-n], per-image scores as an array of shape (images, n)).
    """
    ngrams, ref_image = _count(hypotheses, references, n)
    return bleu_from_ngrams(ngrams, len(hypotheses), ref_image, n)


def _count(hypotheses: Sequence[str], references: Sequence[Sequence[str]], n: int) -> tuple[CorpusNgrams, np.ndarray]:
    captions = list(hypotheses) + [r for refs in references for r in refs]
    ref_image = np.repeat(np.arange(len(references), dtype=np.int64), [len(refs) for refs in references])
    return CorpusNgrams.from_captions(captions, n), ref_image


def bleu_from_ngrams(
    ngrams: CorpusNgrams, num_images: int, ref_image: np.ndarray, n: int = 4
) -> tuple[list[float], np.ndarray]:
    """BLEU from n-gram counts whose first `num_images` captions are the hypotheses and the rest the references.

    Args:
        ngrams: Counts of hypotheses followed by references.
        num_images: Number of hypotheses (images).
        ref_image: Image index of each reference, in order (references of an image are contiguous).
        n: Highest order.

    Returns:
        (corpus scores [BLEU-1, ..., BLEU-n], per-image scores of shape (num_images, n)).
    """
    hyp_len = ngrams.lengths[:num_images]
    ref_len = ngrams.lengths[num_images:]
    closest = np.zeros(num_images, dtype=np.int64)
    if len(ref_len):
        # the reference length closest to the hypothesis length, the shorter one on a tie: minimise (|r - c|, r)
        base = int(ref_len.max()) + 1
        key = np.abs(ref_len - hyp_len[ref_image]) * base + ref_len
        starts = np.flatnonzero(np.r_[True, ref_image[1:] != ref_image[:-1]])
        closest[ref_image[starts]] = np.minimum.reduceat(key, starts) % base

    correct = np.zeros((num_images, n), dtype=np.int64)
    guess = np.maximum(hyp_len[:, None] - np.arange(n)[None, :], 0)
    for order in range(1, n + 1):
        counts = ngrams.orders[order - 1]
        is_ref, ref_keys, starts = ngrams.reference_groups(order, num_images, ref_image)
        if len(ref_keys) == 0:
            continue
        max_counts = np.maximum.reduceat(counts.count[is_ref], starts)  # largest count in any one reference
        is_hyp = ~is_ref
        hyp_caption = counts.caption[is_hyp]
        hyp_keys = counts.gram[is_hyp] * num_images + hyp_caption
        where = np.searchsorted(ref_keys, hyp_keys)
        where[where == len(ref_keys)] = 0
        clipped = np.where(ref_keys[where] == hyp_keys, np.minimum(counts.count[is_hyp], max_counts[where]), 0)
        correct[:, order - 1] = np.bincount(hyp_caption, weights=clipped, minlength=num_images)

    per_image = _bleu_rows(correct, guess, hyp_len, closest, n)
    total = _bleu_rows(
        correct.sum(axis=0, keepdims=True),
        guess.sum(axis=0, keepdims=True),
        hyp_len.sum(keepdims=True),
        closest.sum(keepdims=True),
        n,
    )[0]
    return [float(x) for x in total], per_image


def _bleu_rows(correct: np.ndarray, guess: np.ndarray, test_len: np.ndarray, ref_len: np.ndarray, n: int) -> np.ndarray:
    """BLEU-1..n for rows of counts, with coco-caption's smoothing and arithmetic order."""
    out = np.empty((len(correct), n))
    for row in range(len(correct)):
        bleu = 1.0
        ratio = (float(test_len[row]) + _TINY) / (float(ref_len[row]) + _SMALL)
        penalty = math.exp(1 - 1 / ratio) if ratio < 1 else 1.0
        for k in range(n):
            bleu *= (float(correct[row, k]) + _TINY) / (float(guess[row, k]) + _SMALL)
            out[row, k] = bleu ** (1.0 / (k + 1)) * penalty
    return out
