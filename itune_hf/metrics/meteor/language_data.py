"""METEOR 1.5's English language data, read from the installed pycocoevalcap at run time, and its compact cache.

pycocoevalcap ships the data the jar uses: inside `meteor/meteor-1.5.jar`, the function words
(`function/english.words`), the non-breaking prefixes (`nonbreaking/english.prefixes`) and WordNet's synonym sets
(`synonym/english.synsets`, with the irregular forms in `synonym/english.exceptions`); beside it the paraphrase table
(`meteor/data/paraphrase-en.gz`: 5.3 million phrase pairs, 62 MB). Nothing of it is copied into this repository.

Reading the paraphrase table line by line costs seconds and a gigabyte per process, so the first use on a machine
builds a compact index under `cache_dir()/meteor/` (25-33 s once; 154 MB: the pairs as word-id arrays sorted by a
64-bit key of each phrase, the rest in one marshal file), keyed by the format version and the source files' paths,
sizes and modification times, built in a staging folder renamed into place under a lock, so that no process ever
reads half an index and concurrent ones build it once. Later runs memory-map it: a scorer loads it in about 0.15 s
and, per corpus, keeps only the pairs whose phrase and paraphrase both occur in it (`ParaphraseTable.select`).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import marshal
import os
import re
import shutil
import tempfile
import time
import zipfile
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...utils.files import cache_dir, exclusive_lock, give_default_permissions
from .normalize import NONBREAKING_ANY, NONBREAKING_NUMERIC, java_split_words

__all__ = ["CACHE_FORMAT", "LanguageData", "ParaphraseTable", "load_language_data", "meteor_sources"]

#: Version of the cache's layout; a change rebuilds every cache.
CACHE_FORMAT = 1
_JAR = "meteor-1.5.jar"
_PARAPHRASES = os.path.join("data", "paraphrase-en.gz")
_JAR_FILES = {
    "function_words": "function/english.words",
    "prefixes": "nonbreaking/english.prefixes",
    "exceptions": "synonym/english.exceptions",
    "synsets": "synonym/english.synsets",
}
_LINE_BREAK = re.compile("\r\n|\r|\n")


@dataclass(frozen=True)
class MeteorSources:
    """The installed files METEOR's data comes from."""

    jar: Path
    paraphrases: Path

    def fingerprint(self) -> str:
        """Changes when either file changes (size and modification time) or the cache format does."""
        parts = [f"format={CACHE_FORMAT}"]
        for path in (self.jar, self.paraphrases):
            stat = path.stat()
            parts.append(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def meteor_sources() -> MeteorSources | str:
    """The installed pycocoevalcap's METEOR jar and paraphrase table, or why they cannot be found."""
    spec = importlib.util.find_spec("pycocoevalcap")
    if spec is None or not spec.submodule_search_locations:
        return "METEOR reads its language data from pycocoevalcap, which is not installed (pip install pycocoevalcap)"
    folder = Path(list(spec.submodule_search_locations)[0]) / "meteor"
    sources = MeteorSources(folder / _JAR, folder / _PARAPHRASES)
    missing = [str(path) for path in (sources.jar, sources.paraphrases) if not path.is_file()]
    if missing:
        return f"METEOR's language data is missing from pycocoevalcap ({', '.join(missing)}); reinstall pycocoevalcap"
    return sources


def java_lines(text: str) -> list[str]:
    """Lines as `BufferedReader.readLine` returns them (split at \\n, \\r or \\r\\n only; no final empty line)."""
    lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _read_prefixes(lines: Iterable[str]) -> dict[str, int]:
    prefixes = {}
    for line in lines:
        tokens = java_split_words(line)
        if not tokens or tokens[0].startswith("#"):
            continue
        numeric = len(tokens) > 1 and tokens[1] == "#NUMERIC_ONLY#"
        prefixes[tokens[0]] = NONBREAKING_NUMERIC if numeric else NONBREAKING_ANY
    return prefixes


def _read_exceptions(lines: list[str]) -> dict[str, list[str]]:
    """Irregular form -> its base forms (pairs of lines: base, then its forms)."""
    bases: dict[str, list[str]] = {}
    for base, forms in zip(lines[0::2], lines[1::2]):
        for form in java_split_words(forms):
            bases.setdefault(form, []).append(base)
    return bases


def _read_synsets(lines: list[str]) -> dict[str, tuple[int, ...]]:
    """Word -> its synonym set numbers (pairs of lines: word, then its set numbers; a later pair replaces one)."""
    pairs = zip(lines[0::2], lines[1::2])
    return {word: tuple(sorted({int(n) for n in java_split_words(sets)})) for word, sets in pairs}


def _read_jar(jar: Path) -> dict[str, Any]:
    with zipfile.ZipFile(jar) as archive:
        text = {key: java_lines(archive.read(name).decode("utf-8", "replace")) for key, name in _JAR_FILES.items()}
    return {
        "function_words": text["function_words"],
        "prefixes": _read_prefixes(text["prefixes"]),
        "exceptions": _read_exceptions(text["exceptions"]),
        "synsets": _read_synsets(text["synsets"]),
    }


def _paraphrase_pairs(path: Path) -> Iterator[tuple[list[str], list[str]]]:
    """(phrase, paraphrase) of each entry, in file order (three lines each: probability, phrase, paraphrase)."""
    with gzip.open(path, "rb") as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="") as text:
        lines = (line.rstrip("\r\n") for line in text)  # newline="": lines end at \n, \r or \r\n, as readLine's do
        for _probability, phrase, paraphrase in zip(lines, lines, lines):
            yield java_split_words(phrase), java_split_words(paraphrase)


_HASH_MULTIPLIER = 0x100000001B3  # FNV's 64-bit prime


def _phrase_hashes(words, starts, ends):
    """The 64-bit key of each phrase words[start:end] of a flat word-id array: a polynomial over its word ids (+1),
    modulo 2**64 (numpy's uint64 arithmetic wraps)."""
    import numpy as np

    lengths = ends - starts
    hashes = np.zeros(len(lengths), dtype=np.uint64)
    for position in range(int(lengths.max(initial=0))):
        longer = np.nonzero(lengths > position)[0]
        word = np.asarray(words[starts[longer] + position]).astype(np.uint64) + np.uint64(1)
        hashes[longer] = hashes[longer] * np.uint64(_HASH_MULTIPLIER) + word
    return hashes


def _build_paraphrase_arrays(path: Path) -> dict[str, Any]:
    """The table as flat word-id arrays, its entries sorted by their phrase's key (file order within)."""
    import numpy as np

    vocabulary: dict[str, int] = {}
    phrase_words, phrase_lengths, para_words, para_lengths = (array("i") for _ in range(4))
    for phrase, paraphrase in _paraphrase_pairs(path):
        if not phrase:  # the jar's lookup never reaches an entry with an empty phrase
            continue
        phrase_words.extend(vocabulary.setdefault(word, len(vocabulary)) for word in phrase)
        phrase_lengths.append(len(phrase))
        para_words.extend(vocabulary.setdefault(word, len(vocabulary)) for word in paraphrase)
        para_lengths.append(len(paraphrase))
    flat = {}
    for name, words, lengths in (("phrase", phrase_words, phrase_lengths), ("paraphrase", para_words, para_lengths)):
        lengths_np = np.frombuffer(lengths, dtype=np.int32).astype(np.int64)
        flat[name] = (np.frombuffer(words, dtype=np.int32), lengths_np, np.concatenate(([0], np.cumsum(lengths_np))))
    words_np, _, offsets = flat["phrase"]
    hashes = _phrase_hashes(words_np, offsets[:-1], offsets[1:])
    order = np.argsort(hashes, kind="stable")  # entries sorted by phrase key, file order within
    arrays = {"phrase_hashes": hashes[order]}
    for name, (words_np, lengths_np, offsets) in flat.items():
        starts, sorted_lengths = offsets[:-1][order], lengths_np[order]
        arrays[f"{name}_words"] = words_np[_ragged_indices(starts, sorted_lengths)]
        arrays[f"{name}_offsets"] = np.concatenate(([0], np.cumsum(sorted_lengths)))
    longest = max(max(lengths, default=0) for lengths in (phrase_lengths, para_lengths))
    return {"arrays": arrays, "vocabulary": list(vocabulary), "longest_phrase": longest}


def _ragged_indices(starts, lengths):
    """Indices of the concatenated ranges [start, start + length) (numpy arrays)."""
    import numpy as np

    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)


class ParaphraseTable:
    """The memory-mapped paraphrase index: the phrase pairs a corpus can use.

    Args:
        folder: The cache folder `build_cache` wrote.
        longest_phrase: The most words of a phrase or paraphrase in the table (7 in pycocoevalcap's).
    """

    def __init__(self, folder: Path, longest_phrase: int) -> None:
        import numpy as np

        self.longest_phrase = longest_phrase
        self.words = (folder / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
        self.ids = {word: index for index, word in enumerate(self.words)}
        self.arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _ARRAY_NAMES}

    def __len__(self) -> int:
        return len(self.arrays["phrase_offsets"]) - 1

    def entry(self, index: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Entry `index`'s (phrase, paraphrase) (entries sorted by phrase key)."""
        return self._decode("phrase", [index])[0], self._decode("paraphrase", [index])[0]

    def _ngram_keys(self, captions: Iterable[Sequence[str]]):
        """The key (`_phrase_hashes`) of every run of up to `longest_phrase` table words in the captions (sorted,
        unique)."""
        import numpy as np

        ids = [self.ids.get(word, -1) for words in captions for word in (*words, None)]  # -1: unknown or a boundary
        flat = np.asarray(ids, dtype=np.int64)
        keys, hashes, valid = [], np.zeros(len(flat), dtype=np.uint64), np.ones(len(flat), dtype=bool)
        for length in range(1, self.longest_phrase + 1):  # runs of `length` words starting at each position
            end = len(flat) - length + 1
            if end <= 0:
                break
            word = flat[length - 1 : length - 1 + end]
            valid = valid[:end] & (word >= 0)
            hashes = hashes[:end] * np.uint64(_HASH_MULTIPLIER) + (word + 1).astype(np.uint64)
            keys.append(hashes[valid])
        return np.unique(np.concatenate(keys)) if keys else np.zeros(0, dtype=np.uint64)

    def select(self, captions: Iterable[Sequence[str]]) -> dict[tuple[str, ...], list[tuple[str, ...]]]:
        """Phrase -> its paraphrases (table order), for the entries whose phrase and paraphrase both occur in
        `captions`: only these can match, since the jar matches a phrase of one caption to its paraphrase in the
        other.

        Args:
            captions: The corpus's captions, as their normalised words.
        """
        import numpy as np

        keys = self._ngram_keys(captions)
        sorted_hashes = self.arrays["phrase_hashes"]
        first, last = np.searchsorted(sorted_hashes, keys, "left"), np.searchsorted(sorted_hashes, keys, "right")
        entries = _ragged_indices(first, last - first)
        offsets = self.arrays["paraphrase_offsets"]
        paraphrase_keys = _phrase_hashes(
            self.arrays["paraphrase_words"],
            np.asarray(offsets[entries], dtype=np.int64),
            np.asarray(offsets[entries + 1], dtype=np.int64),
        )
        entries = np.sort(entries[np.isin(paraphrase_keys, keys)])  # table order: phrases together, file order within
        table: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
        for phrase, paraphrase in zip(self._decode("phrase", entries), self._decode("paraphrase", entries)):
            table.setdefault(phrase, []).append(paraphrase)
        return table

    def _decode(self, name: str, entries) -> list[tuple[str, ...]]:
        import numpy as np

        offsets = self.arrays[f"{name}_offsets"]
        entries = np.asarray(entries, dtype=np.int64)
        starts = np.asarray(offsets[entries], dtype=np.int64)
        lengths = np.asarray(offsets[entries + 1], dtype=np.int64) - starts
        flat = [self.words[i] for i in self.arrays[f"{name}_words"][_ragged_indices(starts, lengths)].tolist()]
        ends = np.cumsum(lengths).tolist()
        return [tuple(flat[end - length : end]) for end, length in zip(ends, lengths.tolist())]


_COMPLETE = "language.marshal"  # written last into a cache folder
_ARRAY_NAMES = ("phrase_hashes", "phrase_words", "phrase_offsets", "paraphrase_words", "paraphrase_offsets")


@dataclass
class LanguageData:
    """Everything the aligner and the normaliser read: function words, non-breaking prefixes, synonym sets and their
    irregular forms, and the paraphrase index."""

    function_words: frozenset[str]
    prefixes: dict[str, int]
    exceptions: dict[str, list[str]]
    synsets: dict[str, tuple[int, ...]]
    paraphrases: ParaphraseTable
    folder: Path


def build_cache(sources: MeteorSources, folder: Path) -> None:
    """Write the compact cache of `sources` to `folder`: into a staging folder beside it, then renamed into place
    (a folder another process finished first is kept).

    Args:
        sources: `meteor_sources()`.
        folder: The cache folder (`cache_dir()/meteor/en-<fingerprint>`).
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        _write_cache(sources, staging)
        give_default_permissions(staging)
        try:
            os.rename(staging, folder)
        except OSError:  # another process finished first: its cache is the same
            if not (folder / _COMPLETE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_cache(sources: MeteorSources, staging: Path) -> None:
    import numpy as np

    table = _build_paraphrase_arrays(sources.paraphrases)
    types = {"words": np.uint16 if len(table["vocabulary"]) <= 1 << 16 else np.int32, "offsets": np.int32}
    for name, values in table["arrays"].items():
        kind = types.get(name.rsplit("_", 1)[-1], np.uint64)
        np.save(staging / f"{name}.npy", np.ascontiguousarray(values, dtype=kind))
    (staging / "vocabulary.txt").write_text("\n".join(table["vocabulary"]), encoding="utf-8")
    language = {**_read_jar(sources.jar), "longest_phrase": table["longest_phrase"]}
    (staging / _COMPLETE).write_bytes(marshal.dumps(language))  # last: its presence marks a complete cache


def _rebuild(sources: MeteorSources, folder: Path) -> None:
    """Build the cache unless another process did meanwhile, removing what builders killed mid-way left. (Each
    pycocoevalcap install, e.g. one per virtual environment, has its own cache: delete `cache_dir()/meteor` to free
    them all.)"""
    with exclusive_lock(folder.parent / ".build.lock") as locked:  # one builder at a time; the others load its cache
        if (folder / _COMPLETE).is_file():
            return
        hour_ago = time.time() - 3600
        for stale in folder.parent.glob(".en-*"):  # staging folders of builders killed mid-way
            if locked or stale.stat().st_mtime < hour_ago:  # unlocked (Windows): only old ones, never a live build
                shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)  # a damaged one, if any
        build_cache(sources, folder)


def _load(folder: Path) -> LanguageData:
    data = marshal.loads((folder / _COMPLETE).read_bytes())
    return LanguageData(
        function_words=frozenset(data["function_words"]),
        prefixes=data["prefixes"],
        exceptions=data["exceptions"],
        synsets=data["synsets"],
        paraphrases=ParaphraseTable(folder, data["longest_phrase"]),
        folder=folder,
    )


def load_language_data(sources: MeteorSources) -> LanguageData:
    """The language data of `sources`, from the cache (built on first use; a damaged cache is built again once).

    Args:
        sources: `meteor_sources()`.
    """
    folder = cache_dir() / "meteor" / f"en-{sources.fingerprint()}"
    if not (folder / _COMPLETE).is_file():
        _rebuild(sources, folder)
    try:
        return _load(folder)
    except (OSError, ValueError, EOFError, KeyError, TypeError):  # truncated or damaged files
        shutil.rmtree(folder, ignore_errors=True)
        _rebuild(sources, folder)
        return _load(folder)
