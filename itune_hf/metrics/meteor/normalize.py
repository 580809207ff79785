"""METEOR 1.5's English text normalisation (`-norm`: tokenise and normalise punctuation, keep it, lower-case), in
Python, and the few Java string operations whose Python namesakes differ.

The jar runs this on every caption before aligning it. The rules (a Moses-style tokeniser with METEOR's additions:
quote and dash normalisation, dashes between words split, dots dropped from mixed abbreviations such as "U.S.") are
written here from the jar's documented behaviour; the non-breaking prefixes ("Mr", "Dr", "No" before a number...) are
read from the jar at run time (`language_data.py`). Java's character classes are ASCII where Python's are Unicode
(`\\s`, `\\p{Digit}`, `\\p{Lower}`), so every class is spelled out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["java_hash", "java_split_words", "java_trim", "normalize_line"]

# Letters as the jar counts them: Latin-1 and Latin Extended-A, Cyrillic (with its supplement and extended blocks),
# phonetic extensions.
_ALPHA = "A-Za-z\u0160\u017d\u0161\u017e\u0178\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u017e" + (
    "\u0400-\u04ff\u0500-\u0527\ua640-\ua66e\ua67e-\ua697\u1d00-\u1d7f"
)
_ALNUM = "0-9" + _ALPHA
_JAVA_SPACE = " \t\n\x0b\f\r"  # Java's \s
_TOKEN_DELIMITERS = re.compile("[ \t\n\r\f]+")  # java.util.StringTokenizer's default delimiters

_SEPARATE_OTHER = re.compile(f"([^{_ALNUM}{_JAVA_SPACE}.'`,\\-\u2018\u2019])")
_MULTI_DOT = re.compile(r"\.([.]+)")
_MULTI_DOT_ESCAPED = re.compile(r"DOTMULTI\.([^.])")
_COMMAS = (
    re.compile("([^0-9])[,]([^0-9])"),
    re.compile("([0-9])[,]([^0-9])"),
    re.compile("([^0-9])[,]([0-9])"),
)
_SINGLE_QUOTES = re.compile("([`\u2018\u2019])")
_DOUBLE_QUOTES = re.compile("([\u201c\u201d]|'')")
_DASH_BETWEEN_WORDS = re.compile(f"([{_ALNUM}.])[\\-]([{_ALNUM}])")
_APOSTROPHES = (  # English splits contractions to the right: "it 's", "do n't" stays "don 't"
    (re.compile(f"([^{_ALPHA}])[']([^{_ALPHA}])"), r"\1 ' \2"),
    (re.compile(f"([^{_ALPHA}0-9])[']([{_ALPHA}])"), r"\1 ' \2"),
    (re.compile(f"([{_ALPHA}])[']([^{_ALPHA}])"), r"\1 ' \2"),
    (re.compile(f"([{_ALPHA}])[']([{_ALPHA}])"), r"\1 '\2"),
    (re.compile("([0-9])[']([s])"), r"\1 '\2"),  # 1990's
)
_HAS_LETTER = re.compile(f"[{_ALPHA}]")
_STARTS_LOWER = re.compile("^[a-z]")
_STARTS_DIGIT = re.compile("^[0-9]+")
_WHITE = re.compile("[ \u2000-\u200a\u202f\u205f\u3000\u00a0]+")

#: Kinds of non-breaking prefix: a dot after it never ends a sentence, or only not before a number.
NONBREAKING_ANY, NONBREAKING_NUMERIC = 1, 2


def java_trim(text: str) -> str:
    """`String.trim()`: strips every character up to U+0020 (control characters too), and nothing else.

    Args:
        text: Any string.
    """
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    return text[start:end]


def java_split_words(text: str) -> list[str]:
    """Words as `java.util.StringTokenizer` splits them (space, tab, newline, carriage return, form feed only).

    Args:
        text: Any string.
    """
    return [word for word in _TOKEN_DELIMITERS.split(text) if word]


def java_hash(text: str) -> int:
    """`String.hashCode()` (a signed 32-bit polynomial over UTF-16 code units). The jar compares words by it.

    Args:
        text: Any string (a lone surrogate too, as Java allows).
    """
    value = 0
    data = text.encode("utf-16-le", "surrogatepass")
    for index in range(0, len(data), 2):
        value = (31 * value + (data[index] | data[index + 1] << 8)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _escape_dots(line: str) -> str:
    line = _MULTI_DOT.sub(r" DOTMULTI\1", line)
    while "DOTMULTI." in line:
        line = _MULTI_DOT_ESCAPED.sub(r"DOTDOTMULTI \1", line)
        line = line.replace("DOTMULTI.", "DOTDOTMULTI")
    return line


def _unescape_dots(line: str) -> str:
    while "DOTDOTMULTI" in line:
        line = line.replace("DOTDOTMULTI", "DOTMULTI.")
    return line.replace("DOTMULTI", ".")


def _split_final_dots(words: list[str], prefixes: Mapping[str, int]) -> str:
    """Rebuild the line, splitting a word's final dot unless it ends an abbreviation."""
    out = []
    for position, word in enumerate(words):
        following = words[position + 1] if position + 1 < len(words) else None
        if len(word) > 1 and word.endswith("."):
            stem = word[:-1]
            kind = prefixes.get(stem)
            if "." in stem and _HAS_LETTER.search(stem):  # U.S. -> US
                word = word.replace(".", "")
            elif kind == NONBREAKING_ANY or (following is not None and _STARTS_LOWER.search(following)):
                pass
            elif kind == NONBREAKING_NUMERIC and following is not None and _STARTS_DIGIT.search(following):
                pass
            else:
                word = stem + " ."
        out.append(word + " ")
    return "".join(out)


def normalize_line(line: str, prefixes: Mapping[str, int]) -> str:
    """One caption as METEOR 1.5 normalises English with `-norm` before lower-casing it (punctuation kept).

    Args:
        line: The caption (already trimmed as the jar trims it).
        prefixes: Non-breaking prefix -> `NONBREAKING_ANY` or `NONBREAKING_NUMERIC` (the jar's English list).
    """
    line = _SEPARATE_OTHER.sub(r" \1 ", f" {line} ")
    line = _escape_dots(line)
    for pattern in _COMMAS:
        line = pattern.sub(r"\1 , \2", line)
    line = _SINGLE_QUOTES.sub("'", line)
    line = _DOUBLE_QUOTES.sub(' " ', line)
    line = line.replace("\u2013", "-").replace("--", "-")
    line = _DASH_BETWEEN_WORDS.sub(r"\1 \2", line)
    for pattern, replacement in _APOSTROPHES:
        line = pattern.sub(replacement, line)
    line = _split_final_dots(java_split_words(line), prefixes)
    line = _unescape_dots(line)
    return java_trim(_WHITE.sub(" ", line))
