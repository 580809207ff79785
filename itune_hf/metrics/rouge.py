"""ROUGE-L as coco-caption computes it.

Per image: the longest common subsequence (LCS) of the hypothesis with each reference, in tokens; precision
LCS/len(hypothesis) and recall LCS/len(reference) are maximised *separately* over the references, then combined as
F = (1 + beta^2) P R / (R + beta^2 P) with beta = 1.2 (0 when either is 0). The corpus score is the mean over
images. Captions are split on single spaces (`str.split(" ")`), as coco-caption does, so an empty caption is one
empty token: an empty hypothesis scores 0 unless a reference is empty too (then that pair has LCS 1).

The LCS is computed with the bit-parallel algorithm of Allison and Dix / Crochemore et al.: one big-integer
addition and a few bit operations per reference token, instead of a table of len(hyp) x len(ref) cells.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["lcs_length", "rouge_l_scores"]

BETA = 1.2


def _masks(tokens: Sequence[str]) -> dict[str, int]:
    """For each token, the bit mask of its positions in `tokens`."""
    masks: dict[str, int] = {}
    for position, token in enumerate(tokens):
        masks[token] = masks.get(token, 0) | (1 << position)
    return masks


def _lcs(masks: dict[str, int], length: int, other: Sequence[str]) -> int:
    full = (1 << length) - 1
    row = full
    get = masks.get
    for token in other:
        matches = row & get(token, 0)
        row = (row + matches) | (row - matches)
    return length - (row & full).bit_count()


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token sequences.

    Args:
        a: First sequence.
        b: Second sequence.
    """
    return _lcs(_masks(a), len(a), b)


def rouge_l_scores(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]], beta: float = BETA
) -> tuple[float, np.ndarray]:
    """Corpus and per-image ROUGE-L of tokenised captions.

    Args:
        hypotheses: One tokenised caption per image.
        references: The tokenised reference captions of each image (at least one per image).
        beta: Weight of recall against precision.

    Returns:
        (mean over images, per-image scores).
    """
    beta2 = beta**2
    scores = np.empty(len(hypotheses))
    for index, (hypothesis, refs) in enumerate(zip(hypotheses, references)):
        candidate = hypothesis.split(" ")
        masks = _masks(candidate)
        length = len(candidate)
        best_precision = best_recall = 0.0
        for reference in refs:
            tokens = reference.split(" ")
            lcs = _lcs(masks, length, tokens)
            precision = lcs / float(length)
            recall = lcs / float(len(tokens))
            best_precision = max(best_precision, precision)
            best_recall = max(best_recall, recall)
        if best_precision != 0 and best_recall != 0:
            scores[index] = ((1 + beta2) * best_precision * best_recall) / float(best_recall + beta2 * best_precision)
        else:
            scores[index] = 0.0
    return float(np.mean(scores)), scores
