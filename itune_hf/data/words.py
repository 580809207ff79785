"""English plurals folded to their singular, one rule set for the clip-art corpus's recorded content words
(`itune make-clipart`, `itune_hf.data.clipart`) and the metric that reads them (`itune_hf.metrics.content_words`):
a word and its plural then match, whichever side says which.

A small rule set, not a lemmatiser: a table of irregular plurals ("mice" -> "mouse", "leaves" -> "leaf", "cookies"
-> "cookie", ...), words kept as they are ("series", "glasses", "news", the table's singulars: "bus", "lens"), then
"-ies" -> "-y" ("berries"), "-sses", "-xes", "-zzes", "-ches", "-shes" -> less "-es" ("boxes", "benches"), and a
final "-s" dropped from words of four letters or more not ending in "-ss", "-us" or "-is" ("cats", "houses"; "glass",
"cactus", "iris" kept). Where a singular and its plural fold differently they do not match ("bonus" stays, "bonuses"
folds to "bonuse").
"""

from __future__ import annotations

#: Irregular plurals and plurals the suffix rules would fold wrongly, -> their singular.
_IRREGULAR: dict[str, str] = {
    "mice": "mouse", "men": "man", "women": "woman", "children": "child", "people": "person", "feet": "foot",
    "teeth": "tooth", "geese": "goose", "oxen": "ox", "dice": "die",
    "leaves": "leaf", "knives": "knife", "wives": "wife", "lives": "life", "wolves": "wolf", "shelves": "shelf",
    "halves": "half", "calves": "calf", "loaves": "loaf", "thieves": "thief", "scarves": "scarf", "elves": "elf",
    "tomatoes": "tomato", "potatoes": "potato", "heroes": "hero", "volcanoes": "volcano", "mosquitoes": "mosquito",
    "cookies": "cookie", "movies": "movie", "pies": "pie", "ties": "tie", "zombies": "zombie", "brownies": "brownie",
    "smilies": "smiley",
    "buses": "bus", "gases": "gas", "lenses": "lens", "cacti": "cactus", "fungi": "fungus",
}  # fmt: skip
#: Kept as they are: the table's singulars (fold("bus") is "bus", not "bu") and words whose "-s" is not a plural.
_SINGULARS: frozenset[str] = frozenset(_IRREGULAR.values()) | frozenset(
    "people news series species dice chess physics mathematics clothes christmas xmas gas canvas atlas texas".split()
)


def fold(word: str) -> str:
    """`word` in lower case and, where the rules (module docstring) read it as a plural, in the singular.

    Args:
        word: One word.
    """
    word = word.lower()
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if word in _SINGULARS:
        return word
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "zzes", "ches", "shes")):
        return word[:-2]
    if len(word) >= 4 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


__all__ = ["fold"]
