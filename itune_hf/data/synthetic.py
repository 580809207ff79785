"""The embedded default dataset: a procedurally generated caption world of flat shapes (`itune make-synthetic`).

Each image shows 1 to 3 large, flat-coloured, non-overlapping shapes (circle, square, triangle, star) in 5 colours
that differ strongly in RGB (red, green, blue, yellow, purple) on a plain background (white, black or gray). Layouts
are a single shape, a pair side by side or one above the other, or three in a row or a column, so relative positions
are never ambiguous. Each image has 5 reference captions, drawn from paraphrase templates (different phrasing and
word order, as COCO references differ), all fully determined by the image: every caption names every object by
colour and shape, counts identical objects ("two red circles") and may name the background or the positions.

It is designed to be learnable by a small captioner with a frozen, randomly initialised ViT (patch size 8 at 64x64)
on a CPU in minutes: objects span several 8x8 patches, colours are exact palette values (no anti-aliasing), and the
vocabulary is small (`VOCABULARY`).

Output is deterministic by seed and independent of the machine: randomness comes from Python's `random.Random`
seeded per image with a string (SHA-512 seeding, stable across platforms and versions), geometry uses only exact
float arithmetic on constants written in the source, and PNGs are written uncompressed by `_png` (no zlib-version
dependence). Image `i` depends only on `(seed, i, image_size)`, so a smaller dataset is a prefix of a larger one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.files import atomic_write_text
from ._output import DATASET_FILE, write_dataset_dir
from ._png import encode_palette_png
from ._scene_parts import (  # noqa: F401 (the worlds' shared parts, also importable from here)
    RELATION_OF_LAYOUT,
    Scene,
    SceneObject,
    _article,
    sentence,
    shape_mask,
    tokens,
)
from .hard_world import (
    HARD_PALETTE,
    hard_captions,
    hard_vocabulary,
    make_hard_scene,
    render_hard_scene,
    size_word,
)

#: Bumped whenever the generator's output changes for a given seed (built-in caches are keyed by it). Version 2
#: added each scene's `relations` to `dataset.json`, version 3 the hard world's object sizes (the size word its
#: captions say); the images and captions are those of version 1 (`DRAW_VERSION`).
SYNTHETIC_VERSION = 3
#: The version in the random generators' seeds: what a seed draws (scenes, images, captions), unchanged since 1.
DRAW_VERSION = 1
DATASET_KIND = "itune-synthetic"

BACKGROUNDS: dict[str, tuple[int, int, int]] = {"white": (255, 255, 255), "black": (0, 0, 0), "gray": (150, 150, 150)}
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 230),
    "yellow": (245, 215, 30),
    "purple": (160, 40, 210),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star")
#: Palette index of each colour name: backgrounds first, then object colours.
PALETTE: tuple[tuple[int, int, int], ...] = tuple(BACKGROUNDS.values()) + tuple(COLORS.values())
PALETTE_INDEX: dict[str, int] = {name: index for index, name in enumerate([*BACKGROUNDS, *COLORS])}

DEFAULT_NUM_IMAGES = 2_000
DEFAULT_IMAGE_SIZE = 64
DEFAULT_SPLIT_FRACTIONS: tuple[float, float, float] = (0.8, 0.1, 0.1)
CAPTIONS_PER_IMAGE = 5
MIN_IMAGE_SIZE = 24

#: Scene kinds and their probabilities.
SCENE_WEIGHTS: dict[str, float] = {
    "one": 0.25,
    "pair_same": 0.10,
    "pair_different": 0.30,
    "three_same": 0.07,
    "pair_and_one": 0.14,
    "three_different": 0.14,
}
#: Objects in a scene of each kind.
OBJECT_COUNT: dict[str, int] = {
    "one": 1, "pair_same": 2, "pair_different": 2, "three_same": 3, "pair_and_one": 3, "three_different": 3,
}  # fmt: skip

_MARGIN, _GAP = 0.03, 0.05  # canvas margin and minimum gap between objects, as fractions of the image size
_SIZES = {1: (0.40, 0.55), 2: (0.30, 0.38), 3: (0.23, 0.28)}  # object size range by object count
_CROSS_JITTER = 0.04


def _pick_kind(rng: random.Random) -> str:
    value, total = rng.random(), 0.0
    for kind, weight in SCENE_WEIGHTS.items():
        total += weight
        if value < total:
            return kind
    return kind


def _random_look(rng: random.Random, avoid: set[tuple[str, str]] = frozenset()) -> tuple[str, str]:
    while True:
        look = (rng.choice(SHAPES), rng.choice(list(COLORS)))
        if look not in avoid:
            return look


def _positions(rng: random.Random, count: int, size: float) -> list[float]:
    """Centres along the layout axis: slot k of `count` equal slots, kept `_GAP` apart and `_MARGIN` from edges."""
    slot = 1.0 / count
    centres = []
    for k in range(count):
        low = k * slot + (_MARGIN if k == 0 else _GAP / 2) + size / 2
        high = (k + 1) * slot - (_MARGIN if k == count - 1 else _GAP / 2) - size / 2
        centres.append(rng.uniform(low, high) if high > low else (low + high) / 2)
    return centres


def make_scene(rng: random.Random) -> Scene:
    """Draw one scene (kind, background, layout and objects) from `rng`."""
    kind = _pick_kind(rng)
    background = rng.choice(list(BACKGROUNDS))
    count = OBJECT_COUNT[kind]
    if kind == "one":
        looks = [_random_look(rng)]
    elif kind in ("pair_same", "three_same"):
        looks = [_random_look(rng)] * count
    elif kind == "pair_different":
        first = _random_look(rng)
        looks = [first, _random_look(rng, {first})]
    elif kind == "pair_and_one":
        pair = _random_look(rng)
        odd = _random_look(rng, {pair})
        looks = [pair, pair, pair]
        looks[rng.randrange(3)] = odd
    else:  # three_different
        first = _random_look(rng)
        second = _random_look(rng, {first})
        looks = [first, second, _random_look(rng, {first, second})]
    low, high = _SIZES[count]
    size = rng.uniform(low, high)
    if count == 1:
        layout = "single"
        cx = rng.uniform(_MARGIN + size / 2, 1 - _MARGIN - size / 2)
        cy = rng.uniform(_MARGIN + size / 2, 1 - _MARGIN - size / 2)
        objects = (SceneObject(looks[0][0], looks[0][1], cx, cy, size),)
    else:
        layout = rng.choice(("row", "column"))
        along = _positions(rng, count, size)
        base = rng.uniform(_MARGIN + size / 2 + _CROSS_JITTER, 1 - _MARGIN - size / 2 - _CROSS_JITTER)
        across = [base + rng.uniform(-_CROSS_JITTER, _CROSS_JITTER) for _ in range(count)]
        objects = tuple(
            SceneObject(shape, color, a if layout == "row" else c, c if layout == "row" else a, size)
            for (shape, color), a, c in zip(looks, along, across)
        )
    return Scene(kind=kind, background=background, layout=layout, objects=objects)


def render_scene(scene: Scene, image_size: int) -> tuple[np.ndarray, list[list[int]]]:
    """Palette-index image (H, W) of `scene` and each object's pixel bounding box `[x0, y0, x1, y1]` (exclusive)."""
    canvas = np.full((image_size, image_size), PALETTE_INDEX[scene.background], dtype=np.uint8)
    boxes = []
    for obj in scene.objects:
        mask = shape_mask(obj.shape, obj.cx * image_size, obj.cy * image_size, obj.size * image_size, image_size)
        if not mask.any():
            raise ValueError(f"image_size {image_size} is too small to draw a {obj.shape}")
        canvas[mask] = PALETTE_INDEX[obj.color]
        rows, cols = np.nonzero(mask)
        boxes.append([int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1])
    return canvas, boxes


def _one_candidates(scene: Scene, on_bg: str) -> list[str]:
    """Templates for a single object."""
    phrase = scene.objects[0].phrase
    a = _article(phrase)
    bg = scene.background
    return [
        a,
        f"{a} {on_bg}",
        f"a single {phrase}",
        f"there is {a} in the picture",
        f"a {bg} background with {a} on it",
        f"one {phrase} {on_bg}",
        f"a picture of {a}",
    ]


def _same_candidates(scene: Scene, on_bg: str) -> list[str]:
    """Templates for two or three identical objects (counted: "two red circles")."""
    objs = scene.objects
    row = scene.layout == "row"
    number = "two" if len(objs) == 2 else "three"
    things = objs[0].plural
    if len(objs) == 2:
        arranged = ["side by side", "next to each other"] if row else ["one above the other", "stacked vertically"]
        group = "a pair of"
    else:
        arranged = ["in a row", "side by side"] if row else ["in a column", "stacked vertically"]
        group = "a row of three" if row else "a column of three"
    return [
        f"{number} {things}",
        f"{number} {things} {arranged[0]}",
        f"{number} {things} {arranged[1]}",
        f"{group} {things} {on_bg}" if len(objs) == 2 else f"{group} {things}",
        f"there are {number} {things} in the picture",
        f"{number} {things} {on_bg}",
        f"{number} {things} {arranged[0]} {on_bg}",
    ]


def _pair_different_candidates(scene: Scene, on_bg: str) -> list[str]:
    """Templates for two different objects, left/right or above/below."""
    a, b = _article(scene.objects[0].phrase), _article(scene.objects[1].phrase)
    if scene.layout == "row":
        return [
            f"{a} to the left of {b}",
            f"{b} to the right of {a}",
            f"{a} on the left and {b} on the right",
            f"{b} on the right and {a} on the left",
            f"{a} and {b} side by side",
            f"there is {a} to the left of {b} {on_bg}",
            f"{on_bg}, {a} is to the left of {b}",
        ]
    return [
        f"{a} above {b}",
        f"{b} below {a}",
        f"{a} at the top and {b} at the bottom",
        f"{b} at the bottom and {a} at the top",
        f"{b} under {a}",
        f"there is {a} above {b} {on_bg}",
        f"{on_bg}, {a} is above {b}",
    ]


def _pair_and_one_candidates(scene: Scene, on_bg: str) -> list[str]:
    """Templates for two identical objects and an odd one, placed by where the odd one is."""
    objs = scene.objects
    row = scene.layout == "row"
    looks = [(o.shape, o.color) for o in objs]
    odd_index = next(i for i, look in enumerate(looks) if looks.count(look) == 1)
    odd = _article(objs[odd_index].phrase)
    pair = objs[(odd_index + 1) % 3].plural
    before, after = ("to the left of", "to the right of") if row else ("above", "below")
    candidates = [
        f"two {pair} and {odd}",
        f"{odd} and two {pair}",
        f"two {pair} and {odd} {on_bg}",
        f"two {pair} and {odd} {'in a row' if row else 'in a column'}",
    ]
    if odd_index == 1:
        candidates += [f"{odd} between two {pair}", f"two {pair} with {odd} between them"]
    elif odd_index == 0:
        candidates += [f"{odd} {before} two {pair}", f"two {pair} {after} {odd}"]
    else:
        candidates += [f"two {pair} {before} {odd}", f"{odd} {after} two {pair}"]
    return candidates


def _three_different_candidates(scene: Scene, on_bg: str) -> list[str]:
    """Templates for three different objects in a row or a column."""
    a, b, c = (_article(o.phrase) for o in scene.objects)
    row = scene.layout == "row"
    if row:
        ends, middle, order = ("on the left", "on the right"), "in the middle", "from left to right"
    else:
        ends, middle, order = ("at the top", "at the bottom"), "in the middle", "from top to bottom"
    return [
        f"{a}, {b} and {c}",
        f"{a}, {b} and {c} {'in a row' if row else 'in a column'}",
        f"{a} {ends[0]}, {b} {middle} and {c} {ends[1]}",
        f"{c} {ends[1]}, {b} {middle} and {a} {ends[0]}",
        f"{order}: {a}, {b} and {c}",
        f"{a}, {b} and {c} {on_bg}",
        f"{b} between {a} and {c}",
    ]


#: The paraphrase templates of each scene kind (`SCENE_WEIGHTS`).
_CANDIDATES = {
    "one": _one_candidates,
    "pair_same": _same_candidates,
    "three_same": _same_candidates,
    "pair_different": _pair_different_candidates,
    "pair_and_one": _pair_and_one_candidates,
    "three_different": _three_different_candidates,
}


def caption_candidates(scene: Scene) -> list[str]:
    """Every paraphrase template filled for `scene` (lower case, no final period); all are true of the image."""
    if scene.kind not in _CANDIDATES:
        raise ValueError(f"unknown scene kind {scene.kind!r}; kinds: {', '.join(_CANDIDATES)}")
    return _CANDIDATES[scene.kind](scene, f"on a {scene.background} background")


def template_scenes(looks: tuple[tuple[str, str], ...], background: str) -> list[Scene]:
    """One scene of every structure the templates tell apart (kind, layout, position of the odd one), its objects
    drawn with `looks` in order (a kind of identical objects repeats the first): every caption `caption_candidates`
    can write is one of theirs with other looks. The vocabulary and the caption grammar (`itune_hf.data.scenes`)
    are read from them.

    Args:
        looks: Three different `(shape, colour)` pairs.
        background: The background's name.
    """
    scenes = []
    for kind, count in OBJECT_COUNT.items():
        for layout in ("row", "column") if count > 1 else ("single",):
            for odd in range(3) if kind == "pair_and_one" else (None,):
                chosen = [looks[0]] * count if kind in ("pair_same", "three_same", "pair_and_one") else looks[:count]
                if odd is not None:
                    chosen[odd] = looks[1]
                objects = tuple(SceneObject(shape, color, 0.5, 0.5, 0.3) for shape, color in chosen)
                scenes.append(Scene(kind, background, layout, objects))
    return scenes


def _vocabulary() -> list[str]:
    """Every word of every template, for every scene kind, layout, odd-one position and background."""
    colors = list(COLORS)
    words = set(colors) | set(SHAPES) | {f"{shape}s" for shape in SHAPES}
    looks = tuple((SHAPES[i], colors[i]) for i in range(3))
    for background in BACKGROUNDS:
        for scene in template_scenes(looks, background):
            for text in caption_candidates(scene):
                words.update(tokens(text))
    return sorted(words)


#: Every word any synthetic caption can use (lower case).
VOCABULARY: tuple[str, ...] = tuple(_vocabulary())


# ----------------------------------------------------------------------------------------------------------------
# The alt-text world: an out-of-domain, noisy stand-in for Conceptual Captions (XGPT's first pre-training stage)
# ----------------------------------------------------------------------------------------------------------------
WORLDS = ("captions", "alt-text", "hard")
#: The alt-text world's shapes: the captions world's two of them, and two it never shows.
ALT_TEXT_SHAPES: tuple[str, ...] = ("circle", "star", "diamond", "cross")
ALT_TEXT_FILLERS: tuple[str, ...] = (
    "photo", "image", "stock photo", "picture", "icon", "vector", "clipart", "hd wallpaper", "free download", "logo",
)  # fmt: skip
#: Chance that an alt-text caption is unrelated to its image (alt-text scraped from the web often is): the default.
ALT_TEXT_UNRELATED = 0.2
#: Chance that each content word of an alt-text caption is dropped: the default.
ALT_TEXT_WORD_DROP = 0.25


@dataclasses.dataclass(frozen=True)
class CaptionNoise:
    """How noisy the alt-text world's captions are (`itune make-synthetic --world alt-text --caption-noise`).

    An image's scene and pixels are drawn before its captions, so two arms of one seed show the same images and scenes
    and differ only in their captions. `CaptionNoise(0, 0)` is the clean arm: every caption names every object of its
    image.

    Args:
        unrelated: Chance that a caption describes a random object instead of its image.
        word_drop: Chance that each colour or shape word of a caption is dropped.
    """

    unrelated: float = ALT_TEXT_UNRELATED
    word_drop: float = ALT_TEXT_WORD_DROP

    def __post_init__(self) -> None:
        for name in ("unrelated", "word_drop"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"caption noise {name} must be a rate from 0 to 1; got {value}")

    @property
    def is_default(self) -> bool:
        """Whether these are the world's default rates (the noisy arm)."""
        return self == CaptionNoise()


#: Every word an alt-text caption can use.
ALT_TEXT_VOCABULARY: list[str] = sorted({*COLORS, *ALT_TEXT_SHAPES, *" ".join(ALT_TEXT_FILLERS).split()})


def make_alt_text_scene(rng: random.Random) -> Scene:
    """One or two objects of the alt-text world's shapes (two of them never in the captions world), on a random
    background, at sizes and places the captions world does not use."""
    count = 1 if rng.random() < 0.6 else 2
    looks = [(rng.choice(ALT_TEXT_SHAPES), rng.choice(list(COLORS))) for _ in range(count)]
    size = rng.uniform(0.45, 0.7) if count == 1 else rng.uniform(0.3, 0.4)
    centres = _positions(rng, count, size)
    cross = rng.uniform(_MARGIN + size / 2, 1 - _MARGIN - size / 2)
    objects = tuple(SceneObject(shape, color, a, cross, size) for (shape, color), a in zip(looks, centres))
    kind = "one" if count == 1 else "pair_different"
    return Scene(kind=kind, background=rng.choice(list(BACKGROUNDS)), layout="single" if count == 1 else "row",
                 objects=objects)  # fmt: skip


def alt_text_caption(scene: Scene, rng: random.Random, noise: CaptionNoise = CaptionNoise()) -> str:
    """One short, noisy alt-text caption: a filler ("stock photo", "icon", ...), some of the objects' words (each
    dropped at `noise.word_drop`), in no fixed order; unrelated to the image at `noise.unrelated`."""
    if rng.random() < noise.unrelated:
        objects = [SceneObject(rng.choice(ALT_TEXT_SHAPES), rng.choice(list(COLORS)), 0.5, 0.5, 0.3)]
    else:
        objects = list(scene.objects)
        rng.shuffle(objects)
    words = [word for obj in objects for word in (obj.color, obj.shape) if rng.random() >= noise.word_drop]
    if not words:
        words = [objects[0].shape]
    filler = rng.choice(ALT_TEXT_FILLERS)
    return " ".join([*words, filler] if rng.random() < 0.5 else [filler, *words])


def _captions_rng(seed: int, index: int) -> random.Random:
    """The random generator of image `index` of the captions world with `seed` (its scene, then its captions)."""
    return random.Random(f"itune-synthetic:v{DRAW_VERSION}:{seed}:{index}")


def scene_of(seed: int, index: int) -> Scene:
    """The scene of image `index` of the captions world with `seed` (what `generate_example` draws and captions).

    Args:
        seed: World seed.
        index: Image index.
    """
    return make_scene(_captions_rng(seed, index))


def generate_example(
    seed: int,
    index: int,
    image_size: int = DEFAULT_IMAGE_SIZE,
    world: str = "captions",
    caption_noise: CaptionNoise = CaptionNoise(),
) -> tuple[bytes, Scene, list[str], list[list[int]]]:
    """Image `index` of the world with `seed`: `(png_bytes, scene, captions, boxes)`; depends on nothing else.

    Args:
        seed: World seed.
        index: Image index.
        image_size: Width and height in pixels.
        world: `"captions"` (the default, in-domain world), `"alt-text"` (other objects, short noisy captions) or
            `"hard"` (`itune_hf.data.hard_world`).
        caption_noise: The alt-text world's noise rates (other worlds have none).
    """
    if world == "hard":
        rng = random.Random(f"itune-synthetic-hard:v{DRAW_VERSION}:{seed}:{index}")
        scene = make_hard_scene(rng)
        captions = hard_captions(scene, rng, CAPTIONS_PER_IMAGE)
        canvas, boxes = render_hard_scene(scene, image_size, rng)
        return encode_palette_png(canvas, HARD_PALETTE), scene, captions, boxes
    if world == "alt-text":
        rng = random.Random(f"itune-synthetic-alt-text:v{DRAW_VERSION}:{seed}:{index}")
        scene = make_alt_text_scene(rng)
        captions = [alt_text_caption(scene, rng, caption_noise) for _ in range(CAPTIONS_PER_IMAGE)]
    else:
        rng = _captions_rng(seed, index)
        scene = make_scene(rng)
        captions = [sentence(text) for text in rng.sample(caption_candidates(scene), CAPTIONS_PER_IMAGE)]
    canvas, boxes = render_scene(scene, image_size)
    return encode_palette_png(canvas, PALETTE), scene, captions, boxes


def split_sizes(num_images: int, fractions: tuple[float, float, float] = DEFAULT_SPLIT_FRACTIONS) -> dict[str, int]:
    """Images per split for `num_images` (val and test rounded, at least 1 each from 3 images; train the rest)."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise ValueError(f"split fractions must be three non-negative numbers (train, val, test); got {fractions}")
    total = sum(fractions)
    val = round(num_images * fractions[1] / total)
    test = round(num_images * fractions[2] / total)
    if num_images >= 3:
        val = max(val, 1) if fractions[1] > 0 else 0
        test = max(test, 1) if fractions[2] > 0 else 0
    val, test = min(val, num_images), min(test, max(0, num_images - val))
    return {"train": num_images - val - test, "val": val, "test": test}


def _dataset_entry(
    index: int, split: str, scene: Scene, captions: list[str], boxes: list[list[int]], world: str
) -> dict:
    """Image `index`'s entry of `dataset.json` (Karpathy's fields plus the scene; in the hard world, whose captions
    say sizes, each object's size word)."""
    first_sentence = index * CAPTIONS_PER_IMAGE
    sized = world == "hard"
    return {
        "filepath": "images",
        "filename": f"{index:06d}.png",
        "imgid": index,
        "split": split,
        "sentids": list(range(first_sentence, first_sentence + CAPTIONS_PER_IMAGE)),
        "sentences": [
            {"raw": text, "tokens": tokens(text), "imgid": index, "sentid": first_sentence + number}
            for number, text in enumerate(captions)
        ],
        "background": scene.background,
        "layout": scene.layout,
        "objects": [
            {"shape": obj.shape, "color": obj.color, "bbox": box, **({"size": size_word(obj.size)} if sized else {})}
            for obj, box in zip(scene.objects, boxes)
        ],
        "relations": scene.relations,
    }


def _world_vocabulary(world: str) -> list[str]:
    """Every word the captions of `world` can use."""
    if world == "hard":
        return hard_vocabulary()
    return list(VOCABULARY) if world == "captions" else ALT_TEXT_VOCABULARY


def make_synthetic(
    output_dir: str | os.PathLike,
    *,
    num_images: int = DEFAULT_NUM_IMAGES,
    seed: int = 0,
    image_size: int = DEFAULT_IMAGE_SIZE,
    split_fractions: tuple[float, float, float] = DEFAULT_SPLIT_FRACTIONS,
    overwrite: bool = False,
    world: str = "captions",
    caption_noise: CaptionNoise | None = None,
) -> Path:
    """Write the synthetic caption world as a Karpathy-format dataset; returns the path of its `dataset.json`.

    Layout: `<output_dir>/dataset.json` and `<output_dir>/images/NNNNNN.png`; load it with
    `load_karpathy(<output_dir>/dataset.json)` (the image root defaults to the JSON's directory). Entries carry
    extra fields `background`, `layout`, `objects` (shape, color, pixel bbox) and `relations` (`Scene.relations`)
    describing the scene exactly; `itune_hf.data.scenes.read_scenes` reads them back for the scene metrics.

    Args:
        output_dir: Directory to write (created). A non-empty directory is refused unless it is a previous
            `make-synthetic` output (replaced) or `overwrite` is set.
        num_images: Number of images (at least 1).
        seed: World seed; the same seed gives byte-identical files on any machine.
        image_size: Width and height in pixels (at least 24; 64 matches the default tiny ViT).
        split_fractions: Fractions of train, val and test images (images are assigned in index order).
        overwrite: Write into a non-empty directory that is not a previous output (same-named files replaced).
        world: `"captions"` (default), `"alt-text"`: an out-of-domain, noisy stand-in for web alt-text
            (Conceptual Captions) for pre-training: circles, stars and two shapes the captions world never shows
            (diamonds, crosses), one or two per image, and short unpunctuated captions ("blue diamond stock photo"),
            with words dropped and a fifth unrelated to the image; `"hard"`: 1-5 possibly overlapping objects of 13
            shapes in 10 colours (some close in hue), small or large, on textured or noisy backgrounds, captions
            paraphrased with synonyms (`itune_hf.data.hard_world`), so that a constant caption scores little.
        caption_noise: The alt-text world's noise rates (None: its defaults, a fifth unrelated and a quarter of the
            words dropped; `CaptionNoise(0, 0)`: every caption names every object of its image). Recorded in
            `dataset.json`'s `generator` when not the defaults. Only the alt-text world takes it.

    Raises:
        ValueError: an argument is out of range.
        DataError: the output directory is not empty and not a previous output, without `overwrite`.
    """
    if num_images < 1:
        raise ValueError(f"num_images must be at least 1; got {num_images}")
    if world not in WORLDS:
        raise ValueError(f"world must be one of {', '.join(WORLDS)}; got {world!r}")
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be at least {MIN_IMAGE_SIZE} pixels; got {image_size}")
    if caption_noise is not None and world != "alt-text":
        raise ValueError(f"caption noise is a setting of the alt-text world only; got it for world {world!r}")
    noise = caption_noise or CaptionNoise()
    sizes = split_sizes(num_images, split_fractions)
    split_of = ["train"] * sizes["train"] + ["val"] * sizes["val"] + ["test"] * sizes["test"]

    def build(directory: Path) -> None:
        (directory / "images").mkdir()
        entries: list[dict[str, Any]] = []
        for index in range(num_images):
            png, scene, captions, boxes = generate_example(seed, index, image_size, world, noise)
            (directory / "images" / f"{index:06d}.png").write_bytes(png)
            entries.append(_dataset_entry(index, split_of[index], scene, captions, boxes, world))
        data = {
            "dataset": DATASET_KIND,
            "generator": {
                "name": "itune_hf.data.synthetic",
                "version": SYNTHETIC_VERSION,
                "seed": seed,
                "num_images": num_images,
                "image_size": image_size,
                "split_sizes": sizes,
                **({"world": world} if world != "captions" else {}),
                **({} if noise.is_default else {"caption_noise": dataclasses.asdict(noise)}),
            },
            "vocabulary": _world_vocabulary(world),
            "images": entries,
        }
        atomic_write_text(directory / DATASET_FILE, json.dumps(data, separators=(",", ":")) + "\n")

    return write_dataset_dir(
        output_dir, kind=DATASET_KIND, command="itune make-synthetic", overwrite=overwrite, build=build
    )
