"""PTB tokenisation as coco-caption does it: hand-checked Penn Treebank cases, quirks, and the Java reference."""

from __future__ import annotations

import random
import unicodedata

import pytest
from metrics_support import coco_tokenize_list, requires_coco

from itune_hf.metrics import ptb_tokenizer
from itune_hf.metrics.ptb_tokenizer import java_lower, tokenize, tokenize_captions

# (caption, tokenised) following the Penn Treebank conventions of the Stanford tokenizer as coco-caption runs it:
# lower-cased, then the tokens '' ' `` ` . ? ! , : - -- ... ; dropped.
CASES = [
    ("A man riding a wave on top of a surfboard.", "a man riding a wave on top of a surfboard"),
    (
        "Don't can't cannot won't I'm he'll we'd they're it's",
        "do n't ca n't can not wo n't i 'm he 'll we 'd they 're it 's",
    ),
    ("gonna wanna gotta", "gon na wan na got ta"),
    # brackets are renamed; coco-caption's list has "-LRB-" but compares lower-cased tokens, so they stay
    ("A dog (brown) [big] {fluffy}", "a dog -lrb- brown -rrb- -lsb- big -rsb- -lcb- fluffy -rcb-"),
    ('He said "hi" and `yes\' \u2018no\u2019 \u201cok\u201d', "he said hi and yes no ok"),
    (
        "Mr. Smith met Dr. Jones at St. Mary's in the U.S. etc.",
        "mr. smith met dr. jones at st. mary 's in the u.s. etc.",
    ),
    ("1,000 people and 3.5 dogs; 1/2 off - 50% -- wow...", "1,000 people and 3.5 dogs 1/2 off 50 % wow"),
    (
        "AT&T R&D e-mail x@y.com http://a.b/c w/ t-shirt and/or",
        "at&t r&d e-mail x@y.com http://a.b/c w / t-shirt and/or",
    ),
    (
        "Caf\u00e9 na\u00efve \u00dcBER Stra\u00dfe \u6771\u4eac \u041f\u0440\u0438\u0432\u0435\u0442",
        "caf\u00e9 na\u00efve \u00fcber stra\u00dfe \u6771\u4eac \u043f\u0440\u0438\u0432\u0435\u0442",
    ),
    ("A dog \U0001f436 runs", "a dog runs"),  # outside the BMP: untokenizable, deleted
    ("a\u00a0dog", "a dog"),
    ("\uff21\uff22\uff23\uff01", "\uff41\uff42\uff43 \uff01"),  # fullwidth letters are letters, the "!" a symbol
    ("", ""),
    (" \t ", ""),
    ("...", ""),
    ("a\nb", "a b"),
    ("fig. 3", "fig. 3"),
    ("\u039f\u0394\u039f\u03a3", "\u03bf\u03b4\u03bf\u03c2"),  # final sigma
    ("The man\u2019s hat isn\u2019t red", "the man 's hat is n't red"),  # curly apostrophes normalised when split
    ("A 2-year-old kid; 3:30 pm!?", "a 2-year-old kid 3:30 pm !?"),  # "!?" is one token, not in the list
    ("I. The end", "i the end"),
    ("Half \u00bd and \u00a2 \u00a3 \u20ac", "half 1/2 and cents # $"),
    ("----- \u2014 \u2013 \u2014\u2014", "-----"),
    ("<b>bold</b> text", "<b> bold </b> text"),
    ("x\u00ady soft\u00ad", "xy soft"),  # soft hyphens removed
    ("see http://\U0001f600 now", "see http://\U0001f600 now"),  # two UTF-16 units: enough for a URL
]


@pytest.mark.parametrize(("caption", "expected"), CASES)
def test_penn_treebank_conventions(caption, expected):
    assert tokenize_captions([caption, "x"])[0] == expected


@requires_coco
def test_hand_cases_agree_with_the_java_tokenizer():
    captions = [caption for caption, _ in CASES]
    assert coco_tokenize_list(captions + ["x"])[:-1] == [expected for _, expected in CASES]


def test_a_caption_depends_on_the_start_of_the_next_and_on_the_end_of_the_text():
    # "B." keeps its period (an abbreviation) unless the next text starts a sentence: "B" then "." (dropped)
    assert tokenize_captions(["Plan B.", "The dog"]) == ["plan b", "the dog"]
    assert tokenize_captions(["Plan B.", "dog"]) == ["plan b.", "dog"]
    assert tokenize_captions(["Plan B.", "", "", "The dog"])[0] == "plan b"  # across empty lines too
    # "fig." is an abbreviation only before a number, which can be on the next line
    assert tokenize_captions(["see fig.", "3 dogs"]) == ["see fig.", "3 dogs"]
    assert tokenize_captions(["see fig.", "dogs"]) == ["see fig", "dogs"]
    # at the very end of the text, "'90" is a quote and a number
    assert tokenize_captions(["'90", "x"])[0] == "'90"
    assert tokenize_captions(["x", "'90"])[1] == "90"


@requires_coco
def test_context_cases_agree_with_the_java_tokenizer():
    for captions in (
        ["Plan B.", "The dog"],
        ["Plan B.", "dog"],
        ["Plan B.", "", "", "The dog"],
        ["see fig.", "3 dogs"],
    ):
        assert tokenize_captions(captions) == coco_tokenize_list(captions), captions
    assert coco_tokenize_list(["x", "'90"]) == tokenize_captions(["x", "'90"])


def test_tokenize_by_image_keeps_ids_and_order():
    result = tokenize({"b": ["A dog.", "Two dogs!"], "a": ["A cat"]})
    assert list(result) == ["b", "a"]
    assert result == {"b": ["a dog", "two dogs"], "a": ["a cat"]}
    assert tokenize_captions([]) == []


def test_line_breaks_inside_a_caption_are_spaces():
    # coco-caption replaces "\n"; the Java tokenizer would also break lines at \r, U+2028, U+2029, \v and \f,
    # shifting every later caption onto the wrong image. We treat them as spaces.
    assert tokenize_captions(["a\rb", "c\u2028d", "e\x0bf", "g"]) == ["a b", "c d", "e f", "g"]


@requires_coco
def test_the_java_tokenizer_misaligns_captions_with_carriage_returns():
    # why we deliberately differ: one "\r" inside caption 0 moves caption 1's tokens onto caption 0's line
    assert coco_tokenize_list(["a\rb", "c"]) == ["a", "b"]
    assert tokenize_captions(["a\rb", "c"]) == ["a b", "c"]


def test_java_lower_case_final_sigma():
    # Java lower-cases per token and decides a final sigma within the word around it
    assert java_lower("\u039f\u0394\u039f\u03a3") == "\u03bf\u03b4\u03bf\u03c2"
    assert java_lower("x-\u03a3") == "x-\u03c2"  # a single hyphen joins the word
    assert java_lower("\u0391\u03a3-\u0392") == "\u03b1\u03c3-\u03b2"
    assert java_lower("\u03a3\u03b1") == "\u03c3\u03b1"
    assert java_lower("\u0130stanbul") == "i\u0307stanbul"
    assert java_lower("d\u6771\u03a3") == "d\u6771\u03c3"  # kanji are words of their own
    assert java_lower("t\u2014\u03a3") == "t\u2014\u03c2"  # dashes join letters


SHAPES = [
    "dog",
    "Dog",
    "cannot",
    "CANNOT",
    "gonna",
    "dog.",
    "dog,",
    "dog!",
    "dog?",
    "dog;",
    "dog:",
    "I.",
    "Mr.",
    "etc.",
    "fig.",
    "co.",
    "PTY.",
    "Calif.",
    "cannot.",
    "12",
    "12.",
    "man's",
    "she'S",
    "they're",
    "I'M",
    "don't",
    "DON'T",
    "n't",
    "can't",
    "cannot's",
]


@pytest.mark.parametrize("chunk", SHAPES)
def test_word_shortcuts_agree_with_the_lexer(chunk):
    raw, _ = ptb_tokenizer._lex(chunk + " \x00", 0, len(chunk))
    full = tuple(t for t in map(java_lower, raw) if t not in ptb_tokenizer.PUNCTUATIONS)
    assert ptb_tokenizer._chunk_tokens(chunk) == full


def _sample_characters(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    line_breaks = {0x0A, 0x0D, 0x0B, 0x0C, 0x85, 0x2028, 0x2029}
    pool = [c for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF and c not in line_breaks]
    chosen = set(range(0x20, 0x250)) | set(range(0x2000, 0x2070)) | set(range(0xFF00, 0xFF70))
    chosen |= set(rng.sample(pool, count))
    return [chr(c) for c in sorted(chosen - line_breaks)]


@requires_coco
def test_characters_agree_with_the_java_tokenizer():
    # every character class of the lexer: a sample of the BMP alone, inside a word, after "x." and after "x-"
    lines, chars = [], []
    for char in _sample_characters(3000, seed=0):
        lines += [char, f"x{char}x", f"x.{char}", f"x-{char}"]
        chars += [char] * 4
    lines.append("end")
    ours = tokenize_captions(lines)
    theirs = coco_tokenize_list(lines)
    mismatches = [
        (f"U+{ord(chars[i]):04X} {unicodedata.name(chars[i], '?')}", lines[i], theirs[i], ours[i])
        for i in range(len(chars))
        if ours[i] != theirs[i]
    ]
    assert not mismatches, mismatches[:10]
