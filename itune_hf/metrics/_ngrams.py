"""n-gram counts of a whole caption corpus at once, with numpy (shared by BLEU and CIDEr-D).

Captions are split on whitespace (`str.split()`, as coco-caption's BLEU and CIDEr do). Every distinct n-gram of
each order gets a dense integer id; the counts are (n-gram, caption, count) rows sorted by n-gram then caption, so
that rows of the same n-gram in the references of one image are adjacent (images' references are contiguous). One
sort per order; nothing is Python-per-n-gram except interning the words.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_N = 4
_INT64_LIMIT = 2**62


@dataclass
class OrderCounts:
    """The n-grams of one order n in a corpus, as rows sorted by (gram, caption).

    Attributes:
        gram: n-gram id of each row (0..num_grams-1).
        caption: Caption index of each row.
        count: How many times the n-gram occurs in the caption.
        num_grams: Number of distinct n-grams of this order.
        first_position: For each n-gram id, a word position where it starts (to rebuild its words).
    """

    gram: np.ndarray
    caption: np.ndarray
    count: np.ndarray
    num_grams: int
    first_position: np.ndarray


@dataclass
class CorpusNgrams:
    """Words and n-gram counts (orders 1..MAX_N) of a list of captions.

    Attributes:
        lengths: Number of words of each caption.
        words: Word id of every word position (captions concatenated).
        vocabulary: The words, indexed by id.
        orders: `orders[n - 1]` holds the n-grams of order n.
    """

    lengths: np.ndarray
    words: np.ndarray
    vocabulary: list[str]
    orders: list[OrderCounts]

    @classmethod
    def from_captions(cls, captions: Sequence[str], max_n: int = MAX_N) -> CorpusNgrams:
        """Count the n-grams of whitespace-split captions.

        Args:
            captions: Tokenised captions (tokens separated by whitespace).
            max_n: Highest n-gram order.
        """
        vocabulary: dict[str, int] = collections.defaultdict(itertools.count().__next__)  # word -> new id
        lengths = np.fromiter(map(len, map(str.split, captions)), dtype=np.int64, count=len(captions))
        all_words = " ".join(captions).split()
        words = np.fromiter(map(vocabulary.__getitem__, all_words), dtype=np.int64, count=len(all_words))
        num_words = max(len(vocabulary), 1)
        num_captions = max(len(captions), 1)
        caption_of_word = np.repeat(np.arange(len(captions), dtype=np.int64), lengths)
        words_left = np.cumsum(lengths)[caption_of_word] - np.arange(len(words), dtype=np.int64)
        orders = []
        previous = words  # id of the (n-1)-gram starting at each position
        num_previous = num_words
        for n in range(1, max_n + 1):
            valid = np.flatnonzero(words_left >= n)
            if len(valid) == 0:  # no caption has n words
                empty = np.zeros(0, dtype=np.int64)
                orders.append(OrderCounts(gram=empty, caption=empty, count=empty, num_grams=0, first_position=empty))
                previous, num_previous = np.full(len(words), -1, dtype=np.int64), 1
                continue
            key = words[valid] if n == 1 else previous[valid] * num_words + words[valid + n - 1]
            caption = caption_of_word[valid]
            if num_previous * num_words * num_captions < _INT64_LIMIT:
                composite = key * num_captions + caption
                by_row = np.argsort(composite)
                composite = composite[by_row]
                new_row = np.r_[True, composite[1:] != composite[:-1]]
                key = composite // num_captions
            else:  # too many distinct n-grams to pack (gram, caption) into one integer
                by_row = np.lexsort((caption, key))
                key, caption = key[by_row], caption[by_row]
                new_row = np.r_[True, (key[1:] != key[:-1]) | (caption[1:] != caption[:-1])]
            new_gram = np.r_[True, key[1:] != key[:-1]]
            gram_sorted = np.cumsum(new_gram) - 1
            num_grams = int(gram_sorted[-1]) + 1 if len(gram_sorted) else 0
            current = np.full(len(words), -1, dtype=np.int64)
            current[valid[by_row]] = gram_sorted
            row_starts = np.flatnonzero(new_row)
            orders.append(
                OrderCounts(
                    gram=gram_sorted[row_starts],
                    caption=caption_of_word[valid[by_row[row_starts]]],
                    count=np.diff(np.r_[row_starts, len(by_row)]),
                    num_grams=num_grams,
                    first_position=valid[by_row[np.flatnonzero(new_gram)]],
                )
            )
            previous, num_previous = current, max(num_grams, 1)
        return cls(lengths=lengths, words=words, vocabulary=list(vocabulary), orders=orders)

    def gram_words(self, n: int, gram: int) -> tuple[str, ...]:
        """The words of n-gram `gram` of order `n`."""
        start = int(self.orders[n - 1].first_position[gram])
        return tuple(self.vocabulary[w] for w in self.words[start : start + n])

    def all_gram_words(self, n: int) -> list[tuple[str, ...]]:
        """The words of every n-gram of order `n`, indexed by n-gram id."""
        vocabulary = np.array(self.vocabulary, dtype=object)
        starts = self.orders[n - 1].first_position
        columns = [vocabulary[self.words[starts + k]].tolist() for k in range(n)]
        return list(zip(*columns))

    def reference_groups(self, order: int, num_images: int, ref_image: np.ndarray):
        """Per (n-gram, image) among the references: the group key gram * num_images + image, and the row slices.

        Args:
            order: n.
            num_images: Number of hypotheses; captions from this index on are references.
            ref_image: Image index of each reference caption.

        Returns:
            (mask of reference rows, sorted unique keys, start of each key's run among the reference rows).
        """
        counts = self.orders[order - 1]
        is_ref = counts.caption >= num_images
        keys = counts.gram[is_ref] * num_images + ref_image[counts.caption[is_ref] - num_images]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, np.int64)
        return is_ref, keys[starts], starts
