"""The scenes of the generated worlds, read back from their `dataset.json`, and each world's caption grammar; the
recorded content words of an `itune make-clipart` corpus (`RecordedWords`), read back the same way.

What a caption says of a scene is a `Reading`: the objects it names, a multiset of `(colour, shape)` looks ("two red
circles" names the red circle twice), and the facts it states: spatial relations (`left_of`, `above`, `between`),
the arrangement (`row`, `column`), the background and the size of a single object (`size`). The scene metrics
(`itune_hf.metrics.objects`) compare it with the scene the world recorded for the image (`RecordedScene`, from
`read_scenes`).

Each world declares its grammar (`grammar_of`), built from the world's own vocabulary and templates:

* `captions`: read off its templates. `template_scenes` gives one scene of every structure with placeholder words,
  `caption_candidates` writes every caption of each, and a caption is read by matching it word for word against
  those, with colour, shape and background words as slots. A stated fact is one that holds in every template scene
  the caption matches: "a red circle and a blue square side by side" states that the circle is left of the square
  (the world lists objects in reading order); "a red circle, a blue square and a green star" (rows and columns
  alike) states only that the square is between the others; "two red circles" states no relation.
* `alt-text`: fillers ("stock photo") and colour and shape words; a colour followed by a shape names an object.
* `hard`: read off its templates as `captions`, synonyms read as the words they replace; a size word before an
  object ("a small red circle") states that object's size, which the scene records.

A phrase said twice names its objects twice: "a red circle and a red circle side by side" names two red circles.

A caption outside its world's grammar (an unknown word, a truncated sentence) names nothing and states nothing.

An `itune make-clipart` corpus (`"dataset": "itune-clipart"`) records no scene: each image's `content_words` (the
nouns of its title, keywords and category) are what it is known to show. `read_scenes` returns them as a
`RecordedWords` per image; the `ContentWords` metric (`itune_hf.metrics.content_words`) reads them and `Objects`
reports such images as having no recorded scene. A generated world's `RecordedScene` has no content words (its
objects are read by `Objects`, with their colours and counts), so `ContentWords` is unavailable there.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from ._common import DataFormatError
from .clipart import DATASET_KIND as CLIPART_DATASET_KIND  # an itune make-clipart dataset.json's `dataset`
from .synthetic import (
    ALT_TEXT_FILLERS,
    ALT_TEXT_SHAPES,
    BACKGROUNDS,
    COLORS,
    DATASET_KIND,
    RELATION_OF_LAYOUT,
    SHAPES,
    WORLDS,
    SceneObject,
    caption_candidates,
    template_scenes,
    tokens,
)

__all__ = [
    "CLIPART_DATASET_KIND",
    "RELATION_FACTS",
    "CaptionGrammar",
    "Reading",
    "RecordedObjects",
    "RecordedScene",
    "RecordedWords",
    "grammar_of",
    "read_instance_objects",
    "read_scenes",
    "scene_facts",
    "scenes_of_data",
]

#: A look: `(colour, shape)`.
Look = tuple[str, str]
#: A fact: `("left_of", a, b)`, `("above", a, b)`, `("between", middle, end, end)` (looks; the ends sorted),
#: `("arrangement", "row" | "column")`, `("background", name)` or `("size", look, word)` (the only object of
#: that look is that size).
Fact = tuple[Any, ...]
#: The facts that relation accuracy counts (the background is checked by the exact-scene rate only).
RELATION_FACTS: tuple[str, ...] = ("left_of", "above", "between", "arrangement")


def scene_facts(
    looks: Sequence[Look],
    layout: str,
    relations: Iterable[Sequence[Any]],
    background: str,
    sizes: Sequence[str | None] | None = None,
) -> frozenset:
    """Every fact of a scene, over looks: what a caption may state of it.

    Args:
        looks: Each object's `(colour, shape)`, in the order `relations` index.
        layout: `single`, `row` or `column`.
        relations: `[name, i, j]` or `["between", k, i, j]` (object indices), as `Scene.relations` writes them.
        background: The background's name.
        sizes: Each object's size word (None: the world says none), or None: not recorded. A caption names the size
            of an object alone of its look ("a small red circle"), never of a group ("two red circles").
    """
    facts: set[Fact] = {("background", background)}
    if layout in RELATION_OF_LAYOUT:
        facts.add(("arrangement", layout))
    for name, *members in relations:
        facts.add(_normal((name, *(looks[index] for index in members))))
    counts = Counter(looks)
    for look, size in zip(looks, sizes or ()):
        if size is not None and counts[look] == 1:
            facts.add(("size", look, size))
    return frozenset(facts)


def _normal(fact: Fact) -> Fact:
    """One spelling per fact: the ends of a `between` in sorted order."""
    return (fact[0], fact[1], *sorted(fact[2:])) if fact[0] == "between" else fact


@dataclass(frozen=True)
class Reading:
    """What a caption says: the looks it names (with counts) and the facts it states.

    Args:
        named: Look -> how many objects of it the caption names.
        claims: The facts it states (`scene_facts`' kinds).
    """

    named: Mapping[Look, int] = field(default_factory=dict)
    claims: frozenset = frozenset()


@dataclass(frozen=True)
class RecordedScene:
    """An image's scene as its world recorded it in `dataset.json`.

    Args:
        world: The world that drew it (its grammar reads the captions).
        objects: Each object's `(colour, shape)`, in reading order.
        layout: `single`, `row` or `column`.
        background: The background's name.
        relations: The relations between objects, by index (`Scene.relations`).
        sizes: Each object's size word, as its captions say it (the hard world), or None: not recorded (the other
            worlds, and hard-world files of `make-synthetic` version 2, whose size claims go unchecked).
    """

    world: str
    objects: tuple[Look, ...]
    layout: str
    background: str
    relations: tuple[tuple[Any, ...], ...] = ()
    sizes: tuple[str | None, ...] | None = None

    @cached_property
    def looks(self) -> Counter:
        """Look -> how many objects have it."""
        return Counter(self.objects)

    @cached_property
    def facts(self) -> frozenset:
        """Every fact of the scene (`scene_facts`)."""
        return scene_facts(self.objects, self.layout, self.relations, self.background, self.sizes)


@dataclass(frozen=True)
class RecordedWords:
    """An image's recorded content, as an `itune make-clipart` dataset.json gives it: no scene, only words.

    Args:
        content_words: The image's `content_words` (lower-case nouns of its title, keywords and category), as the
            file spells them; the `ContentWords` metric folds plurals and drops stop words when it reads them.
    """

    content_words: frozenset[str]


@dataclass(frozen=True)
class RecordedObjects:
    """An image's annotated objects, as COCO instance annotations give them (`read_instance_objects`).

    Args:
        categories: The category names of its instances ("person", "dining table"), each once; empty for an image
            without annotated objects.
        vocabulary: Every category name of the annotations it comes from (what a caption may name of them).
    """

    categories: frozenset[str]
    vocabulary: frozenset[str] = frozenset()


# ------------------------------------------------------------------------------------------------------ grammars


class CaptionGrammar:
    """What captions of a world say: `read(caption)` gives its `Reading`."""

    def read(self, caption: str) -> Reading:
        """What `caption` names and states; an empty `Reading` when it is outside the grammar.

        Args:
            caption: A caption (any case and punctuation; it is split into lower-case words).
        """
        raise NotImplementedError


#: Placeholder words of the template scenes: colour, shape (plural with a final "s") and background slots.
_PLACEHOLDER = re.compile(r"(zzcolor[a-e]|zzshape[a-e]|zzbg)(s?)")
_PLACEHOLDER_LOOKS: tuple[tuple[str, str], ...] = tuple((f"zzshape{x}", f"zzcolor{x}") for x in "abcde")


@dataclass(frozen=True)
class _Skeleton:
    """One template caption of a template scene: its slots (placeholder or None, per word) and what it says."""

    slots: tuple[str | None, ...]
    named: Counter
    facts: frozenset


def _bind(value: Any, binding: Mapping[str, str]) -> Any:
    """`value` (a fact or a look) with its placeholders replaced by their words; None if one is not bound."""
    if isinstance(value, tuple):
        parts = [_bind(part, binding) for part in value]
        return None if any(part is None for part in parts) else tuple(parts)
    if _PLACEHOLDER.fullmatch(value):
        return binding.get(value)
    return value


class TemplateGrammar(CaptionGrammar):
    """The grammar of a world whose captions are `candidates(scene)` for the scenes `scenes(looks, background)`,
    with words replaced by synonyms.

    Args:
        colors: The world's colour words.
        shapes: Its shape words.
        backgrounds: Its background words.
        candidates: Every caption of a scene (`caption_candidates`), in canonical words.
        scenes: One scene of every structure, for five looks (of which it uses what it needs) and a background
            (`template_scenes`).
        plural: The plural noun of a shape word.
        synonyms: Word -> the canonical word it may replace (read as that word).
        sizes: Size words: left out when a caption is matched against the templates; one before a colour and a
            shape states that object's size (`("size", look, word)`).

    Raises:
        ValueError: a word is both a colour, shape, plural, background or template word (the reading would be
            ambiguous); it names the word.
    """

    def __init__(
        self,
        *,
        colors: Iterable[str],
        shapes: Sequence[str],
        backgrounds: Iterable[str],
        candidates: Callable[[Any], list[str]],
        scenes: Callable[[tuple[tuple[str, str], ...], str], list[Any]],
        plural: Callable[[str], str] = lambda shape: SceneObject(shape, "", 0, 0, 0).plural.split()[-1],
        synonyms: Mapping[str, str] | None = None,
        sizes: Iterable[str] = (),
    ) -> None:
        self._synonyms, self._sizes = dict(synonyms or {}), frozenset(sizes)
        self._classes: dict[str, tuple[str, str]] = {}
        for kind, words in (("color", colors), ("shape", shapes), ("bg", backgrounds)):
            for word in words:
                self._claim(word, (kind, word))
        for shape in shapes:
            self._claim(plural(shape), ("shapes", shape))
        self._skeletons: dict[tuple[str, ...], list[_Skeleton]] = {}
        for scene in scenes(_PLACEHOLDER_LOOKS, "zzbg"):
            looks = [(obj.color, obj.shape) for obj in scene.objects]
            facts = scene_facts(looks, scene.layout, scene.relations, "zzbg")
            for text in candidates(scene):
                self._add(self._words(text), Counter(looks), facts)

    def _words(self, text: str) -> list[str]:
        """The words of `text` as the grammar matches them: synonyms as their canonical word, size words dropped."""
        return [word for word in self._canonical(text) if word not in self._sizes]

    def _canonical(self, text: str) -> list[str]:
        return [self._synonyms.get(word, word) for word in tokens(text)]

    def _size_claims(self, text: str) -> frozenset:
        """`("size", look, word)` for each size word followed by a colour and a shape word."""
        words = self._canonical(text)
        kinds = [self._classes.get(word, ("", word)) for word in words]
        return frozenset(
            ("size", (kinds[i + 1][1], kinds[i + 2][1]), word)
            for i, word in enumerate(words[:-2])
            if word in self._sizes and kinds[i + 1][0] == "color" and kinds[i + 2][0] == "shape"
        )

    def _claim(self, word: str, meaning: tuple[str, str]) -> None:
        if self._classes.get(word, meaning) != meaning:
            raise ValueError(f"the word {word!r} is both a {self._classes[word][0]} and a {meaning[0]} word")
        self._classes[word] = meaning

    def _add(self, words: list[str], named: Counter, facts: frozenset) -> None:
        key, slots = [], []
        for word in words:
            match = _PLACEHOLDER.fullmatch(word)
            if match:
                base, plural = match.groups()
                key.append("shapes" if plural else "bg" if base == "zzbg" else base[2:-1])  # colour, shape
                slots.append(base)
            else:
                if word in self._classes:
                    raise ValueError(f"the template word {word!r} is also a {self._classes[word][0]} word")
                key.append("a" if word == "an" else word)
                slots.append(None)
        self._skeletons.setdefault(tuple(key), []).append(_Skeleton(tuple(slots), named, facts))

    def read(self, caption: str) -> Reading:
        words = self._words(caption)
        meanings = [self._classes.get(word) for word in words]
        key = tuple(m[0] if m else ("a" if w == "an" else w) for w, m in zip(words, meanings))
        readings = [self._reading(s, meanings) for s in self._skeletons.get(key, ())]
        readings = [r for r in readings if r is not None]
        if not readings:
            return Reading()
        named = readings[0].named
        claims = readings[0].claims
        for reading in readings[1:]:  # what every matching template says
            named = named & reading.named
            claims = claims & reading.claims
        return Reading(named=dict(named), claims=claims | self._size_claims(caption))

    @staticmethod
    def _reading(skeleton: _Skeleton, meanings: list[tuple[str, str] | None]) -> Reading | None:
        binding: dict[str, str] = {}
        for slot, meaning in zip(skeleton.slots, meanings):
            if slot is not None and binding.setdefault(slot, meaning[1]) != meaning[1]:
                return None  # one placeholder, two words
        named: Counter = Counter()
        for look, count in skeleton.named.items():  # summed: two placeholders may name the same look
            named[_bind(look, binding)] += count
        named.pop(None, None)
        claims = frozenset(_normal(fact) for fact in (_bind(f, binding) for f in skeleton.facts) if fact is not None)
        return Reading(named=named, claims=claims)


class WordListGrammar(CaptionGrammar):
    """Captions that are filler words and colour and shape words in any order (the alt-text world's): a colour
    followed by a shape names an object; they state no fact.

    Args:
        fillers: The filler phrases ("stock photo"); their words may appear anywhere.
        colors: Colour words.
        shapes: Shape words.
    """

    def __init__(self, *, fillers: Iterable[str], colors: Iterable[str], shapes: Iterable[str]) -> None:
        self._colors, self._shapes = frozenset(colors), frozenset(shapes)
        self._words = self._colors | self._shapes | {word for phrase in fillers for word in phrase.split()}

    def read(self, caption: str) -> Reading:
        words = tokens(caption)
        if not words or any(word not in self._words for word in words):
            return Reading()
        pairs = zip(words, words[1:])
        named = Counter((c, s) for c, s in pairs if c in self._colors and s in self._shapes)
        return Reading(named=dict(named))


#: How each world's grammar is built (every name of `synthetic.WORLDS`).
_GRAMMARS: dict[str, Callable[[], CaptionGrammar]] = {
    "captions": lambda: TemplateGrammar(
        colors=COLORS, shapes=SHAPES, backgrounds=BACKGROUNDS, candidates=caption_candidates, scenes=template_scenes
    ),
    "alt-text": lambda: WordListGrammar(fillers=ALT_TEXT_FILLERS, colors=COLORS, shapes=ALT_TEXT_SHAPES),
    "hard": lambda: _hard_grammar(),
}


def _hard_grammar() -> TemplateGrammar:
    from .hard_world import (
        HARD_BACKGROUNDS,
        HARD_COLORS,
        HARD_SHAPES,
        SIZE_WORDS,
        SYNONYMS,
        hard_caption_candidates,
        hard_template_scenes,
        plural_noun,
    )

    return TemplateGrammar(
        colors=HARD_COLORS,
        shapes=HARD_SHAPES,
        backgrounds=HARD_BACKGROUNDS,
        candidates=hard_caption_candidates,
        scenes=hard_template_scenes,
        plural=plural_noun,
        synonyms={word: canonical for canonical, words in SYNONYMS.items() for word in words},
        sizes=SIZE_WORDS,
    )


@cache
def grammar_of(world: str) -> CaptionGrammar:
    """The caption grammar of `world` (built once).

    Args:
        world: A world of `make_synthetic` (`itune_hf.data.synthetic.WORLDS`).

    Raises:
        ValueError: an unknown world (names the known ones).
    """
    if world not in _GRAMMARS:
        raise ValueError(f"no caption grammar for world {world!r}; worlds: {', '.join(WORLDS)}")
    return _GRAMMARS[world]()


# ------------------------------------------------------------------------------------------------ reading scenes


def _recorded(entry: dict[str, Any], world: str, where: str) -> RecordedScene | None:
    """The scene of one `dataset.json` entry, or None when it records none (no `objects` or no `relations`)."""
    if "objects" not in entry or "relations" not in entry:
        return None
    try:
        objects = tuple((obj["color"], obj["shape"]) for obj in entry["objects"])
        relations = tuple(tuple(relation) for relation in entry["relations"])
        sizes = tuple(obj.get("size") for obj in entry["objects"])
        sizes = sizes if any(size is not None for size in sizes) else None
        scene = RecordedScene(world, objects, entry["layout"], entry["background"], relations, sizes)
        scene.facts  # noqa: B018 (indices checked here, not when scoring)
    except (KeyError, TypeError, IndexError, ValueError) as error:
        raise DataFormatError(
            f"{where}: its scene (objects, layout, background, relations) is malformed: {error!r}"
        ) from None
    return scene


def _recorded_words(entry: dict[str, Any], where: str) -> RecordedWords | None:
    """The content words of one `itune-clipart` entry, or None when it has no `content_words` field."""
    if "content_words" not in entry:
        return None
    words = entry["content_words"]
    if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
        raise DataFormatError(f"{where}: content_words must be a list of strings, got {words!r:.80}")
    return RecordedWords(frozenset(word.strip().lower() for word in words if word.strip()))


def read_scenes(path: str | os.PathLike) -> dict[str, RecordedScene | RecordedWords]:
    """Image id -> what the file records of the image: a generated world's scene (`RecordedScene`), or an
    `itune make-clipart` corpus's content words (`RecordedWords`); empty for any other caption file.

    Ids are the rows' `image_id` (`karpathy.entry_image_id`). A file whose scenes do not record their
    relations (`make-synthetic` version 1) gives none: regenerate it. An image without the field gets no record.

    Args:
        path: A `dataset.json` (Karpathy format).

    Raises:
        DataFormatError: the file is not JSON, or is a generated world whose scenes are malformed, or a clipart
            corpus whose content words are not a list of strings (names the entry).
        OSError: the file cannot be read.
    """
    from .karpathy import entry_image_id

    with open(path, encoding="utf-8") as handle:
        try:
            data = json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise DataFormatError(f"{path}: not a JSON file ({error})") from None
    kind = data.get("dataset") if isinstance(data, dict) else None
    if kind not in (DATASET_KIND, CLIPART_DATASET_KIND):
        return {}
    world = (data.get("generator") or {}).get("world", "captions")
    scenes: dict[str, RecordedScene | RecordedWords] = {}
    for index, entry in enumerate(data.get("images", [])):
        where = f"{path}: images[{index}]"
        record = _recorded(entry, world, where) if kind == DATASET_KIND else _recorded_words(entry, where)
        if record is not None:
            scenes[entry_image_id(entry, where)] = record
    return scenes


def read_instance_objects(instances: str | os.PathLike | Sequence[str | os.PathLike]) -> dict[str, RecordedObjects]:
    """Image id -> its annotated objects (`RecordedObjects`), from COCO instance annotations (`instances_val2014.json`,
    or several files: train2014 and val2014 for the Karpathy COCO split). Every image of a file gets a record, those
    without annotations an empty one; ids are strings, as the caption loaders give them.

    Args:
        instances: One instances JSON file, or several.

    Raises:
        FileNotFoundError: a file does not exist.
        DataFormatError: a file is not COCO instances JSON, or an entry is malformed (names the file, the entry and the
            field), or an annotation names an image or a category the file does not list.
    """
    from ._common import read_json

    paths = [instances] if isinstance(instances, (str, os.PathLike)) else list(instances)
    records: dict[str, RecordedObjects] = {}
    for path in paths:
        records.update(_instance_objects_of(read_json(path, "instances"), str(path)))
    return records


def _instance_objects_of(data: Any, source: str) -> dict[str, RecordedObjects]:
    """`read_instance_objects` of one parsed file."""
    from ._common import image_id_text

    def entries(key: str, fields: tuple[str, ...]) -> Iterable[tuple[str, dict]]:
        items = data.get(key) if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise DataFormatError(
                f"{source}: expected COCO instances JSON, an object with 'images', 'annotations' and 'categories' "
                f"lists; {key!r} is missing or not a list"
            )
        for index, item in enumerate(items):
            where = f"{source}: {key}[{index}]"
            missing = [name for name in fields if not isinstance(item, dict) or name not in item]
            if missing:
                raise DataFormatError(f"{where}: field {missing[0]!r} is missing")
            yield where, item

    names = {str(item["id"]): str(item["name"]) for _, item in entries("categories", ("id", "name"))}
    images = entries("images", ("id",))
    objects: dict[str, set[str]] = {image_id_text(item["id"], where): set() for where, item in images}
    for where, item in entries("annotations", ("image_id", "category_id")):
        image_id = image_id_text(item["image_id"], where, "image_id")
        if image_id not in objects:
            raise DataFormatError(f"{where}: image_id {item['image_id']!r} is not among the file's images")
        if str(item["category_id"]) not in names:
            raise DataFormatError(f"{where}: category_id {item['category_id']!r} is not among the file's categories")
        objects[image_id].add(names[str(item["category_id"])])
    vocabulary = frozenset(names.values())
    return {image_id: RecordedObjects(frozenset(found), vocabulary) for image_id, found in objects.items()}


def scenes_of_data(
    data: str,
    instances: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    find_instances: bool = False,
) -> dict[str, RecordedScene | RecordedWords | RecordedObjects]:
    """The records of the data an `itune` command reads (`--data`: a built-in name, a dataset directory or its
    `dataset.json`, a COCO caption file): its recorded scenes or content words (`read_scenes`), and the annotated
    objects of COCO instance annotations (`read_instance_objects`): those of `instances`, else, with
    `find_instances`, those of the `instances_<name>.json` beside a `captions_<name>.json` (COCO's own layout).
    Empty where there are none.

    Args:
        data: The `--data` value.
        instances: COCO instance annotations of the data's images (`--instances`), or None.
        find_instances: Read the instances file beside a COCO caption file when `instances` is None (`itune eval`
            and `itune score` do; training does not parse a large file it does not need).
    """
    from .loading import BUILTIN_DATASETS, builtin_dataset

    if data in BUILTIN_DATASETS:
        path = Path(builtin_dataset(data))
    else:
        path = Path(data) / "dataset.json" if os.path.isdir(data) else Path(data)
    sibling = path.with_name("instances_" + path.name.removeprefix("captions_"))
    if instances is None and find_instances and path.name.startswith("captions_") and sibling.is_file():
        instances = sibling
    records: dict[str, RecordedScene | RecordedWords | RecordedObjects] = {}
    if instances is not None:
        records.update(read_instance_objects(instances))
    if path.suffix == ".json" and path.is_file():
        records.update(read_scenes(path))
    return records
