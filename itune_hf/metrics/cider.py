"""CIDEr-D as coco-caption computes it ("CIDEr" in its output), with optional document frequencies from a corpus.

For n = 1..4, each caption is a vector of tf-idf weights over its n-grams: count x (log(D) - log(max(1, df))),
where df is the number of images whose references contain the n-gram and D the number of images. The similarity
of the hypothesis to a reference is sum over the hypothesis n-grams of min(w_hyp, w_ref) x w_ref (clipped counts),
divided by the two vector norms when both are non-zero, times the Gaussian length penalty
exp(-delta^2 / (2 sigma^2)) with sigma = 6. As in coco-caption, delta is the difference of the two captions'
*bigram* counts (its "length" counts 2-grams), which equals the difference of their lengths unless one caption has
at most one word. The image score is the mean over n, summed over the references, divided by their number, times
10; the corpus score is the mean over images. Captions are split on whitespace.

By default df and D come from the references being scored (coco-caption). Self-critical sequence training and
some papers use the training references instead: pass `document_frequency=DocumentFrequency.from_references(...)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ._ngrams import CorpusNgrams

__all__ = ["DocumentFrequency", "cider_d_from_ngrams", "cider_d_scores"]

SIGMA = 6.0


@dataclass
class DocumentFrequency:
    """n-gram document frequencies of a reference corpus (for CIDEr-D with a fixed idf).

    Attributes:
        counts: n-gram (tuple of words) -> number of images whose references contain it.
        num_images: Number of images in the corpus (D).
    """

    counts: dict[tuple[str, ...], int]
    num_images: int

    @classmethod
    def from_references(cls, references: Iterable[Sequence[str]], max_n: int = 4) -> DocumentFrequency:
        """Document frequencies of tokenised references.

        Args:
            references: For each image, its tokenised reference captions (whitespace-separated tokens).
            max_n: Highest n-gram order.
        """
        counts: dict[tuple[str, ...], int] = {}
        num_images = 0
        for refs in references:
            num_images += 1
            seen: set[tuple[str, ...]] = set()
            for ref in refs:
                words = ref.split()
                for n in range(1, max_n + 1):
                    seen.update(zip(*(words[i:] for i in range(n))))
            for gram in seen:
                counts[gram] = counts.get(gram, 0) + 1
        return cls(counts=counts, num_images=num_images)


def cider_d_scores(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    *,
    document_frequency: DocumentFrequency | None = None,
    sigma: float = SIGMA,
) -> tuple[float, np.ndarray]:
    """Corpus and per-image CIDEr-D of tokenised captions.

    Args:
        hypotheses: One tokenised caption per image.
        references: The tokenised reference captions of each image (at least one per image).
        document_frequency: Fixed document frequencies (e.g. of the training references); by default they are
            computed from `references`, as coco-caption does.
        sigma: Standard deviation of the length penalty.

    Returns:
        (mean over images, per-image scores).
    """
    captions = list(hypotheses) + [r for refs in references for r in refs]
    ref_image = np.repeat(np.arange(len(references), dtype=np.int64), [len(refs) for refs in references])
    ngrams = CorpusNgrams.from_captions(captions)
    return cider_d_from_ngrams(ngrams, len(hypotheses), ref_image, document_frequency=document_frequency, sigma=sigma)


def cider_d_from_ngrams(
    ngrams: CorpusNgrams,
    num_images: int,
    ref_image: np.ndarray,
    *,
    document_frequency: DocumentFrequency | None = None,
    sigma: float = SIGMA,
) -> tuple[float, np.ndarray]:
    """CIDEr-D from n-gram counts whose first `num_images` captions are the hypotheses and the rest the references.

    Args:
        ngrams: Counts of hypotheses followed by references.
        num_images: Number of hypotheses (images).
        ref_image: Image index of each reference, in order (references of an image are contiguous).
        document_frequency: Fixed document frequencies; None: from these references.
        sigma: Standard deviation of the length penalty.

    Returns:
        (mean over images, per-image scores).
    """
    num_refs = len(ref_image)
    num_captions = num_images + num_refs
    max_n = len(ngrams.orders)
    if document_frequency is None:
        log_images = np.log(float(num_images))
    else:
        log_images = np.log(float(document_frequency.num_images))
    # "length" as coco-caption counts it: the number of bigrams
    length = np.maximum(ngrams.lengths - 1, 0).astype(np.float64)
    delta = length[:num_images][ref_image] - length[num_images:]
    penalty = np.power(np.e, -(delta**2) / (2 * sigma**2))
    similarity = np.zeros((num_refs, max_n))
    for n in range(1, max_n + 1):
        counts = ngrams.orders[n - 1]
        is_ref, ref_keys, starts = ngrams.reference_groups(n, num_images, ref_image)
        if document_frequency is None:  # number of images whose references contain the n-gram
            df = np.bincount(ref_keys // max(num_images, 1), minlength=counts.num_grams).astype(np.float64)
        else:
            lookup = document_frequency.counts.get
            df = np.array([lookup(gram, 0) for gram in ngrams.all_gram_words(n)], dtype=np.float64)
        idf = log_images - np.log(np.maximum(1.0, df))
        weight = counts.count.astype(np.float64) * idf[counts.gram]
        norms = np.sqrt(np.bincount(counts.caption, weights=weight**2, minlength=num_captions))
        # the hypothesis weight of each reference row's n-gram, where the hypothesis has it
        is_hyp = ~is_ref
        hyp_keys = counts.gram[is_hyp] * num_images + counts.caption[is_hyp]
        hyp_weight = weight[is_hyp]
        ref_caption = counts.caption[is_ref] - num_images
        row_keys = counts.gram[is_ref] * num_images + ref_image[ref_caption]
        ref_weight = weight[is_ref]
        if len(hyp_keys):
            where = np.searchsorted(hyp_keys, row_keys)
            where[where == len(hyp_keys)] = 0
            present = hyp_keys[where] == row_keys
            clipped = np.where(present, np.minimum(hyp_weight[where], ref_weight) * ref_weight, 0.0)
        else:
            clipped = np.zeros(len(row_keys))
        value = np.bincount(ref_caption, weights=clipped, minlength=num_refs).astype(np.float64)
        hyp_norm = norms[:num_images][ref_image]
        ref_norm = norms[num_images:]
        both = (hyp_norm != 0) & (ref_norm != 0)
        value[both] /= hyp_norm[both] * ref_norm[both]
        similarity[:, n - 1] = value * penalty
    scores = np.zeros(num_images)
    if num_refs:
        starts = np.flatnonzero(np.r_[True, ref_image[1:] != ref_image[:-1]])
        per_image = np.add.reduceat(similarity, starts, axis=0)  # sum over the references, per n
        refs_per_image = np.diff(np.r_[starts, num_refs])
        scores[ref_image[starts]] = per_image.mean(axis=1) / refs_per_image * 10.0
    return float(np.mean(scores)) if num_images else math.nan, scores
