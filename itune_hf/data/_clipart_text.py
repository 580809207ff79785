"""The text side of `itune make-clipart`: each rule that turns a clip-art file's metadata into clean captions, its
alt-text and its content words (the rules are listed in `itune_hf.data.clipart` and docs/data.md).

Standard library only; no file is read here. `SvgRecord` is what one SVG file says about itself; `Vocabulary` is what
the whole corpus says about words (which are English, which are nouns, which are authors' names); `clean_record`
applies every rule to one record and says which rules fired (`CleanText.rules`, counted in `dataset.json`).
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .words import fold as fold_plural

#: English function words: always English, never content words.
STOP_WORDS = frozenset(
    "a an the of and or in on at to for with without by from as is are be it its this that these those my your his "
    "her their our up down out over under into onto off no not all some one two three four five six seven eight nine "
    "ten very more most other another each per via vs".split()
)
#: Words that say what the file is rather than what it shows: the medium, the collection, tags and codes the
#: keywords carry (`mapsym`, `roadtravel`), grouping words (`member`, `nation` of "united_nations_member"). Never
#: content words, never a category phrase.
GENERIC_WORDS = frozenset(
    "icon image picture drawing illustration clipart clip art svg vector graphic graphics theme collection set "
    "series version example examples unsorted duplicate duplicates special misc miscellany various generic stock "
    "action actions app apps application applications device devices mimetype mimetypes filesystem filesystems "
    "emblem emblems hash file sign signs symbol symbols shape shapes thing stuff item simple openclipart inkscape "
    "appicon mimeicon mapsym musicsym networksym weathersym mathsymbol musicstuff roadtravel airtravel religholiday "
    "usholiday template member nation national united government organization info information layout model famous "
    "great fun smart sexy study activity entertainment equipment communication industry character creation country "
    "place region state historical history ethnic politic".split()
)
#: Adjectives the corpus uses as keywords or folder names: not nouns, so not content words.
ADJECTIVES = frozenset(
    "red green blue yellow black white orange purple pink brown gray grey golden silver dark light big small "
    "little large tiny huge old new happy sad angry cute funny flat round full empty open closed bordered "
    "ornamental historic evergreen abstract stylized stylised modern classic cartoon colorful colourful "
    "simple plain glossy shiny rectangular square circular left right top bottom front back high low".split()
)
#: A title naming the collection, theme or credit instead of the picture (rule "collection title").
COLLECTION_TITLE = re.compile(
    r"^\s*part of the\b|part of the .* collection"
    r"|\b(themes?|iconsets?|icons|collections?|cliparts?|svg|s[iu]bmission|map symbols)\b|symbol[ _]signs|[a-z]+-theme",
    re.IGNORECASE,
)
#: The words of `COLLECTION_TITLE` that a title describing its picture may hold as well ("US Capitol Building
#: Clipart Style", "Hotel Icon Collection Blank Square"): such a title loses them and keeps the rest.
COLLECTION_WORDS = re.compile(
    r"\b(?:in\s+)?svg(?:\s+format)?\b|\b(?:icons|collections?|cliparts?|clip\s+arts?)\b", re.IGNORECASE
)
#: "Clipart by <author> - <name>": a credit before a name (rule "credit prefix").
CREDIT_PREFIX = re.compile(r"^\s*clip\s*-?\s*arts?\s+by\s+.+?(\s+-\s+|$)", re.IGNORECASE)
#: Description boilerplate: links, contacts, credits, conversions, the drawing program.
DESCRIPTION_NOISE = re.compile(
    r"https?://\S+|www\.\S+|\S+@\S+|\beps converted from\b|\bpart of .* collection\b|\bclip\s*arts? by\b.*"
    r"|\b(?:HASH|ARRAY|SCALAR|CODE)\(0x[0-9a-f]+\)"  # a Perl reference printed in place of the text
    r"|\b(?:made|created|drawn|done) (?:with|in|using) (?:inkscape|sodipodi|\S*illustrator|xara|openoffice)\b",
    re.IGNORECASE,
)
#: Words kept unchanged by `singular` (already singular, or no simple singular).
#: The share of a text's words that must be English words for it to count as English (`is_english`).
ENGLISH_SHARE = 0.5
#: The share of a creator's title words that must be English for the rest of them to count as English.
ENGLISH_CREATOR_SHARE = 0.5
#: The largest share of a creator's titles that may hold a function word of another language, for the creator to
#: count as writing in English.
FOREIGN_TITLE_SHARE = 0.05
#: Function words of the other languages the corpus holds (Italian, French, Spanish, Portuguese, German): never
#: English, even where a keyword or a title of an English-writing creator holds them.
NOT_ENGLISH = frozenset(
    "di del della delle dei degli il lo gli nella nel sulla sul col con da e le la les des du au aux et une un el "
    "los las para por y em uma um das dos und der die das mit von zum zur ein eine".split()
)
#: Words of file names that name a collection or a format, not the picture ("aiga_barber_shop", "gnome-fs-client").
FILE_NAME_PREFIXES = frozenset({"svg", "aiga", "gnome", "bb", "gtk", "kde", "stock"})
#: A title that this many files carry is a collection's name where their own file names are English.
REPEATED_TITLE_FILES = 10
#: A description that this many files carry describes their series, not each picture: not a caption.
REPEATED_DESCRIPTION_FILES = 5
#: "(B and W)", "B&W": the black-and-white version of a drawing.
BLACK_AND_WHITE = re.compile(r"\(?\bB\s*(?:and|&|/|_)\s*W\b\)?", re.IGNORECASE)
#: A description whose first sentence is longer than this many words makes no caption.
MAX_DESCRIPTION_WORDS = 30


@dataclass(frozen=True)
class SvgRecord:
    """What one SVG file says about itself.

    Args:
        source: The file's path relative to the package's SVG root (`animals/bugs/spider_01.svg`).
        title: Its `<dc:title>` ("" if none).
        description: Its `<dc:description>` ("" if none).
        keywords: Its `<rdf:li>` keywords, as written (empty ones dropped).
        creator: Its `<dc:creator>`'s name ("" if none).
    """

    source: str
    title: str
    description: str
    keywords: tuple[str, ...]
    creator: str

    @property
    def category(self) -> str:
        """The folder path with a trailing slash (`animals/mammals/big_cats/`; "" at the root)."""
        folder = self.source.rpartition("/")[0]
        return folder + "/" if folder else ""

    @property
    def stem(self) -> str:
        """The file name without `.svg`."""
        return self.source.rpartition("/")[2].rsplit(".", 1)[0]


@dataclass(frozen=True)
class Vocabulary:
    """What the corpus says about words and texts (`build_vocabulary`).

    Args:
        english: Words counted as English by `is_english` (see `build_vocabulary`).
        nouns: The content-word candidates: the singular words of the folders and of the keywords that two or
            more creators use, less stop words, generic words, adjectives and authors' names.
        authors: Every word of every creator's name.
        repeated_titles: Titles (`fold`ed, lower case) that `REPEATED_TITLE_FILES` or more files carry.
        repeated_descriptions: Descriptions (likewise) that `REPEATED_DESCRIPTION_FILES` or more files carry.
    """

    english: frozenset[str]
    nouns: frozenset[str] = frozenset()
    authors: frozenset[str] = frozenset()
    repeated_titles: frozenset[str] = frozenset()
    repeated_descriptions: frozenset[str] = frozenset()


@dataclass
class CleanText:
    """One record after every rule: what its dataset entry holds, and the rules that fired (for the counts)."""

    title: str
    english_title: bool
    description: str
    sentences: list[str]
    alt_text: str
    content_words: list[str]
    rules: list[str] = field(default_factory=list)


def fold(text: str) -> str:
    """`text` with HTML entities decoded, Windows-1252 text read as Latin-1 repaired ("Mikola\\x9a" -> "Mikolas"),
    control characters and accents removed and whitespace collapsed."""
    text = html.unescape(html.unescape(text))  # some titles hold "&#39;" escaped twice
    if any("\x80" <= c <= "\x9f" for c in text):  # C1 controls: cp1252's letters in a text decoded as Latin-1
        try:
            text = text.encode("latin-1").decode("cp1252")
        except UnicodeError:
            pass
    text = unicodedata.normalize("NFKD", text)
    kept = "".join(c for c in text if not unicodedata.combining(c) and unicodedata.category(c) != "Cc" or c.isspace())
    return " ".join(kept.split())


def words(text: str) -> list[str]:
    """The lower-case alphabetic words of `text` (`_`, `-` and digits separate words; apostrophes join them)."""
    return re.findall(r"[a-z]+(?:'[a-z]+)?", fold(text).lower())


def keyword_words(keyword: str) -> list[str]:
    """The words of a keyword; none for a keyword naming a collection or theme ("lemon_theme_icon")."""
    return [] if COLLECTION_TITLE.search(re.sub(r"[_-]+", " ", keyword)) else words(keyword)


def folder_words(category: str) -> list[str]:
    """The words of a category's folders, less those of theme folders ("computer/icons/lemon-theme/" -> computer,
    icons)."""
    return [word for folder in category.split("/") if not COLLECTION_TITLE.search(folder) for word in words(folder)]


def singular(word: str) -> str:
    """The singular of lower-case `word` as the content-word metric reads it (`itune_hf.data.words.fold`: one rule
    set on both sides, so a recorded word matches a caption's plural)."""
    return fold_plural(word)


def build_vocabulary(records: Iterable[SvgRecord]) -> Vocabulary:
    """The corpus' English words, nouns, authors and repeated texts (see `Vocabulary`).

    The English words: the stop words, generic words and adjectives of this module, the folders' words, every
    keyword's words, the words two or more creators use in titles, descriptions or file names, and the title words of
    the creators who write in English (`_english_creators_words`), each with its singular; less the authors' names
    and the other languages' function words (`NOT_ENGLISH`).

    Args:
        records: Every record of the corpus.
    """
    records = list(records)
    authors = {word for record in records for word in words(record.creator)}
    folders = {word for record in records for word in folder_words(record.category)}
    creators = _creators_of_words(records, lambda record: record.keywords, keyword_words)
    shared = {word for word, names in creators.items() if len(names) >= 2}
    texts = _creators_of_words(records, lambda record: (record.title, record.description, record.stem))
    found = (folders | set(creators) | {word for word, names in texts.items() if len(names) >= 2}) - authors
    base = Vocabulary(_with_singulars(found) | STOP_WORDS | GENERIC_WORDS | ADJECTIVES)
    english = base.english | _english_creators_words(records, base)
    nouns = {singular(word) for word in (folders | shared) - authors}
    nouns -= STOP_WORDS | GENERIC_WORDS | ADJECTIVES | authors
    titles = Counter(fold(record.title).lower() for record in records if record.title.strip())
    descriptions = Counter(fold(record.description).lower() for record in records if record.description.strip())
    return Vocabulary(
        english=frozenset(english - NOT_ENGLISH - authors),
        nouns=frozenset(word for word in nouns if len(word) >= 3),
        authors=frozenset(authors),
        repeated_titles=frozenset(text for text, count in titles.items() if count >= REPEATED_TITLE_FILES),
        repeated_descriptions=frozenset(
            text for text, count in descriptions.items() if count >= REPEATED_DESCRIPTION_FILES
        ),
    )


def _with_singulars(found: Iterable[str]) -> frozenset[str]:
    return frozenset(found) | {singular(word) for word in found}


def _english_creators_words(records: Sequence[SvgRecord], base: Vocabulary) -> frozenset[str]:
    """The title words of the creators who write in English: at least `ENGLISH_CREATOR_SHARE` of their title words
    (their own names left out) are English words of `base`, and at most `FOREIGN_TITLE_SHARE` of their titles hold a
    function word of another language (`NOT_ENGLISH`)."""
    titles: dict[str, list[list[str]]] = {}
    for record in records:
        name = set(words(record.creator))
        titles.setdefault(record.creator, []).append([word for word in words(record.title) if word not in name])
    english: set[str] = set()
    for found in titles.values():
        every = [word for title in found for word in title]
        known = sum(word in base.english or singular(word) in base.english for word in every)
        foreign = sum(bool(NOT_ENGLISH.intersection(title)) for title in found)
        if every and known >= ENGLISH_CREATOR_SHARE * len(every) and foreign <= FOREIGN_TITLE_SHARE * len(found):
            english.update(every)
    return _with_singulars(english)


def _creators_of_words(
    records: Sequence[SvgRecord],
    texts: Callable[[SvgRecord], Iterable[str]],
    split: Callable[[str], list[str]] = words,
) -> dict[str, set]:
    """Each word of the records' `texts` (split by `split`) with the creators who use it."""
    creators: dict[str, set[str]] = {}
    for record in records:
        for word in {word for text in texts(record) for word in split(text)}:
            creators.setdefault(word, set()).add(record.creator)
    return creators


def is_english(text: str, vocabulary: Vocabulary) -> bool:
    """Whether at least `ENGLISH_SHARE` of the words of `text` are English words of `vocabulary` (a word counts by
    itself or its singular). A text without words is not English.

    Args:
        text: A title or description.
        vocabulary: The corpus' vocabulary.
    """
    found = [word for word in words(text) if len(word) > 1 or word == "a"]  # single letters are not words
    if not found:
        return False
    known = sum(word in vocabulary.english or singular(word) in vocabulary.english for word in found)
    return known / len(found) >= ENGLISH_SHARE


def author_span(tokens: Sequence[str], creator: str) -> tuple[int, int] | None:
    """Where the creator's name is in `tokens` (`(start, end)`), else None: its words in order, the last one found
    possibly cut short (openclipart cut file names at 25 characters: "sand_glass_frederic_mose_01"). A match counts
    when it is the whole name, two or more of its words, or its first word at the end of `tokens`
    ("cassa_d_39_epoca_archite_01" by Architetto Francesco Rollandin).

    Args:
        tokens: Lower-case words of a title or file name.
        creator: The file's creator.
    """
    name = words(creator)
    for start in range(len(tokens)) if name else ():
        end = start
        while end < len(tokens) and end - start < len(name):
            word, part = name[end - start], tokens[end]
            if part != word and not (len(part) >= 3 and word.startswith(part)):
                break
            end += 1
            if part != word:
                break  # a word cut short ends the name
        matched = end - start
        if matched == len(name) or matched >= 2 or (matched and end == len(tokens)):
            return start, end
    return None


def file_name_title(name: str, creator: str) -> str:
    """A file name (or a title written like one) as words: `_`, `-`, `#` and camelCase split, numbers and codes
    dropped ("arrow1" -> "arrow", "05c", "0x87fadcc", "67pt25step" dropped), the creator's name and collection
    prefixes (`FILE_NAME_PREFIXES`) dropped.

    Args:
        name: "jigsaw_red_10", "BlueMan#204", "floppy_frederic_moser_01".
        creator: The file's creator.
    """
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", fold(name))
    tokens = []
    for token in re.split(r"[^A-Za-z0-9']+", spaced):
        match = re.fullmatch(r"\d*([A-Za-z']+)\d*", token)
        if match:
            tokens.append(match.group(1).lower())
    span = author_span(tokens, creator)
    if span:
        tokens = tokens[: span[0]] + tokens[span[1] :]
    tokens = [token for token in tokens if token not in FILE_NAME_PREFIXES]
    while len(tokens) > 1 and len(tokens[-1]) <= 2 and tokens[-1] not in STOP_WORDS:
        tokens.pop()  # a letter code of a series ("bullet_hole_linda_kim_ab", "shadow_ru", "plastik_icon_v03")
    return " ".join(tokens)


def looks_like_file_name(title: str) -> bool:
    """Whether a title is written as a file name: no spaces and an `_`, `-`, `#`, a digit or an inner capital."""
    return " " not in title.strip() and bool(re.search(r"[_#\d-]|[a-z][A-Z]", title))


def clean_title(record: SvgRecord, vocabulary: Vocabulary) -> tuple[str, list[str]]:
    """The record's clean title and the rules that fired (see `itune_hf.data.clipart` for each rule).

    Args:
        record: The file's metadata.
        vocabulary: The corpus' vocabulary (a credit's name is replaced by the file name only when that has
            English words).
    """
    rules: list[str] = []
    title = fold(record.title)
    if BLACK_AND_WHITE.search(title):
        title = " ".join(BLACK_AND_WHITE.sub(" in black and white ", title).split())
        if title.lower().startswith("in black and white "):  # "B_W Tiger": "Tiger in black and white"
            title = f"{title[len('in black and white ') :]} in black and white"
        rules.append("black_and_white")
    credit = CREDIT_PREFIX.match(title)
    if credit:
        rules.append("credit_prefix")
        title = _after_credit(title[credit.end() :], record, vocabulary, rules)
    elif _describes_beside_collection_words(title, vocabulary):
        title = " ".join(COLLECTION_WORDS.sub(" ", title).split()).strip(" -_,.")
        rules.append("collection_words")
    elif COLLECTION_TITLE.search(title) or not title:
        rules.append("collection_title" if title else "missing_title")
        title = file_name_title(record.stem, record.creator)
        if COLLECTION_TITLE.search(title):  # the file is named after the collection too ("part_of_the_flat_icon_c")
            title = ""
        rules.append("file_name_title")
    elif looks_like_file_name(title):
        title = file_name_title(title, record.creator)
        rules.append("file_name_title")
    elif fold(record.title).lower() in vocabulary.repeated_titles:
        title = _repeated_title(title, record, vocabulary, rules)
    else:
        title = _without_author(title, record.creator, rules)
    trimmed = re.sub(r"(?<!\d)(?<!\d[-/])(\s*[#(]?\s*\d+[a-z]?\)?)+$", "", title).strip(" -_,.")  # ("1959-1963" kept)
    if trimmed != title:
        rules.append("trailing_number")
    return trimmed, rules


def _describes_beside_collection_words(title: str, vocabulary: Vocabulary) -> bool:
    """Whether a title holding collection words (`COLLECTION_WORDS`) and no other mark of a collection's name
    still names a thing, in two or more words, without them."""
    if not COLLECTION_WORDS.search(title):
        return False
    rest = COLLECTION_WORDS.sub(" ", title)
    return not COLLECTION_TITLE.search(rest) and len(words(rest)) >= 2 and _names_a_thing(rest, vocabulary)


def _after_credit(rest: str, record: SvgRecord, vocabulary: Vocabulary, rules: list[str]) -> str:
    """The name after a credit prefix. A name written as one word or a file name may be a template copied across a
    series ("Clipart by Nicu Buculei - contour_chipmunk" on contour_cheetah.svg): the file's own name, when it differs
    and is English, wins."""
    if " " in rest.strip() and not looks_like_file_name(rest):
        return _without_author(rest, record.creator, rules)
    named = file_name_title(rest, record.creator) if rest else ""
    own = file_name_title(record.stem, record.creator)
    if own and words(own) != words(named) and is_english(own, vocabulary):
        rules.append("file_name_title")
        return own
    return named


def _repeated_title(title: str, record: SvgRecord, vocabulary: Vocabulary, rules: list[str]) -> str:
    """A title many files carry ("Australian Maps" on queensland-outline.svg) gives way to the file's own name when
    that is English and says something else; else it stays ("card" on bordered_c_10.svg)."""
    own = file_name_title(record.stem, record.creator)
    if _names_a_thing(own, vocabulary) and words(own) != words(title):
        rules.append("repeated_title")
        return own
    return _without_author(title, record.creator, rules)


def _names_a_thing(text: str, vocabulary: Vocabulary) -> bool:
    """Whether `text` is English and has a word of three or more letters that is not a stop word or an adjective."""
    return is_english(text, vocabulary) and any(
        len(word) >= 3 and word not in STOP_WORDS and word not in ADJECTIVES for word in words(text)
    )


def _without_author(title: str, creator: str, rules: list[str]) -> str:
    """`title` less the creator's name, where it holds it ("Saturn by Dan Gerhards" -> "Saturn")."""
    tokens = title.split()
    span = author_span([" ".join(words(token)) for token in tokens], creator)
    if span is None:
        return title
    rules.append("author_name")
    kept = tokens[: span[0]] + tokens[span[1] :]
    if kept and kept[-1].lower() == "by":
        kept.pop()
    return " ".join(kept).strip(" -_,.")


#: Folder names that never make the category phrase (their words say nothing about the picture).
_NOT_A_CATEGORY = frozenset(
    "unsorted duplicates special examples miscellany misc various generic stock action actions app apps application "
    "applications device devices mimetypes filesystems emblems".split()
)
#: Below these folders, the folders name places and periods (`flags/europe/france`), not kinds of picture.
_PLACE_PARENTS = frozenset({"flags"})


def category_phrase(category: str) -> str:
    """The category as a short noun phrase: its deepest folder that names a kind of picture, singular
    ("animals/mammals/big_cats/" -> "big cat", "signs_and_symbols/flags/europe/france/" -> "flag",
    "food/breads_and_carbs/" -> "breads and carbs"); "" when no folder does.

    Args:
        category: The record's category (`SvgRecord.category`).
    """
    folders = [folder for folder in category.split("/") if folder]
    for place_parent in _PLACE_PARENTS & set(folders):
        folders = folders[: folders.index(place_parent) + 1]
    for folder in reversed(folders):
        found = words(folder)
        if (
            not found
            or COLLECTION_TITLE.search(folder)
            or all(word in _NOT_A_CATEGORY or word in ADJECTIVES or word in STOP_WORDS for word in found)
        ):
            continue
        return " ".join(found) if "and" in found else " ".join(singular(word) for word in found)
    return ""


def clean_description(description: str, title: str, vocabulary: Vocabulary, raw_title: str = "") -> str:
    """The description as a caption ("" when it is not one): not one that many files carry
    (`Vocabulary.repeated_descriptions`), links, e-mail addresses and credits removed, its first sentence, English,
    2 to `MAX_DESCRIPTION_WORDS` words, and not the title again.

    Args:
        description: The record's description.
        title: The clean title.
        vocabulary: The corpus' vocabulary.
        raw_title: The title as the file has it: a description that repeats a title naming a collection ("Menu Clip
            Art Collection Example 2") is not a caption either.
    """
    if fold(description).lower() in vocabulary.repeated_descriptions:
        return ""
    if COLLECTION_TITLE.search(raw_title) and words(description) == words(raw_title):
        return ""
    text = " ".join(DESCRIPTION_NOISE.sub(" ", fold(description)).split()).strip(" -_,;:")
    text = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0].strip()
    found = words(text)
    if not 2 <= len(found) <= MAX_DESCRIPTION_WORDS or found == words(title) or not is_english(text, vocabulary):
        return ""
    return text


def sentence(text: str) -> str:
    """`text` as a caption sentence: first letter capitalised, one final full stop."""
    text = text.strip().rstrip(".!?:;, ")
    return text[:1].upper() + text[1:] + "." if text else ""


def title_caption(title: str, category: str) -> str:
    """The caption "<title>, <category phrase>." (the phrase left out when the title says it); "" without a title.

    Args:
        title: The clean English title.
        category: The record's category.
    """
    if not words(title):
        return ""
    phrase = category_phrase(category)
    said = {singular(word) for word in words(title)}
    if phrase and not {singular(word) for word in words(phrase)} & said:
        return sentence(f"{_lower_first(title)}, {phrase}")
    return sentence(_lower_first(title))


def _lower_first(title: str) -> str:
    """Title Case's first word in lower case ("Map of Iceland" -> "map of Iceland"); acronyms ("LED") kept."""
    first, _, rest = title.partition(" ")
    if first[:1].isupper() and first[1:].islower():
        first = first.lower()
    return f"{first} {rest}".strip()


def category_caption(category: str) -> str:
    """The caption "A <category phrase>." for a record with no English title or description, when the phrase comes
    from a folder below the top level (the top-level folders name domains: `computer/`, `office/`); else "".

    Args:
        category: The record's category.
    """
    phrase = category_phrase(category)
    folders = [folder for folder in category.split("/") if folder]
    if not phrase or len(folders) < 2 or " and " in phrase or phrase == category_phrase(folders[0]):
        return ""
    return sentence(f"{'an' if phrase[0] in 'aeiou' else 'a'} {phrase}")


def content_words(
    title: str, keywords: Sequence[str], category: str, vocabulary: Vocabulary, domains: frozenset[str]
) -> list[str]:
    """The record's content words: lower-case singular words of its clean English title (every word but stop words,
    generic words, adjectives and authors' names: the title names what the picture shows, "Bison"), then the nouns
    (`Vocabulary.nouns`) of its keywords and category folders, in that order, each once. A top-level folder's words
    (`domains`: computer, office, recreation) count only where the title says them.

    Args:
        title: The clean title ("" when it is not English).
        keywords: The record's keywords.
        category: The record's category.
        vocabulary: The corpus' vocabulary.
        domains: The singular words of the corpus' top-level folder names.
    """
    in_title = [singular(word.removesuffix("'s")) for word in words(title)]  # "Rubik's cube": rubik, cube
    tagged = [singular(word.removesuffix("'s")) for keyword in keywords for word in keyword_words(keyword)]
    rest = tagged + [singular(word) for word in folder_words(category)]
    nouns = vocabulary.nouns | (set(in_title) - STOP_WORDS - GENERIC_WORDS - ADJECTIVES - vocabulary.authors)
    found = in_title + [word for word in rest if word not in domains]
    # (a word with an apostrophe left is no noun: "don't", "d'orange")
    return list(dict.fromkeys(word for word in found if word in nouns and len(word) >= 3 and word.isalpha()))


def alt_text(record: SvgRecord) -> str:
    """The raw, web-like text of a record: its title, keywords and path words as the file has them."""
    path_words = " ".join(re.split(r"[/_\-.]+", record.source.removesuffix(".svg"))).strip()
    parts = [fold(record.title), ", ".join(dict.fromkeys(fold(k) for k in record.keywords if k.strip())), path_words]
    return ", ".join(part for part in parts if part)


def normalised_title(title: str) -> str:
    """A title's words without numbers or file-name suffixes, lower case: the key that groups near-duplicates."""
    return " ".join(words(title))


def clean_record(record: SvgRecord, vocabulary: Vocabulary, domains: frozenset[str]) -> CleanText:
    """Every rule applied to one record.

    Args:
        record: The file's metadata.
        vocabulary: The corpus' vocabulary (`build_vocabulary`).
        domains: The singular words of the corpus' top-level folder names.
    """
    title, rules = clean_title(record, vocabulary)
    english = is_english(title, vocabulary)
    if title and not english:
        rules.append("non_english_title")
    description = clean_description(record.description, title, vocabulary, record.title)
    if record.description.strip() and not description:
        rules.append("description_not_a_caption")
    captions = [title_caption(title, record.category) if english else "", sentence(description)]
    captions = list(dict.fromkeys(caption for caption in captions if caption))
    if not captions:
        captions = [caption for caption in [category_caption(record.category)] if caption]
        rules.append("category_caption" if captions else "no_caption")
    keywords = [fold(keyword) for keyword in record.keywords]
    return CleanText(
        title=title,
        english_title=english,
        description=description,
        sentences=captions,
        alt_text=alt_text(record),
        content_words=content_words(title if english else "", keywords, record.category, vocabulary, domains),
        rules=rules,
    )
