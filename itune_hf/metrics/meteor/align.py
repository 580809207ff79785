"""METEOR 1.5's aligner: the candidate matches of four modules (exact, stem, synonym, paraphrase) between a hypothesis
and a reference, then the jar's beam search for the alignment with the most matched words, the fewest chunks and the
shortest distance, and the sufficient statistics of that alignment.

Everything here follows the jar as pycocoevalcap runs it, quirks included, because the scores must be equal:

* words are compared by Java's `String.hashCode()` (two words with one hash match exactly);
* matches are tried in the order the modules find them (per reference position: exact, stem, synonym, then the
  paraphrases of reference phrases, then those of hypothesis phrases);
* a match whose words no other match covers is fixed before the search;
* while searching, the matched-word totals are Java `int`s to which each match adds `length * weight` with the
  search weights 1, 0.5, 0.5, 0.5: the sum is truncated at every step (a one-word stem match adds nothing);
* the distance of a path that tries several matches at one position grows by each match it tries, and the copies
  made for later matches inherit it;
* the search keeps 40 paths per position, sorted stably.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from .normalize import java_hash

__all__ = [
    "BEAM_SIZE", "MODULES", "SEARCH_WEIGHTS", "Caption", "CorpusIndex", "Word", "WordFeatures", "align", "morph_base",
]  # fmt: skip

#: The English modules, in the order the jar runs them (a match's module is its index here).
MODULES = ("exact", "stem", "synonym", "paraphrase")
EXACT, STEM, SYNONYM, PARAPHRASE = range(4)
#: The weights the aligner searches with (the score's weights are `scoring.MODULE_WEIGHTS`).
SEARCH_WEIGHTS = (1.0, 0.5, 0.5, 0.5)
#: Partial alignments kept per position.
BEAM_SIZE = 40

# A match: (reference start, reference length, hypothesis start, hypothesis length, module,
#           hypothesis word mask, reference word mask, search gain, reference end, hypothesis end, distance).
# The search gain is what the jar's truncated int totals grow by: int(m + n * w) == m + int(n * w) for an int m >= 0,
# exactly so for the search weights 1 and 0.5.
Match = tuple[int, int, int, int, int, int, int, int, int, int, int]
Phrases = Mapping[tuple[str, ...], Sequence[tuple[str, ...]]]


@dataclass(frozen=True)
class Word:
    """A normalised word and what the modules compare of it."""

    text: str
    key: int  # String.hashCode()
    stem_key: int  # hashCode() of its Snowball stem
    synsets: frozenset[int]  # its WordNet synonym sets, its base forms' too
    function: bool  # in the jar's function-word list


class WordFeatures:
    """Each word's `Word`, computed once per scorer.

    Args:
        stem: The English Snowball stemmer (`str -> str`).
        synsets: Word -> synonym set numbers.
        exceptions: Irregular form -> base forms.
        function_words: The function-word list.
    """

    def __init__(
        self,
        stem: Callable[[str], str],
        synsets: Mapping[str, Sequence[int]],
        exceptions: Mapping[str, Sequence[str]],
        function_words: frozenset[str],
    ) -> None:
        self._stem, self._synsets, self._exceptions = stem, synsets, exceptions
        self._function_words = function_words
        self._words: dict[str, Word] = {}

    def __call__(self, text: str) -> Word:
        word = self._words.get(text)
        if word is None:
            word = Word(
                text=text,
                key=java_hash(text),
                stem_key=java_hash(self._stem(text)),
                synsets=frozenset(self._synsets.get(text, ())) | self._base_synsets(text),
                function=text.lower() in self._function_words,
            )
            self._words[text] = word
        return word

    def _base_synsets(self, text: str) -> frozenset[int]:
        """The synonym sets of the word's base forms: its listed irregular bases, else WordNet's suffix rules."""
        bases = self._exceptions.get(text)
        if bases is not None:
            return frozenset(n for base in bases for n in self._synsets.get(base, ()))
        return frozenset(self._synsets.get(morph_base(text, self._synsets), ()))


# WordNet 3's detachment rules (noun, verb, adjective suffix -> ending), in the order the jar tries them.
_DETACHMENTS = (
    ("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"), ("ies", "y"),
    ("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", ""),
    ("er", ""), ("est", ""), ("er", "e"), ("est", "e"),
)  # fmt: skip


def morph_base(word: str, synsets: Mapping[str, object]) -> str:
    """The first base form WordNet's suffix rules make of `word` that has synonym sets, else "" (the jar's `morph`).

    Words ending in "ss" and words of two letters or fewer are their own base.

    Args:
        word: A normalised word.
        synsets: The words that have synonym sets.
    """
    if word.endswith("ss") or len(word.encode("utf-16-le", "surrogatepass")) <= 4:  # Java's length: UTF-16 code units
        return word
    for suffix, ending in _DETACHMENTS:
        if word.endswith(suffix):
            base = word[: len(word) - len(suffix)] + ending
            if base in synsets:
                return base
    return ""


class CorpusIndex:
    """What the matchers look up across a corpus: its paraphrase pairs, the runs of words worth looking up (prefixes
    of a phrase or a paraphrase), and each word's synonym sets that another word of the corpus shares (only those can
    make a synonym match).

    Args:
        paraphrases: Phrase -> paraphrases (`ParaphraseTable.select` of the corpus).
        words: Every distinct word of the corpus.
    """

    def __init__(self, paraphrases: Phrases, words: Iterable[Word]) -> None:
        self.paraphrases = paraphrases
        self.targets = {p for found in paraphrases.values() for p in found}
        self.prefixes = {phrase[:end] for phrase in (*paraphrases, *self.targets) for end in range(1, len(phrase) + 1)}
        words = list(words)
        sharing = Counter(number for word in words for number in word.synsets)
        self.synsets = {word.text: frozenset(n for n in word.synsets if sharing[n] > 1) for word in words}


class Caption:
    """One caption's words and the indexes the matchers look them up in, built once per distinct caption.

    Args:
        words: Its words (`WordFeatures`).
        corpus: The corpus's index.
    """

    __slots__ = ("words", "keys", "synsets", "by_key", "by_stem", "by_synset", "ngrams", "phrases")

    def __init__(self, words: Sequence[Word], corpus: CorpusIndex) -> None:
        self.words = list(words)
        self.keys = [w.key for w in words]
        self.synsets = [corpus.synsets[w.text] for w in words]
        self.by_key: dict[int, list[int]] = {}
        self.by_stem: dict[int, list[int]] = {}
        self.by_synset: dict[int, list[int]] = {}
        for position, word in enumerate(words):
            self.by_key.setdefault(word.key, []).append(position)
            self.by_stem.setdefault(word.stem_key, []).append(position)
            for number in self.synsets[position]:
                self.by_synset.setdefault(number, []).append(position)
        texts = [w.text for w in words]
        self.ngrams: dict[tuple[str, ...], list[int]] = {}  # each paraphrase of the corpus found here -> its starts
        self.phrases: list[list[tuple[int, Sequence[tuple[str, ...]]]]] = []  # per start: (length, its paraphrases)
        for start in range(len(texts)):
            found = []
            for end in range(start + 1, len(texts) + 1):
                ngram = tuple(texts[start:end])
                if ngram not in corpus.prefixes:
                    break
                if ngram in corpus.targets:
                    self.ngrams.setdefault(ngram, []).append(start)
                if ngram in corpus.paraphrases:
                    found.append((end - start, corpus.paraphrases[ngram]))
            self.phrases.append(found)


class _Candidates:
    """The matches found so far, listed by reference start, and how many cover each word (the jar's `Stage`)."""

    def __init__(self, size1: int, size2: int) -> None:
        self.at: list[list[Match]] = [[] for _ in range(size2)]
        self.cover1, self.cover2 = [0] * size1, [0] * size2

    def add(self, start: int, length: int, match_start: int, match_length: int, module: int) -> None:
        for k in range(match_length):
            self.cover1[match_start + k] += 1
        for k in range(length):
            self.cover2[start + k] += 1
        weight = SEARCH_WEIGHTS[module]
        self.at[start].append((
            start, length, match_start, match_length, module,
            ((1 << match_length) - 1) << match_start, ((1 << length) - 1) << start,
            int(match_length * weight) + int(length * weight), start + length, match_start + match_length,
            abs(start - match_start),
        ))  # fmt: skip


def _word_matches(line1: Caption, line2: Caption, found: _Candidates, identical: bool) -> None:
    """One-word matches, module by module, each by reference position then hypothesis position."""
    for j, key in enumerate(line2.keys):
        for i in line1.by_key.get(key, ()):
            found.add(j, 1, i, 1, EXACT)
    if identical:  # the jar runs the exact module alone on identical captions
        return
    for j, word in enumerate(line2.words):
        for i in line1.by_stem.get(word.stem_key, ()):
            if line1.keys[i] != word.key:
                found.add(j, 1, i, 1, STEM)
    for j, (word, synsets) in enumerate(zip(line2.words, line2.synsets)):
        if not synsets:
            continue
        positions = {i for number in synsets for i in line1.by_synset.get(number, ())}
        for i in sorted(positions):
            if line1.keys[i] != word.key:
                found.add(j, 1, i, 1, SYNONYM)


def _paraphrase_matches(line1: Caption, line2: Caption, found: _Candidates) -> None:
    """Reference phrases with their paraphrases in the hypothesis, then hypothesis phrases with theirs in the
    reference."""
    for j, phrases in enumerate(line2.phrases):
        for length, paraphrases in phrases:
            for paraphrase in paraphrases:
                for i in line1.ngrams.get(paraphrase, ()):
                    found.add(j, length, i, len(paraphrase), PARAPHRASE)
    for i, phrases in enumerate(line1.phrases):
        for length, paraphrases in phrases:
            for paraphrase in paraphrases:
                for j in line2.ngrams.get(paraphrase, ()):
                    found.add(j, len(paraphrase), i, length, PARAPHRASE)


class _Path:
    """A partial alignment of the beam search (the jar's `PartialAlignment`): the matches it chose (a chain shared
    with the paths it branched from; the fixed matches are the search's), its matched-word total as the jar's
    truncated ints sum it (negated), its chunks, position, last hypothesis end, distance and the words it uses."""

    __slots__ = ("chosen", "loss", "chunks", "idx", "last_end", "distance", "used1", "used2")

    def __init__(self) -> None:
        self.chosen: tuple | None = None  # (match, earlier chain)
        self.loss = self.chunks = self.idx = self.distance = self.used1 = self.used2 = 0  # loss: -matched words
        self.last_end = -1


#: More matched words first, then fewer chunks, then less distance (the jar's `PARTIAL_COMPARE_TOTAL`); `loss` is
#: minus the matched-word total.
_rank = attrgetter("loss", "chunks", "distance")


def _advance(path: _Path, current: int, candidates: Sequence[Match], fixed: Sequence[Match | None], out: list) -> None:
    """One path's successors at reference position `current`, in the jar's order, its mutations included."""
    if path.used2 >> current & 1:
        if current < path.idx:  # inside a match already taken
            out.append(path)
        elif fixed[path.idx] is not None:  # a fixed match starts here
            match = fixed[path.idx]
            path.loss -= match[7]
            if path.last_end != -1 and match[2] != path.last_end:
                path.chunks += 1
            path.idx, path.last_end = match[8], match[9]
            path.distance += match[10]
            out.append(path)
        return  # else the jar drops the path
    used1, used2, last_end = path.used1, path.used2, path.last_end
    for match in candidates:
        if used1 & match[5] or used2 & match[6]:
            continue
        new = _Path.__new__(_Path)  # the jar's new PartialAlignment(path), then its updates
        new.chosen, new.loss = (match, path.chosen), path.loss - match[7]
        new.used1, new.used2 = used1 | match[5], used2 | match[6]
        new.chunks = path.chunks + (last_end != -1 and match[2] != last_end)
        new.idx, new.last_end, new.distance = match[8], match[9], path.distance
        out.append(new)
        path.distance += match[10]  # sic: the jar adds it to the path it branches from
    if last_end != -1:  # skip this position
        path.chunks += 1
        path.last_end = -1
    path.idx += 1
    out.append(path)


def _search(candidates: Sequence[Sequence[Match]], fixed: Sequence[Match | None], start: _Path) -> _Path:
    """The jar's beam search, left to right along the reference."""
    next_paths = [start]
    for current, found in enumerate(candidates):
        paths, next_paths = next_paths, []
        if len(paths) > 1:
            paths.sort(key=_rank)
        for path in paths[:BEAM_SIZE] if len(paths) > BEAM_SIZE else paths:
            _advance(path, current, found, fixed, next_paths)
        if not next_paths:
            next_paths.append(paths[0])
    next_paths.sort(key=_rank)
    finished = next_paths[:BEAM_SIZE]
    for path in finished:  # close the last chunk
        if path.last_end != -1:
            path.chunks += 1
    finished.sort(key=_rank)
    return finished[0]


def _fix_unambiguous(found: _Candidates) -> tuple[list[Match | None], _Path, bool]:
    """The matches no other match overlaps (fixed before the search), the start path using their words, and
    whether they are all the matches."""
    fixed: list[Match | None] = [None] * len(found.at)
    start = _Path()
    count = total = 0
    for position, matches in enumerate(found.at):
        total += len(matches)
        if len(matches) != 1:
            continue
        match = matches[0]
        start_ref, length, match_start, match_length = match[:4]
        if all(found.cover2[start_ref + k] == 1 for k in range(length)) and all(
            found.cover1[match_start + k] == 1 for k in range(match_length)
        ):
            fixed[position] = match
            start.used1 |= match[5]
            start.used2 |= match[6]
            count += 1
    return fixed, start, count == total


def _chunks(matches: Sequence[Match | None]) -> int:
    """Runs of matches contiguous in both captions (the jar's `getCountAndChunks`)."""
    chunks, idx, last_end = 0, 0, -1
    while idx < len(matches):
        match = matches[idx]
        if match is None:
            if last_end != -1:
                chunks += 1
                last_end = -1
            idx += 1
        else:
            if last_end != -1 and match[2] != last_end:
                chunks += 1
            idx = match[0] + match[1]
            last_end = match[2] + match[3]
    return chunks + (last_end != -1)


def _statistics(line1: Sequence[Word], line2: Sequence[Word], matches: Sequence[Match | None]) -> list[int]:
    """The jar's sufficient statistics: lengths, function words, per module (hypothesis content, reference content,
    hypothesis function, reference function) matches, chunks, matched words of each caption."""
    per_module = [[0, 0, 0, 0] for _ in MODULES]
    for match in matches:
        if match is None:
            continue
        start, length, match_start, match_length, module = match[:5]
        counts = per_module[module]
        for k in range(match_length):
            counts[2 if line1[match_start + k].function else 0] += 1
        for k in range(length):
            counts[3 if line2[start + k].function else 1] += 1
    stats = [len(line1), len(line2), sum(w.function for w in line1), sum(w.function for w in line2)]
    for counts in per_module:
        stats.extend(counts)
    stats.append(_chunks(matches))
    stats.append(sum(c[0] + c[2] for c in per_module))
    stats.append(sum(c[1] + c[3] for c in per_module))
    return stats


def align(line1: Caption, line2: Caption) -> list[int]:
    """The sufficient statistics of the jar's best alignment of hypothesis `line1` with reference `line2`.

    Args:
        line1: The hypothesis.
        line2: The reference.
    """
    found = _Candidates(len(line1.keys), len(line2.keys))
    identical = line1.keys == line2.keys  # then exact matches alone
    _word_matches(line1, line2, found, identical)
    if not identical:
        _paraphrase_matches(line1, line2, found)
    fixed, start, settled = _fix_unambiguous(found)
    matches = fixed.copy()
    if not settled:
        chain = _search(found.at, fixed, start).chosen
        while chain is not None:
            match, chain = chain
            matches[match[0]] = match
    return _statistics(line1.words, line2.words, matches)
