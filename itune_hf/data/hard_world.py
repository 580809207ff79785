"""The hard world (`itune make-synthetic --world hard`): a caption world whose text cannot be guessed without the image.

Each image shows 1 to 5 objects of 13 shapes in 10 colours (some close in hue: red and orange, blue and navy, purple
and pink), small or large, placed at random with partial overlap allowed (later objects are drawn over earlier ones),
on a plain, striped, checkered, dotted or noisy grey background. Its 5 captions list every object by colour and shape,
identical objects counted ("three navy rings"), single ones with their size in about half of the captions, in the
order they were drawn, through 10 templates; each colour, shape, size and background word may be replaced by a
synonym (`SYNONYMS`: "crimson" for red, "disc" for circle, "backdrop" for background, ...), articles following
("an emerald disc"). The best constant caption scores far lower than in the captions world (`benchmarks/RESULTS.md`),
so CIDEr-D measures more of the image here.

Captions state no spatial relation; the scene still records them (`Scene.relations`: left of / above where the
centres are apart by more than half the objects' mean size). Like the other worlds, output depends only on the seed,
the image index and the image size (`random.Random` seeded with a string; noise drawn from it too).
"""

from __future__ import annotations

import random
import re
from itertools import product

import numpy as np

from ._scene_parts import DRAWN_SHAPES, Scene, SceneObject, _article, sentence, shape_mask, tokens

__all__ = [
    "HARD_BACKGROUNDS",
    "HARD_COLORS",
    "HARD_PALETTE",
    "HARD_SHAPES",
    "SIZE_WORDS",
    "SYNONYMS",
    "hard_caption_candidates",
    "hard_captions",
    "hard_template_scenes",
    "make_hard_scene",
    "plural_noun",
    "render_hard_scene",
    "size_word",
]

HARD_COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (240, 130, 20),
    "yellow": (245, 215, 30),
    "green": (30, 170, 50),
    "teal": (20, 150, 140),
    "blue": (30, 80, 235),
    "navy": (25, 30, 130),
    "purple": (150, 40, 200),
    "pink": (240, 120, 190),
    "brown": (130, 80, 30),
}
HARD_SHAPES: tuple[str, ...] = DRAWN_SHAPES
HARD_BACKGROUNDS: tuple[str, ...] = ("plain", "striped", "checkered", "dotted", "noisy")
#: Background tones (light, mid, dark grey): far from every object colour.
_TONES: tuple[tuple[int, int, int], ...] = ((205, 205, 205), (165, 165, 165), (115, 115, 115))
HARD_PALETTE: tuple[tuple[int, int, int], ...] = _TONES + tuple(HARD_COLORS.values())
_COLOR_INDEX = {name: len(_TONES) + index for index, name in enumerate(HARD_COLORS)}
#: Size word of a single object: "small" below this size (fraction of the image), else "large".
SIZE_WORDS: dict[str, float] = {"small": 0.27, "large": 1.0}
_NUMBERS = ("", "a", "two", "three", "four", "five")
#: Canonical word -> the words a caption may use for it (itself first).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "red": ("red", "crimson", "scarlet"),
    "orange": ("orange", "tangerine", "amber"),
    "yellow": ("yellow", "golden", "lemon"),
    "green": ("green", "emerald", "grassy"),
    "teal": ("teal", "turquoise", "cyan"),
    "blue": ("blue", "azure", "cobalt"),
    "navy": ("navy", "indigo", "midnight"),
    "purple": ("purple", "violet", "plum"),
    "pink": ("pink", "rose", "salmon"),
    "brown": ("brown", "chocolate", "coffee"),
    "circle": ("circle", "disc", "dot"),
    "circles": ("circles", "discs", "dots"),
    "square": ("square", "box", "tile"),
    "squares": ("squares", "boxes", "tiles"),
    "diamond": ("diamond", "rhombus", "lozenge"),
    "diamonds": ("diamonds", "rhombuses", "lozenges"),
    "cross": ("cross", "plus"),
    "crosses": ("crosses", "pluses"),
    "ring": ("ring", "hoop", "donut"),
    "rings": ("rings", "hoops", "donuts"),
    "oval": ("oval", "ellipse"),
    "ovals": ("ovals", "ellipses"),
    "rectangle": ("rectangle", "bar", "strip"),
    "rectangles": ("rectangles", "bars", "strips"),
    "semicircle": ("semicircle", "dome"),
    "semicircles": ("semicircles", "domes"),
    "crescent": ("crescent", "moon"),
    "crescents": ("crescents", "moons"),
    "star": ("star", "asterisk"),
    "stars": ("stars", "asterisks"),
    "small": ("small", "little", "tiny"),
    "large": ("large", "big", "huge"),
    "background": ("background", "backdrop"),
    "shows": ("shows", "depicts", "contains"),
    "see": ("see", "spot", "notice"),
    "drawn": ("drawn", "painted", "placed"),
    "against": ("against", "over"),
    "picture": ("picture", "photo", "drawing"),
    "striped": ("striped", "stripy"),
    "dotted": ("dotted", "spotted"),
    "checkered": ("checkered", "chequered"),
    "noisy": ("noisy", "grainy"),
}
_SIZES = {1: (0.30, 0.50), 2: (0.22, 0.40), 3: (0.18, 0.34), 4: (0.17, 0.30), 5: (0.16, 0.28)}
_MARGIN = 0.03
_REPEAT = 0.3  # chance that an object repeats the look of an earlier one (counted captions)


def plural_noun(shape: str) -> str:
    """The plural of a shape's noun ("crosses", "circles")."""
    return shape + ("es" if shape.endswith(("s", "x")) else "s")


def _place(rng: random.Random, placed: list[SceneObject], size: float) -> tuple[float, float]:
    """A centre for an object of `size`: overlapping earlier ones at most partly (centres at least 0.45 of the two
    sizes apart), else, after 50 tries, wherever the last try fell."""
    for _ in range(50):
        cx, cy = (rng.uniform(_MARGIN + size / 2, 1 - _MARGIN - size / 2) for _ in range(2))
        if all((cx - o.cx) ** 2 + (cy - o.cy) ** 2 >= (0.45 * (size + o.size)) ** 2 for o in placed):
            break
    return cx, cy


def make_hard_scene(rng: random.Random) -> Scene:
    """Draw one scene of the hard world from `rng`: 1-5 objects in drawing order, layout `scatter`."""
    count = rng.randint(1, 5)
    background = rng.choice(HARD_BACKGROUNDS)
    low, high = _SIZES[count]
    objects: list[SceneObject] = []
    for _ in range(count):
        if objects and rng.random() < _REPEAT:
            shape, color = rng.choice([(o.shape, o.color) for o in objects])
        else:
            shape, color = rng.choice(HARD_SHAPES), rng.choice(list(HARD_COLORS))
        size = rng.uniform(low, high)
        cx, cy = _place(rng, objects, size)
        objects.append(SceneObject(shape, color, cx, cy, size))
    return Scene(kind=str(count), background=background, layout="scatter", objects=tuple(objects))


def _groups(scene: Scene) -> list[list[SceneObject]]:
    """The scene's objects grouped by look, groups in the order of their first object."""
    groups: dict[tuple[str, str], list[SceneObject]] = {}
    for obj in scene.objects:
        groups.setdefault((obj.color, obj.shape), []).append(obj)
    return list(groups.values())


def size_word(size: float) -> str:
    """The size word a caption says of a single object of `size` (a fraction of the image): `SIZE_WORDS`.

    Args:
        size: The object's size.
    """
    return next(word for word, limit in SIZE_WORDS.items() if size < limit)


def _phrase(group: list[SceneObject], sized: bool) -> str:
    first = group[0]
    if len(group) == 1:
        size = size_word(first.size)
        return _article(f"{size} {first.color} {first.shape}" if sized else f"{first.color} {first.shape}")
    return f"{_NUMBERS[len(group)]} {first.color} {plural_noun(first.shape)}"


def hard_caption_candidates(scene: Scene, sized: bool = True) -> list[str]:
    """Every template of the hard world filled for `scene`, in canonical words (no synonyms).

    Args:
        scene: A scene of `make_hard_scene`.
        sized: Single objects are named with their size ("a small red circle").
    """
    phrases = [_phrase(group, sized) for group in _groups(scene)]
    listed = phrases[0] if len(phrases) == 1 else f"{', '.join(phrases[:-1])} and {phrases[-1]}"
    verb = "is" if len(_groups(scene)[0]) == 1 else "are"
    bg = scene.background
    return [
        listed,
        f"{listed} on a {bg} background",
        f"there {verb} {listed} in the picture",
        f"a picture of {listed}",
        f"a {bg} background with {listed}",
        f"{listed} against a {bg} background",
        f"this picture shows {listed}",
        f"{listed} drawn on a {bg} background",
        f"you can see {listed}",
        f"on a {bg} background there {verb} {listed}",
    ]


def _article_before(match: re.Match) -> str:
    return "an " if match[1] in "aeiou" else "a "


def hard_captions(scene: Scene, rng: random.Random, count: int) -> list[str]:
    """`count` captions of `scene`: different templates, sizes said in about half of them, each word replaced by one
    of its `SYNONYMS` at random."""
    texts = [rng.choice(pair) for pair in zip(hard_caption_candidates(scene), hard_caption_candidates(scene, False))]
    captions = []
    for text in rng.sample(texts, count):
        text = re.sub(r"[a-z]+", lambda m: rng.choice(SYNONYMS.get(m[0], (m[0],))), text)
        captions.append(sentence(re.sub(r"\ban? (?=([a-z]))", _article_before, text)))  # "an emerald disc"
    return captions


def hard_template_scenes(looks: tuple[tuple[str, str], ...], background: str) -> list[Scene]:
    """One scene of every structure the templates tell apart: each ordered split of 1-5 objects into groups of one
    look (`looks` in order), all at one place (the captions state no relation).

    Args:
        looks: Five different `(shape, colour)` pairs.
        background: The background's name.
    """
    scenes = []
    for count in range(1, 6):
        for cuts in product((False, True), repeat=count - 1):  # a cut after object i starts a new group
            group, objects = 0, []
            for index in range(count):
                if index and cuts[index - 1]:
                    group += 1
                shape, color = looks[group]
                objects.append(SceneObject(shape, color, 0.5, 0.5, 0.3))
            scenes.append(Scene(str(count), background, "scatter", tuple(objects)))
    return scenes


def _background(name: str, image_size: int, rng: random.Random) -> np.ndarray:
    """Palette indices of a textured background (tones 0-2)."""
    ys, xs = np.mgrid[0:image_size, 0:image_size]
    if name == "plain":
        return np.zeros((image_size, image_size), dtype=np.uint8)
    if name == "striped":
        return ((ys // 4) % 2).astype(np.uint8)
    if name == "checkered":
        return ((xs // 8 + ys // 8) % 2).astype(np.uint8)
    if name == "dotted":
        return (((xs % 6) < 2) & ((ys % 6) < 2)).astype(np.uint8) * 2
    if name == "noisy":
        values = [rng.randrange(3) for _ in range(image_size * image_size)]
        return np.array(values, dtype=np.uint8).reshape(image_size, image_size)
    raise ValueError(f"unknown background {name!r}; backgrounds: {', '.join(HARD_BACKGROUNDS)}")


def render_hard_scene(scene: Scene, image_size: int, rng: random.Random) -> tuple[np.ndarray, list[list[int]]]:
    """Palette-index image (`HARD_PALETTE`) of `scene` and each object's whole pixel box `[x0, y0, x1, y1]`.

    Args:
        scene: A scene of `make_hard_scene`.
        image_size: Width and height in pixels.
        rng: Draws the noise of a noisy background.
    """
    canvas = _background(scene.background, image_size, rng)
    boxes = []
    for obj in scene.objects:
        mask = shape_mask(obj.shape, obj.cx * image_size, obj.cy * image_size, obj.size * image_size, image_size)
        if not mask.any():
            raise ValueError(f"image_size {image_size} is too small to draw a {obj.shape}")
        canvas[mask] = _COLOR_INDEX[obj.color]
        rows, cols = np.nonzero(mask)
        boxes.append([int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1])
    return canvas, boxes


def hard_vocabulary() -> list[str]:
    """Every word a hard-world caption can use."""
    looks = tuple((HARD_SHAPES[i], list(HARD_COLORS)[i]) for i in range(5))
    words = set(HARD_COLORS) | set(HARD_SHAPES) | {plural_noun(s) for s in HARD_SHAPES} | set(_NUMBERS[1:])
    words |= set(SIZE_WORDS) | {w for options in SYNONYMS.values() for w in options} | {"an"}
    for background in HARD_BACKGROUNDS:
        for scene in hard_template_scenes(looks, background):
            for text in hard_caption_candidates(scene):
                words.update(tokens(text))
    return sorted(words)
