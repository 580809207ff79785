"""PTB tokenisation exactly as coco-caption does it, in pure Python (no Java).

coco-caption (`pycocoevalcap.tokenizer.ptbtokenizer.PTBTokenizer`) writes all captions of one call to a file, one
per line (newlines inside a caption replaced by spaces), runs the Stanford tokenizer of CoreNLP 3.4.1 over it with
`-preserveLines -lowerCase`, and drops the tokens that are in its punctuation list. This module reproduces that
pipeline: a longest-match lexer that follows the behaviour of the Stanford lexer rule by rule (abbreviations,
acronyms, contractions, quotes, URLs, numbers, fractions, brackets, dashes, ellipses, untokenizable characters...),
Java's lower-casing, and the same punctuation filter. It was checked against the real tokenizer character by
character over the Basic Multilingual Plane and on large random corpora (see tests/metrics/test_metrics_parity.py).

Quirks reproduced on purpose, because coco-caption scores depend on them:

* Brackets become `-lrb-`, `-rrb-`, `-lsb-`, `-rsb-`, `-lcb-`, `-rcb-` and are *kept*: coco-caption's punctuation
  list has the upper-case `-LRB-`, but the tokens are lower-cased before the comparison.
* Contractions split the Penn Treebank way: "don't" -> "do n't", "can't" -> "ca n't", "cannot" -> "can not",
  "gonna" -> "gon na", "it's" -> "it 's"; curly apostrophes in the split-off part become straight ones.
* Abbreviations and acronyms keep their period ("mr.", "u.s.", "etc."), other final periods are dropped; a single
  letter with a period keeps it unless the next text (which can be the next caption) starts a sentence ("I. The").
* The lexer sees all captions of one call as one text, so a caption's tokens can depend on the start of the next
  one (abbreviations before a number, "A." before "The ..."), and the last caption is followed by the end of file.
  `tokenize_captions` tokenises a list in one such pass, like one coco-caption call.
* Characters the lexer cannot tokenise (emoji and other characters outside the Basic Multilingual Plane, control
  characters, most symbols outside its lists) are deleted; they still separate tokens.
* Lines that end up empty give an empty caption "" (which BLEU, ROUGE-L and CIDEr-D then score their own ways).
* The lexer's character classes are those of the Unicode version it was generated with (6.2), not Python's
  (`_ptb_tables`), and it reads UTF-16: a character outside the BMP is two units (a URL can end in an emoji).
* Tokens are lower-cased like Java's `toLowerCase(Locale.ENGLISH)`, including its final-sigma rule, which looks
  for cased letters within the word around a capital sigma as Java's word break iterator delimits words.

Deliberate differences (where coco-caption is broken or the input is invalid):

* The Java tokenizer also starts a new output line at `\\r`, U+2028, U+2029, `\\v` and `\\f` (a caption with a
  Windows line break inside is enough), which shifts every later caption of a coco-caption call onto the wrong
  image. Here those characters are treated like the newlines coco-caption already replaces: as spaces.
* A lone surrogate (invalid text) makes coco-caption fail when it encodes its input; here it is deleted like any
  untokenizable character.
* Final sigma next to characters that Java 17 does not know yet (Unicode 14 additions) follows Python's Unicode.
"""

from __future__ import annotations

import bisect
import operator
import re
import unicodedata
from collections.abc import Callable, Hashable, Mapping, Sequence

from ._ptb_tables import DIGIT_RANGES, LETTER_RANGES, WORD_EXTRA_RANGES, char_class

__all__ = ["PUNCTUATIONS", "tokenize", "tokenize_captions"]

# coco-caption's list of tokens dropped after tokenisation (compared with the lower-cased tokens, so the bracket
# names in it never match).
PUNCTUATIONS = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)

NEWLINE_TOKEN = "\n"  # marks a line break in the lexer's token stream

# ---------------------------------------------------------------------------------------------------------------
# Character classes (bodies, without brackets)

_LJ = char_class(LETTER_RANGES)  # letters
_LX = char_class(WORD_EXTRA_RANGES)  # extra word characters (marks, soft hyphen)
_LX_HARD = char_class(WORD_EXTRA_RANGES.replace("00AD ", ""))  # the same without the soft hyphen
_DG = char_class(DIGIT_RANGES)  # digits
_UPPER = "A-Z"  # upper case letters (only decide whether an abbreviation's period is also a token: it is dropped)


def _ci(literal: str) -> str:
    """A case-insensitive pattern for an ASCII literal (the lexer is caseless for literals, not for classes)."""
    out = []
    for char in literal:
        if char.isascii() and char.isalpha():
            out.append(f"[{char.lower()}{char.upper()}]")
        else:
            out.append(re.escape(char))
    return "".join(out)


def _ci_alt(*literals: str) -> str:
    """Case-insensitive alternation of literals, longest first."""
    return "(?:" + "|".join(_ci(x) for x in sorted(literals, key=len, reverse=True)) + ")"


# ---------------------------------------------------------------------------------------------------------------
# Building blocks of the lexer's rules

_SPACE = r"[ \t\u00A0\u2000-\u200A\u3000]"
_NEWLINE = r"(?:\r\n|[\r\n\u2028\u2029\x0b\x0c\x85])"
_SPACENL = rf"(?:{_SPACE}|{_NEWLINE})"
_SPACENLS = rf"{_SPACENL}+"
_SGML = (
    r"<(?:[!?][A-Za-z\-][^>\r\n]*"
    r"|[A-Za-z][A-Za-z0-9_:.\-]*(?:[ ]+(?:[A-Za-z][A-Za-z0-9_:.\-]*[ ]*=[ ]*(?:'[^']*'|\"[^\"]*\")"
    r"|[A-Za-z][A-Za-z0-9_:.\-]*))*[ ]*/?"
    r"|/[A-Za-z][A-Za-z0-9_:.\-]*)[ ]*>"
)
_SENTEND = rf"{_SPACENL}(?:{_SGML}|{_SPACENL}|[{_UPPER}])"
_SPAMP = _ci("&amp;")
_SPLET = r"&[aeiouAEIOU]" + _ci_alt("acute", "grave", "uml") + ";"
_LETTER = rf"(?:[{_LJ}{_LX}]|{_SPLET})"
_LETTER_OR_DIGIT = rf"(?:[{_LJ}{_LX}{_DG}]|{_SPLET})"
# "(?:[x]|SPLET)*" unrolled (an entity starts with "&", which is no letter), which the regex engine runs much faster
_LETTERS = rf"[{_LJ}{_LX}]*(?:{_SPLET}[{_LJ}{_LX}]*)*"
_LETTERS_OR_DIGITS = rf"[{_LJ}{_LX}{_DG}]*(?:{_SPLET}[{_LJ}{_LX}{_DG}]*)*"
_WORD = rf"{_LETTER}{_LETTERS_OR_DIGITS}(?:[.!?]{_LETTER}{_LETTERS_OR_DIGITS})*"
_NUM = rf"[{_DG}]*(?:[.:,\u00AD\u066B\u066C][{_DG}]+)+|[{_DG}]+"
_APOS = r"(?:['\u0092\u2019]|" + _ci("&apos;") + ")"
_APOSETC = r"(?:['\u0092\u2019`\u0091\u2018\u201B]|" + _ci("&apos;") + ")"
_HYPHEN = r"[\-_\u058A\u2010\u2011]"
_JL_OR_DG = rf"[{_LJ}{_DG}]"
_THING_PREFIX = rf"(?:[dDoOlL]{_APOSETC}{_JL_OR_DG})?"
_THING = rf"{_THING_PREFIX}{_JL_OR_DG}+(?:{_HYPHEN}{_THING_PREFIX}{_JL_OR_DG}+)*"
_THINGA = rf"[A-Z]+(?:(?:[+&]|{_SPAMP})[A-Z]+)+"
_ACRO_SPECIAL = [
    _ci_alt("Canada", "Sino", "Korean", "EU", "Japan", "non") + _ci("-U.S"),
    _ci("U.S.-") + _ci_alt("U.K", "U.S.S.R"),
]
_ACRO = ["[A-Za-z](?:\\.[A-Za-z])*", *_ACRO_SPECIAL]
_ACRO2 = "(?:" + "|".join(["[A-Za-z](?:\\.[A-Za-z])+", *_ACRO_SPECIAL]) + ")"
_HTHING = rf"[A-Za-z0-9][A-Za-z0-9.,\u00AD]*(?:-(?:{_ACRO2}\.|[A-Za-z0-9\u00AD]+))+"
_REDAUX = _APOS + "(?:[msdMSD]|" + _ci_alt("re", "ve", "ll") + ")"
_SWORD = r"[A-Za-z\u00AD]*[A-MO-Za-mo-z]\u00AD*"
_SREDAUX = _ci("n") + _APOSETC + _ci("t")
_APOWORD = [
    _APOS + _ci("n") + _APOS + "?",
    "[lLdDjJ]" + _APOS,
    _ci("Dunkin") + _APOS,
    _ci("somethin") + _APOS,
    _ci("ol") + _APOS,
    _APOS + _ci("em"),
    rf"[A-HJ-XZn]{_APOSETC}[{_LJ}]{{2}}[{_LJ}]*",
    _APOS + "[2-9]0" + _ci("s"),
    _APOS + _ci("til") + "[lL]?",
    rf"[{_LJ}][{_LJ}]*[aeiouyAEIOUY]{_APOSETC}[aeiouA-Z][{_LJ}]*",
    _APOS + _ci("cause"),
    _ci("cont'd") + r"\.?",
    _ci("'twas"),
    _ci("nor'easter"),
    _ci("c'mon"),
    _ci("e'er"),
    _ci("s'mores"),
    _ci("ev'ry"),
    _ci("li'l"),
    _ci("nat'l"),
    _ci("O") + _APOSETC + _ci("o"),
]
_URL_CHARS = r"[^ \t\n\f\r\"<>|(){}]"
_URL_END = r"[^ \t\n\f\r\"<>|.!?(){},\-]"
_FULLURL = _ci("http") + "[sS]?://" + _URL_CHARS + "+" + _URL_END
_URL_PATH = r"(?:/[^ \t\n\f\r\"<>|()]+" + _URL_END + ")?"
_LIKELYURL = [
    _ci("www.") + r"(?:[^ \t\n\f\r\"<>|.!?(){},]+\.)+[a-zA-Z]{2,4}" + _URL_PATH,
    # ",-_" is a character range here (as in the tokenizer), so digits and upper case letters are excluded.
    r"(?:[^ \t\n\f\r\"`'<>|.!?(){},-_$]+\.)+" + _ci_alt("com", "net", "org", "edu") + _URL_PATH,
]
_EMAIL = (
    "(?:" + _ci("&lt;") + r"|<)?[a-zA-Z0-9][^ \t\n\f\r\"<>|()\u00A0{}]*@"
    r"(?:[^ \t\n\f\r\"<>|(){}.\u00A0]+\.)*[^ \t\n\f\r\"<>|(){}.\u00A0]+(?:" + _ci("&gt;") + "|>)?"
)
_ABBREV1 = (
    r"(?=[A-Za-z]{1,7}(?:\.[dD])?\.)(?:"
    + "|".join(
        [
            _ci_alt("Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec"),
            _ci_alt("Mon", "Tue", "Tues", "Wed", "Thu", "Thurs", "Fri"),
            _ci_alt("Ala", "Ariz", "Calif", "Colo", "Conn", "Ct", "Dak", "Fla", "Ga", "Ind", "Kan", "Kans", "Ky"),
            _ci_alt("Md", "Mich", "Minn", "Mo", "Mont", "Neb", "Nev", "Okla", "Penn", "Tenn", "Va", "Vt"),
            _ci_alt("Wis", "Wisc", "Wyo"),
            # state abbreviations that are also common words: first letter upper case only
            "A" + _ci("z"),
            "A" + _ci("rk"),
            "D" + _ci("el"),
            "I" + _ci("ll"),
            "L" + _ci("a"),
            "M" + _ci("ass"),
            "M" + _ci("iss"),
            "O" + _ci("re"),
            "P" + _ci("a"),
            "T" + _ci("ex"),
            "W" + _ci("ash"),
            _ci_alt("Inc", "Co", "Cos", "Corp", "Ltd", "Plc", "Rt", "Bancorp", "Bhd", "Assn", "Univ", "Intl", "Sys"),
            _ci("P") + _ci("p") + "?" + _ci("t") + "[ye]" + _ci("s") + "?",
            _ci_alt("tel", "est", "ext", "sq"),
            _ci_alt("Jr", "Sr", "Bros", "Ed.D", "Ph.D", "Blvd", "Rd", "Esq"),
            _ci_alt("etc", "al", "seq", "Bldg"),
        ]
    )
    + r")\."
)
_ABTITLE = [
    _ci_alt(
        "Mr",
        "Mrs",
        "Ms",
        "Dr",
        "Drs",
        "Prof",
        "Profs",
        "Sen",
        "Sens",
        "Rep",
        "Reps",
        "Atty",
        "Attys",
        "Lt",
        "Col",
        "Gen",
        "Messrs",
        "Gov",
        "Govs",
        "Adm",
        "Rev",
        "Maj",
        "Sgt",
        "Cpl",
        "Pvt",
        "Capt",
        "St",
        "Ste",
        "Ave",
        "Pres",
        "Lieut",
        "Hon",
        "Brig",
        "Cmdr",
        "Comdr",
        "Pfc",
        "Spc",
        "Supt",
        "Supts",
        "Det",
        "Mt",
        "Ft",
        "Adj",
        "Adv",
        "Asst",
        "Assoc",
        "Ens",
        "Insp",
        "Mlle",
        "Mme",
        "Msgr",
        "Sfc",
    ),
    "M" + _ci("iss"),
]
# Cheap necessary conditions put before the long alternations of literal abbreviations (they only save time):
# at most 6 letters (or "a.k.a") before the period or space, at most 7 (or "Ed.D", "Ph.D") before the period.
_SHORT_ABBREV = r"(?=[A-Za-z][A-Za-z.]{0,5}[.\t \u00A0\u2000-\u200A\u3000])"
_ABBREV4 = [
    *(
        _SHORT_ABBREV + alternative
        for alternative in [
            *_ABTITLE,
            _ci_alt("vs", "Alex", "Wm", "Jos", "Cie", "a.k.a", "cf", "TREAS", "Ph"),
            _ci_alt("Invt", "Elec", "Natl", "Dept"),
            _ci("M") + "[ft]" + _ci("g"),
        ]
    ),
    *_ACRO,
]
_ABBREV3 = _ci_alt("ca", "fig", "figs", "prop", "no", "nos", "art", "bldg", "pp", "op") + r"\."
_PHONE = (
    r"(?:\([0-9]{2,3}\)[ \u00A0]?|(?:\+\+?)?(?:[0-9]{2,4}[\- \u00A0])?[0-9]{2,4}[\- \u00A0])[0-9]{3,4}[\- \u00A0]?"
    r"[0-9]{3,5}|(?:(?:\+\+?)?[0-9]{2,4}\.)?[0-9]{2,4}\.[0-9]{3,4}\.[0-9]{3,5}"
)
_QUOTE_CHARS = "`\u2018\u2019\u201a\u201b\u201c\u201d\u0091\u0092\u0093\u0094\u201e\u201f\u2039\u203a\u00ab\u00bb"
_DBLQUOT = '(?:"|' + _ci("&quot;") + ")"
_SMILEY = r"[<>]?[:;=][\-o*']?[()DPdpO\\{@|\[\]]"
_ASIAN = r"[\-\^x=~<>']"
_ASIANSMILEY = [
    r"[\^x=~<>]\.\[\^" + _ci("x") + r"=~<>\]",
    rf"{_ASIAN}_{_ASIAN}",
    rf"\({_ASIAN}[_.]?{_ASIAN}\)",
    r"\([\^x=~<>']-[\^x=~<>'`]\)",
]
_MISCSYMBOL = (
    "[+%&~\\^|\\\\\u00a6\u00a7\u00a8\u00a9\u00ac\u00ae\u00af\u00b0-\u00b3\u00b4-\u00ba\u00d7\u00f7\u0387\u05be"
    "\u05c0\u05c3\u05c6\u05f3\u05f4\u0600-\u0603\u0606-\u060a\u060c\u0614\u061b\u061e\u066a\u066d\u0703-\u070d"
    "\u07f6\u07f7\u07f8\u0964\u0965\u0e4f\u1fbd\u2016\u2017\u2020-\u2023\u2030-\u2038\u203b\u203e-\u2042\u2044"
    "\u207a-\u207f\u208a-\u208e\u2100-\u214f\u2190-\u21ff\u2200-\u2bff\u3012\u30fb\uff01-\uff0f\uff1a-\uff20"
    "\uff3b-\uff40\uff5b-\uff65]"
)
_FILENAME_EXT = _ci_alt(
    *"bat bmp c class cgi cpp dll doc docx exe gif gz h htm html jar java jpeg jpg mov mp3 pdf php pl png ppt ps py "
    "sql tar txt wav x xml zip".split()
)
_FILENAME = rf"{_LETTER_OR_DIGIT}{_LETTERS_OR_DIGITS}(?:[.]{_LETTER_OR_DIGIT}{_LETTERS_OR_DIGITS})*[.]{_FILENAME_EXT}"
_ACRONYM_NEXT = (
    "(?:"
    + "|".join(
        [
            "A" + _ci(w[1:])
            for w in ["About", "According", "Additionally", "After", "An", "As", "At", "A"]  # longest first
        ]
        + [
            w[0] + _ci(w[1:])
            for w in [
                "But",
                "Earlier",
                "He",
                "Her",
                "Here",
                "However",
                "If",
                "In",
                "It",
                "Last",
                "Many",
                "More",
                "Mr.",
                "Ms.",
                "Now",
                "Once",
                "One",
                "Other",
                "Our",
                "She",
                "Since",
                "So",
                "Some",
                "Such",
                "That",
                "The",
                "Their",
                "Then",
                "There",
                "These",
                "They",
                "This",
                "We",
                "When",
                "While",
                "What",
                "Yet",
                "You",
            ]
        ]
        + [_SGML]
    )
    + ")"
)

# ---------------------------------------------------------------------------------------------------------------
# Token normalisations (the tokenizer's default "PTB3 escaping" options)

_AMP = re.compile("&amp;", re.IGNORECASE)
_FRACTIONS = str.maketrans({"\u00bc": "1/4", "\u00bd": "1/2", "\u00be": "3/4", "\u2153": "1/3", "\u2154": "2/3"})
_CURRENCY = str.maketrans(
    {"\u00a2": "cents", "\u00a3": "#", "\u0080": "$", "\u00a4": "$", "\u20a0": "$", "\u20ac": "$"}
)
_LEFT_QUOTES = re.compile("&apos;|'|\"|&quot;")
_QUOTE_MAP = {
    "\u0091": "`", "\u2018": "`", "\u201b": "`", "\u2039": "`",
    "\u0092": "'", "\u2019": "'", "\u203a": "'",
    "\u0093": "``", "\u201c": "``", "\u00ab": "``",
    "\u0094": "''", "\u201d": "''", "\u00bb": "''",
}  # fmt: skip
_UNICODE_QUOTES = re.compile("[" + "".join(_QUOTE_MAP) + "]")


def _quotes(text: str, left: bool) -> str:
    """LaTeX-style quotes: ' -> ` or ', \" -> `` or '' (left or right), curly quotes by their direction."""
    if left:
        text = _LEFT_QUOTES.sub(lambda m: "`" if m.group() in ("'", "&apos;") else "``", text)
    else:
        text = _LEFT_QUOTES.sub(lambda m: "'" if m.group() in ("'", "&apos;") else "''", text)
    return _UNICODE_QUOTES.sub(lambda m: _QUOTE_MAP[m.group()], text)


def _no_soft_hyphens(text: str) -> str:
    if "\u00ad" not in text:
        return text
    return text.replace("\u00ad", "") or "-"


def _parens(text: str) -> str:
    return text.replace("(", "-LRB-").replace(")", "-RRB-")


def _nbsp(text: str) -> str:
    return text.replace(" ", "\u00a0")


def _same(text: str) -> str:
    return text


# ---------------------------------------------------------------------------------------------------------------
# The rules, in the lexer's priority order. The lexer takes the longest match (trailing context included); on a
# tie the earlier rule wins. Each rule: name, patterns (alternatives; the longest counts), whether the pattern has
# a trailing context after the group "t", the normalisation of the token, and how many characters of the token are
# given back to the input ("pushback").

_SKIP = None  # normalisation marker: no token
_TO_URL_END = -1
_URL_STOP = re.compile(r"[ \t\n\f\r\"<>|(){}]")
_DASHES = "--"


class _Rule:
    __slots__ = ("name", "patterns", "trailing", "normalize", "pushback", "longest")

    def __init__(
        self,
        name: str,
        patterns: Sequence[str] | str,
        normalize: Callable[[str], str] | str | None = _same,
        *,
        trailing: bool = False,
        pushback: int = 0,
        longest: int = 0,
    ) -> None:
        self.name = name
        if isinstance(patterns, str):
            patterns = [patterns]
        self.patterns = [re.compile(p, re.DOTALL) for p in patterns]
        self.trailing = trailing
        self.normalize = normalize
        self.pushback = pushback
        # For patterns whose first match need not be the longest (bounded repetitions with alternatives, repeated
        # groups that can swallow what follows them), the longest match is searched among ends up to `longest`
        # characters further, or up to the next character no URL contains (_TO_URL_END).
        self.longest = longest


def _t(main: str, context: str) -> str:
    return f"(?P<t>{main}){context}"


_RULES: list[_Rule] = [
    _Rule("c++", _ci("c") + r"\+\+"),
    _Rule("c#", r"[cCfF]#"),
    _Rule("cannot", _ci("cannot"), pushback=3),
    _Rule("'twas", _ci("'twas"), pushback=3),
    _Rule("'tis", _ci("'tis"), pushback=2),
    _Rule("gonna", _ci_alt("gonna", "gotta", "lemme", "gimme", "wanna"), pushback=2),
    _Rule("sgml", _SGML, _nbsp, longest=200),
    _Rule("spmdash", _ci_alt("&MD;", "&mdash;", "&ndash;") + "|[\u0096\u0097\u2013\u2014\u2015]", _DASHES),
    _Rule("spamp", _SPAMP, lambda s: "&"),
    _Rule("sppunc", "&(?:" + "|".join(_ci(x) for x in "HT TL UR LR QC QL QR odq cdq".split()) + "|#[0-9]+);"),
    _Rule("word/redaux", _t(_WORD, _REDAUX), _no_soft_hyphens, trailing=True),
    _Rule("sword/sredaux", _t(_SWORD, _SREDAUX), _no_soft_hyphens, trailing=True),
    _Rule("word", _WORD, _no_soft_hyphens),
    _Rule("apoword", _APOWORD),
    _Rule("apoword2", _t(_ci("y") + _APOS, f"[{_LJ}]"), trailing=True),
    _Rule("fullurl", _FULLURL),
    _Rule("likelyurl", _LIKELYURL, longest=_TO_URL_END),
    _Rule("email", _EMAIL),
    _Rule("twitter", [r"@[a-zA-Z_][a-zA-Z_0-9]*", rf"#{_LETTER}{_LETTERS}"]),
    _Rule("redaux/", _t(_REDAUX, "[^A-Za-z]"), lambda s: _quotes(s, False), trailing=True),
    _Rule("sredaux/", _t(_SREDAUX, "[^A-Za-z]"), lambda s: _quotes(s, False), trailing=True),
    _Rule("date", rf"[{_DG}]{{1,2}}[\-/][{_DG}]{{1,2}}[\-/][{_DG}]{{2,4}}"),
    _Rule("number", rf"[\-+]?(?:{_NUM})", _no_soft_hyphens),
    _Rule("subsupnum", r"[\u207A\u207B\u208A\u208B]?(?:[\u2070\u00B9\u00B2\u00B3\u2074-\u2079]+|[\u2080-\u2089]+)"),
    _Rule("frac", rf"(?:[{_DG}]{{1,4}}[\- \u00A0])?[{_DG}]{{1,4}}(?:\\?/|\u2044)[{_DG}]{{1,4}}", _nbsp),
    _Rule("frac2", "[\u00bc\u00bd\u00be\u2153-\u215e]", lambda s: s.translate(_FRACTIONS)),
    _Rule(
        "tbspec",
        [
            "-" + _ci_alt("RRB", "LRB", "RCB", "LCB", "RSB", "LSB") + "-",
            _ci("C.D.s"),
            _ci("pro-"),
            _ci("anti-"),
            _ci("S") + "(?:&|" + _SPAMP + ")" + _ci("P-500"),
            _ci("S") + "(?:&|" + _SPAMP + ")" + _ci("Ls"),
            _ci("Cap") + _APOS + _ci("n"),
            _ci("c") + _APOS + _ci("est"),
        ],
        lambda s: _AMP.sub("&", s),
    ),
    _Rule("thing3", r"[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}(?:\\?/[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}){1,2}", longest=100),
    _Rule("dolsign", r"[A-Z]*\$|#"),
    _Rule(
        "dolsign2",
        "[\u00a2\u00a3\u00a4\u00a5\u0080\u20a0\u20ac\u060b\u0e3f\u20a4\uffe0\uffe1\uffe5\uffe6]",
        lambda s: s.translate(_CURRENCY),
    ),
    _Rule("acronym/", [_t(a + r"\.", f"{_SPACENLS}{_ACRONYM_NEXT}{_SPACENL}") for a in _ACRO], trailing=True),
    _Rule("abbrev3/", _t(_ABBREV3, f"{_SPACENL}?[{_DG}]"), trailing=True),
    _Rule("pty/", _t(_ci("pt") + r"[eyEY]\.|" + _ci("co."), _SPACE + _ci_alt("ltd", "lim")), trailing=True),
    _Rule("abbrev1/sentend", _t(_ABBREV1, _SENTEND), trailing=True, pushback=1),
    _Rule("abbrev1/..", _t(_ABBREV1, ".."), trailing=True),
    _Rule("abbrev1", _ABBREV1, pushback=1),
    _Rule("abbrev2", [a + r"\." for a in _ABBREV4]),
    _Rule("abbrev4/", [_t(a, _SPACE) for a in _ABBREV4], trailing=True),
    _Rule("acro/", [_t(a, _SPACENL) for a in _ACRO], trailing=True),
    _Rule("tbspec2/", _t(_APOS + "[0-9][0-9]", _SPACENL), trailing=True),
    _Rule("filename/", _t(_FILENAME, rf"(?:{_SPACENL}|[.?!,])"), trailing=True),
    _Rule("word./", _t(_WORD + r"\.", r"[,;:\u3001]"), _no_soft_hyphens, trailing=True),
    _Rule("phone", _PHONE, lambda s: _parens(_nbsp(s)), longest=40),
    _Rule("dblquot/", _t(_DBLQUOT, "[A-Za-z0-9$]"), lambda s: _quotes(s, True), trailing=True),
    _Rule("dblquot", _DBLQUOT, lambda s: _quotes(s, False)),
    _Rule("del", "\x7f", _SKIP),
    _Rule("lessthan", "<|" + _ci("&lt;"), lambda s: "<"),
    _Rule("greaterthan", ">|" + _ci("&gt;"), lambda s: ">"),
    _Rule("smiley/", _t(_SMILEY, "[^A-Za-z0-9]"), _parens, trailing=True),
    _Rule("asiansmiley", _ASIANSMILEY, _parens),
    _Rule("{", r"\{", "-LCB-"),
    _Rule("}", r"\}", "-RCB-"),
    _Rule("[", r"\[", "-LSB-"),
    _Rule("]", r"\]", "-RSB-"),
    _Rule("(", r"\(", "-LRB-"),
    _Rule(")", r"\)", "-RRB-"),
    _Rule("hyphens", r"-+", lambda s: _DASHES if 3 <= len(s) <= 4 else s),
    _Rule("ldots", [r"\.{3,5}", r"(?:\.[ \u00A0]){2,4}\.", "[\u0085\u2026]"], "..."),
    _Rule("fnmarks", ["@+", "#+", "_+"]),
    _Rule("asts", [r"\*+", r"(?:\\\*){1,3}"]),
    _Rule("insentp", "[,;:\u3001]"),
    _Rule("?!", "[?!]+"),
    _Rule("punct", "[.\u00a1\u00bf\u037e\u0589\u061f\u06d4\u0700-\u0702\u07fa\u3002]"),
    _Rule("=", "="),
    _Rule("/", "/"),
    _Rule("hthing./", _t(_HTHING + r"\.", r"[,;:\u3001]"), _no_soft_hyphens, trailing=True),
    _Rule("hthing", _HTHING, _no_soft_hyphens),
    _Rule("thing./", _t(_THING + r"\.", r"[,;:\u3001]"), trailing=True),
    _Rule("thing", _THING),
    _Rule("thinga./", _t(_THINGA + r"\.", r"[,;:\u3001]"), lambda s: _AMP.sub("&", s), trailing=True),
    _Rule("thinga", _THINGA, lambda s: _AMP.sub("&", s)),
    _Rule("'/", _t("'", "[A-Za-z][^ \t\n\r\u00a0]"), lambda s: _quotes(s, True), trailing=True),
    _Rule("redaux", _REDAUX, lambda s: _quotes(s, False)),
    _Rule("sredaux", _SREDAUX, lambda s: _quotes(s, False)),
    _Rule("quotes", [_APOS, "''", f"[{_QUOTE_CHARS}]{{1,2}}"], lambda s: _quotes(s, False)),
    _Rule("duckfeet", "<<|>>"),
    _Rule("miscsymbol", _MISCSYMBOL),
    _Rule("space", [r"\x00", _SPACE + "+", "[\u200b\u200e\u200f\ufeff]"], _SKIP),
    _Rule("newline", _NEWLINE, lambda s: NEWLINE_TOKEN),
    _Rule("nbsp", _ci("&nbsp;"), _SKIP),
    _Rule("untokenizable", "[^\n]", _SKIP),
]

_SPECIAL = {"acronym/", "abbrev3/"}  # actions with extra logic (see _lex)


def _combine(rules: list[_Rule]) -> tuple[re.Pattern, list[tuple[_Rule, re.Pattern, int, int]]]:
    """One pattern trying every alternative of every rule at a position (each in a capturing lookahead).

    Returns the pattern and, per alternative in rule order: its rule, its own compiled pattern, the index of the
    group holding its whole match and the index of the group holding the token part of a trailing-context rule.
    """
    parts, names = [], []
    for rule in rules:
        for pattern in rule.patterns:
            name = f"r{len(names)}"
            body = pattern.pattern.replace("(?P<t>", f"(?P<{name}t>")
            parts.append(f"(?:(?=(?P<{name}>{body})))?")
            names.append((rule, pattern, name))
    combined = re.compile("".join(parts), re.DOTALL)
    index = combined.groupindex
    table = [(rule, pattern, index[name], index.get(name + "t", index[name])) for rule, pattern, name in names]
    return combined, table


_ALL_RULES, _ALTERNATIVES = _combine(_RULES)
_whole_spans = operator.itemgetter(*(alternative[2] for alternative in _ALTERNATIVES))
_second = operator.itemgetter(1)
_LONGEST_ALTERNATIVES = [k for k, alternative in enumerate(_ALTERNATIVES) if alternative[0].longest]


def _extend(rule: _Rule, pattern: re.Pattern, text: str, pos: int, end: int) -> tuple[int, re.Match | None]:
    """The longest match of `pattern` at `pos` ending after `end`, for rules whose first match may be shorter."""
    if rule.longest == _TO_URL_END:
        found = _URL_STOP.search(text, end)
        limit = found.start() if found else len(text)
    else:
        limit = min(len(text), pos + rule.longest)
    for stop in range(limit, end, -1):
        longer = pattern.fullmatch(text, pos, stop)
        if longer is not None:
            return stop, longer
    return end, None


# Tokens that no rule can make longer, recognised without trying the rules (most tokens are of these kinds):
# - a word (letters, then letters or digits; no soft hyphen) or a number of ASCII digits, followed by closing
#   punctuation (or nothing) and then a space, tab or line break (or another space where no URL or e-mail address
#   can follow): URLs and e-mail addresses can only extend over other characters, phone numbers and fractions only
#   over a space before a digit;
# - runs of spaces (no token; a run that starts with another space than " " or tab can begin a URL, so not before
#   a "."); "!"/"?" runs;
#   brackets and parentheses (not "(" before what could be a phone number or an Asian smiley); ",", ".", ":",
#   ";", "-" where they cannot start a number, an ellipsis or a smiley; a double quote.
_CLOSING = r"[,;:!?)\]}\"]*"
# another space, up to the next space, tab or line break with no "." "@" ":" (no URL or e-mail address is there)
_URL_FREE_SPACE = r"[\u00a0\u2000-\u200a\u3000\x85][^ \t\n.@:]*(?:[ \t\n]|\Z)"
_QUICK = re.compile(
    rf"(?P<word>[{_LJ}{_LX_HARD}][{_LJ}{_LX_HARD}{_DG}]*)(?={_CLOSING}(?:[ \t\n]|\Z|{_URL_FREE_SPACE}))"
    rf"|(?P<number>[0-9]+)(?={_CLOSING}(?:[\t\n]|\Z|[ ](?!\d)))"
    r"|(?P<space>[ \t][ \t\u00a0\u2000-\u200a\u3000]*|[\u00a0\u2000-\u200a\u3000]+(?=[^.\n \t]*(?:[ \t\n]|\Z)))"
    r"|(?P<same>[!?]+|,(?!\d)|\.(?=[\t\n]|\Z|[ ](?!\.))|[:;\-](?=[ \t\n]|\Z))"
    r"|(?P<bracket>[\[\]{})]|\((?![0-9\-^x=~<>']))"
    r"|(?P<left>\"(?=[A-Za-z0-9$]))|(?P<right>\")"
)
_QUICK_TOKENS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
_QUICK_TOKENS.update({"left": "``", "right": "''"})


def _lex(text: str, start: int, stop: int) -> tuple[list[str], int]:
    """Raw tokens (normalised, not lower-cased) of the tokens starting in text[start:stop].

    The whole of `text` is visible as trailing context, as in the Java lexer, which sees all lines of a call.
    Returns the tokens and the position where lexing stopped (>= stop; past it when a token crossed it).
    """
    tokens: list[str] = []
    pos = start
    match_all = _ALL_RULES.match
    quick = _QUICK.match
    while pos < stop:
        simple = quick(text, pos)
        if simple is not None:
            kind, token = simple.lastgroup, simple.group()
            if kind != "word" or token.lower() not in _SPLIT_WORDS:
                pos += len(token)
                if kind == "space":
                    continue
                if kind == "bracket":
                    token = _QUICK_TOKENS[token]
                elif kind in ("left", "right"):
                    token = _QUICK_TOKENS[kind]
                tokens.append(token)
                continue
        spans = match_all(text, pos).regs
        ends = list(map(_second, _whole_spans(spans)))
        best_end = max(ends)
        best = ends.index(best_end)  # the first rule among the longest matches
        token_end = spans[_ALTERNATIVES[best][3]][1]
        for k in _LONGEST_ALTERNATIVES:  # rules whose longest match may be longer than their first match
            if ends[k] >= 0:
                rule, pattern = _ALTERNATIVES[k][:2]
                end, longer = _extend(rule, pattern, text, pos, ends[k])
                if end > best_end or (end == best_end and k < best):
                    best_end, best, token_end = end, k, end
        rule = _ALTERNATIVES[best][0]
        token = text[pos:token_end]
        if rule.name in _SPECIAL:
            token = token.rstrip(" \t\n\x0b\x0c\r\x85")
            if rule.name == "acronym/" and len(token) == 2:  # "I." before a sentence start: "I" then "."
                token = token[:1]
                pos += 1
            elif rule.name == "acronym/":  # "U.S." then a "." token
                pos += len(token) - 1
            else:
                pos += len(token)
        elif rule.pushback:
            pos += len(token) - rule.pushback
            if not rule.name.startswith("abbrev1"):  # "cannot" -> "can"; abbreviations keep their period
                token = token[: len(token) - rule.pushback]
        else:
            pos += len(token)
        normalize = rule.normalize
        if normalize is _SKIP:
            continue
        tokens.append(normalize if isinstance(normalize, str) else normalize(token))
    return tokens, pos


# ---------------------------------------------------------------------------------------------------------------
# Lower-casing as Java's String.toLowerCase(Locale.ENGLISH) does it (per token)


# Java's final-sigma rule looks for cased letters within the word around the sigma, with word boundaries as its
# (legacy, rule-based) word break iterator draws them: letters and digits run together; dashes, connector
# punctuation, apostrophes, quotes, periods, U+2027 and the soft hyphen join two letters; apostrophes, quotes,
# periods, commas and U+066B join two digits; marks and format characters are transparent; kanji and kana are
# words of their own; anything else ends the word.
_KANJI_KANA = re.compile("[\u3005\u3041-\u3094\u309d\u309e\u30a1-\u30fa\u30fc-\u30fe\u4e00-\u9fa5\uf900-\ufa2d]")
_JOIN_LETTERS = frozenset("\"'.\u2027\u00ad")
_JOIN_DIGITS = frozenset("\"'.,\u066b")


def _kind(char: str) -> str:
    """'L' letter, 'D' digit, 'T' transparent (marks, format characters), 'J' joiner, '' word end."""
    category = unicodedata.category(char)
    if char in _JOIN_LETTERS or char in _JOIN_DIGITS or category in ("Pd", "Pc"):
        return "J"
    if _KANJI_KANA.match(char):
        return ""
    if category[0] == "L" or category == "Mc":
        return "L"
    if category[0] == "N":
        return "D"
    if category in ("Mn", "Me", "Cf"):
        return "T"
    return ""


# Java counts as cased the upper, lower and title case letters and a fixed list of other characters with case
# (modifier letters, the iota subscript, Roman numerals, circled letters).
_OTHER_CASED = re.compile("[\u02b0-\u02b8\u02c0\u02c1\u02e0-\u02e4\u0345\u037a\u1d2c-\u1d61\u2160-\u217f\u24b6-\u24e9]")


def _is_cased(char: str) -> bool:
    return unicodedata.category(char) in ("Lu", "Ll", "Lt") or _OTHER_CASED.match(char) is not None


def _neighbour(token: str, index: int, step: int) -> int:
    """Index of the nearest non-transparent character from token[index] in direction `step` (or -1)."""
    index += step
    while 0 <= index < len(token) and _kind(token[index]) == "T":
        index += step
    return index if 0 <= index < len(token) else -1


def _cased_in_word(token: str, index: int, step: int) -> bool:
    """Whether a cased character precedes (step -1) or follows (step 1) token[index] within the same word."""
    i = index + step
    while 0 <= i < len(token):
        char = token[i]
        kind = _kind(char)
        if kind in ("L", "D", "T"):
            if _is_cased(char):
                return True
        elif kind == "J":
            before, after = _neighbour(token, i, -step), _neighbour(token, i, step)
            if before < 0 or after < 0:
                return False
            pair = _kind(token[before]) + _kind(token[after])
            if not (
                (pair == "LL" and (char in _JOIN_LETTERS or unicodedata.category(char) in ("Pd", "Pc")))
                or (pair == "DD" and char in _JOIN_DIGITS)
            ):
                return False
        else:
            return False
        i += step
    return False


def java_lower(token: str) -> str:
    """`token` lower-cased like Java's toLowerCase(Locale.ENGLISH) (final sigma decided within the word).

    Surrogate pairs (characters outside the BMP, as the lexer sees them) are joined back into characters first.
    """
    if _SURROGATE.search(token):
        token = token.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    if "\u03a3" not in token:
        return token.lower()
    out = []
    for index, char in enumerate(token):
        if char == "\u03a3":
            final = _cased_in_word(token, index, -1) and not _cased_in_word(token, index, 1)
            out.append("\u03c2" if final else "\u03c3")
        else:
            out.append(char.lower())
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------------
# The coco-caption pipeline over a list of captions

# Line breaks the Java tokenizer honours besides "\n" (which coco-caption already replaces with a space).
_OTHER_LINE_BREAKS = str.maketrans({"\r": " ", "\u2028": " ", "\u2029": " ", "\x0b": " ", "\x0c": " "})
_SPLIT_WORDS = {"cannot": 3, "gonna": 2, "gotta": 2, "lemme": 2, "gimme": 2, "wanna": 2}

# Where a token, or the context a rule looks at, can reach from one space-separated chunk into the next, so that
# the chunks involved are lexed in place (with the rest of the text visible) instead of one by one:
# - "<": markup can span spaces (from the "<" to the end of its line);
# - a period, separator(s), a period: spaced ellipsis; digits or ")", separator(s), a digit: phone numbers, "1 1/2";
# - a single letter or an abbreviation used only before numbers or "Ltd", with its period, before a separator: what
#   follows (possibly on the next line) decides whether the period is part of the token.
_SEP = r"[ \t\x85\xa0\u2000-\u200a\u3000]"
_OTHER_SPACES = "\t\x0b-\x0d\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# (pattern, whether the span ends at the match's end (inclusive) rather than before it); each starts with a literal
# or a small class so that the regex engine can skip quickly to candidates.
_CROSSINGS = [
    (re.compile(r"<[^\n]*"), False),
    (re.compile(rf"\.{_SEP}+(?=\.)"), True),
    (re.compile(rf"[\d)]{_SEP}+(?=\d)"), True),
    (
        re.compile(
            r"\.(?:(?<=(?<![A-Za-z])[A-Za-z]\.)|(?i:(?<=(?:ca|no|pp|op|co)\.)|(?<=(?:fig|nos|art|pt[ey])\.)"
            rf"|(?<=(?:figs|prop|bldg)\.)))(?={_SEP}|\n|\Z)"
        ),
        False,
    ),
    # whitespace other than " " can end a URL or e-mail token, which coco-caption strips only at the end of a line,
    # before dropping punctuation: from there to the end of the line is lexed in place (punctuation kept until then)
    (re.compile(rf"[.@:][^ \n]*[{_OTHER_SPACES}][^\n]*"), False),
]


def _crossing_spans(text: str) -> list[tuple[int, int]]:
    """(first, last) character positions of the places in `text` that must be lexed in place."""
    spans = []
    for pattern, inclusive in _CROSSINGS:
        spans.extend((m.start(), m.end() if inclusive else m.end() - 1) for m in pattern.finditer(text))
    return spans


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _as_surrogates(match: re.Match) -> str:
    code = ord(match.group()) - 0x10000
    return chr(0xD800 + (code >> 10)) + chr(0xDC00 + (code & 0x3FF))


_SPACES_AFTER_SPACE = re.compile(r"(?<= )[\t\u00a0\u2000-\u200a\u3000]+")

_chunk_cache: dict[str, str] = {}
_CHUNK_CACHE_LIMIT = 1_000_000


# Chunk shapes whose tokens are known without running the lexer (checked against it in the tests).
_WORD_PUNCT = re.compile(r"([A-Za-z]+|[0-9]+)([.,;:!?])")
_WORD_REDAUX = re.compile(r"([A-Za-z]+)('(?:[msdMSD]|[rR][eE]|[vV][eE]|[lL][lL]))")
_WORD_NT = re.compile(r"([A-Za-z]*[A-MO-Za-mo-z])([nN]'[tT])")
_ABBREVIATION = re.compile("|".join([_ABBREV1, _ABBREV3, *(a + r"\." for a in _ABBREV4), _ci("pt") + r"[eyEY]\."]))


def _split_word(word: str) -> tuple[str, ...]:
    """Tokens of a lower-cased all-letter chunk: itself, or "cannot", "gonna"... split in two."""
    cut = _SPLIT_WORDS.get(word)
    return (word,) if cut is None else (word[:-cut], word[-cut:])


def _chunk_tokens(chunk: str) -> tuple[str, ...]:
    """Final tokens (lower-cased, punctuation dropped) of a space-free chunk followed by a space and neutral text."""
    if chunk.isascii():
        if chunk.isalpha():
            return _split_word(chunk.lower())
        if chunk.isdigit():
            return (chunk,)
        match = _WORD_PUNCT.fullmatch(chunk)
        if match is not None and not (match.group(2) == "." and _ABBREVIATION.fullmatch(chunk)):
            word = match.group(1).lower()
            return _split_word(word) if word.isalpha() else (word,)  # the punctuation is dropped
        match = _WORD_REDAUX.fullmatch(chunk) or _WORD_NT.fullmatch(chunk)
        if match is not None:
            return (match.group(1).lower(), match.group(2).lower())
    raw, _ = _lex(chunk + " \x00", 0, len(chunk))
    return tuple(t for t in map(java_lower, raw) if t not in PUNCTUATIONS)


def _chunk_text(chunk: str) -> str:
    return " ".join(_chunk_tokens(chunk))


def clear_cache() -> None:
    """Forget the memoised tokenisations of words (for timing from a cold start)."""
    _chunk_cache.clear()


def tokenize_captions(captions: Sequence[str]) -> list[str]:
    """Tokenise captions exactly as one coco-caption `PTBTokenizer.tokenize` call does.

    The captions are seen as the lines of one text, in order (as coco-caption writes them), so the end of one
    caption can depend on the start of the next and the last one is followed by the end of the text.

    Args:
        captions: Raw captions.

    Returns:
        One string per caption: its tokens, lower-cased, coco-caption's punctuation removed, joined by single
        spaces ("" when nothing is left).
    """
    lines = [c.replace("\n", " ").translate(_OTHER_LINE_BREAKS) for c in captions]
    if not lines:
        return []
    text = "\n".join(lines)
    if _ASTRAL.search(text):  # the Java lexer sees UTF-16 units: a character outside the BMP is two of them
        lines = [_ASTRAL.sub(_as_surrogates, line) for line in lines]
        text = "\n".join(lines)
    starts = []
    offset = 0
    for line in lines:
        starts.append(offset)
        offset += len(line) + 1

    # Spans (first and last character, inclusive) that must be lexed in place, grouped by line.
    marks: dict[int, list[tuple[int, int]]] = {}
    for first, last in _crossing_spans(text):
        marks.setdefault(bisect.bisect_right(starts, first) - 1, []).append((first, last))
    end_of_text = len(text.rstrip()) - 1  # the last token is followed by the end of the text
    if end_of_text >= 0:
        marks.setdefault(bisect.bisect_right(starts, end_of_text) - 1, []).append((end_of_text, end_of_text))

    cache = _chunk_cache
    if len(cache) > _CHUNK_CACHE_LIMIT:
        cache.clear()
    # After a " ", the lexer's space token also swallows the other spaces that follow (so no URL starts there):
    # chunks are cut after them. Same length, so positions in `chunked` are positions in `text`.
    chunked = (
        _SPACES_AFTER_SPACE.sub(lambda m: " " * len(m.group()), text) if _SPACES_AFTER_SPACE.search(text) else text
    )
    for chunk in set(chunked.replace("\n", " ").split(" ")).difference(cache):
        cache[chunk] = _chunk_text(chunk)
    lookup = cache.__getitem__
    if chunked is not text:
        lines = chunked.split("\n")

    out: list[str] = []
    pending: list[str] = []  # tokens of the output line being built when a token crossed a line break
    pos = 0  # where the in-place lexer stopped
    for index, line in enumerate(lines):
        start = starts[index]
        if index not in marks and pos <= start and not pending:
            out.append(" ".join(filter(None, map(lookup, line.split(" ")))))
            continue
        tokens, pos = _line_tokens(text, start, line, marks.get(index, ()), pos, lookup)
        for token in tokens:
            if "\n" in token:  # a markup token that crossed the line break: Java writes the break inside it
                first, *rest = token.split("\n")
                pending.append(first)
                out.append(_finish(pending))
                out.extend(_finish([middle]) for middle in rest[:-1])
                pending = [rest[-1]]
            else:
                pending.append(token)
        if pos <= start + len(line):  # the line break after this line was not inside a token
            out.append(_finish(pending))
            pending = []
    if pending:
        out.append(_finish(pending))
    return out[: len(lines)]


def _line_tokens(
    text: str, start: int, line: str, marks: Sequence[tuple[int, int]], pos: int, lookup: Callable[[str], str]
) -> tuple[list[str], int]:
    """Tokens of one line: chunks from the cache, marked chunks (and what earlier tokens reached) lexed in place."""
    chunks = line.split(" ")
    bounds = []
    offset = start
    for chunk in chunks:
        bounds.append((offset, offset + len(chunk)))
        offset += len(chunk) + 1
    marked = [any(first < end and last >= begin for first, last in marks) for begin, end in bounds]
    tokens: list[str] = []
    j = 0
    while j < len(chunks):
        begin, end = bounds[j]
        if begin == end or end <= pos:  # empty, or already consumed by a token that crossed a space
            j += 1
            continue
        if not marked[j] and begin >= pos:
            if chunks[j] in _chunk_cache:
                tokens.append(lookup(chunks[j]))
            else:
                tokens.append(_chunk_text(chunks[j]))
            j += 1
            continue
        k = j
        while k + 1 < len(chunks) and marked[k + 1]:
            k += 1
        raw, pos = _lex(text, max(pos, begin), bounds[k][1])
        tokens.extend(map(java_lower, raw))
        j = k + 1
    return [t for t in tokens if t], pos


def _finish(tokens: list[str]) -> str:
    """coco-caption's post-processing of one output line: strip its end, split on spaces, drop punctuation."""
    return " ".join(w for w in " ".join(tokens).rstrip().split(" ") if w not in PUNCTUATIONS)


def tokenize(captions_for_image: Mapping[Hashable, Sequence[str]]) -> dict[Hashable, list[str]]:
    """Tokenise the captions of several images in one pass, like coco-caption's `PTBTokenizer().tokenize`.

    Args:
        captions_for_image: Image id -> its captions (strings). Iteration order is the order coco-caption would
            write them in, which matters only at caption boundaries (see `tokenize_captions`).

    Returns:
        Image id -> tokenised captions, in the same order.
    """
    ids = [key for key, caps in captions_for_image.items() for _ in caps]
    flat = tokenize_captions([c for caps in captions_for_image.values() for c in caps])
    result: dict[Hashable, list[str]] = {key: [] for key in captions_for_image}
    for key, caption in zip(ids, flat):
        result[key].append(caption)
    return result
