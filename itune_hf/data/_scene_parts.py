"""What the generated worlds share (`synthetic`, `hard_world`): scenes and their objects, the relations a scene
records, the shapes' masks, and how captions are written and split into words.

Geometry uses exact float arithmetic on constants written in the source (no libm call whose last bit may differ
between machines), so every world's images are the same on any machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Every shape `shape_mask` draws.
DRAWN_SHAPES: tuple[str, ...] = (
    "circle", "square", "triangle", "star", "diamond", "cross", "hexagon", "pentagon", "ring", "oval", "rectangle",
    "semicircle", "crescent",
)  # fmt: skip

# Unit five-pointed star, point up, outer radius 1 (inner vertices scaled by _STAR_INNER); cos/sin of multiples of
# 18 degrees written as constants so no libm call (whose last bit may differ between machines) is involved.
_C18, _S18 = 0.9510565162951535, 0.3090169943749474
_C54, _S54 = 0.5877852522924731, 0.8090169943749474
_STAR_UNIT = (
    (0.0, -1.0),
    (_C54, -_S54),
    (_C18, -_S18),
    (_C18, _S18),
    (_C54, _S54),
    (0.0, 1.0),
    (-_C54, _S54),
    (-_C18, _S18),
    (-_C18, -_S18),
    (-_C54, -_S54),
)
_STAR_INNER = 0.55
_S60 = 0.8660254037844386  # sin 60 degrees, for the hexagon


#: The relation between the objects of a layout, earlier to later in reading order.
RELATION_OF_LAYOUT: dict[str, str] = {"row": "left_of", "column": "above"}


@dataclass(frozen=True)
class SceneObject:
    """One shape of a scene: `cx, cy, size` are fractions of the image size (`size` is the bounding extent)."""

    shape: str
    color: str
    cx: float
    cy: float
    size: float

    @property
    def phrase(self) -> str:
        return f"{self.color} {self.shape}"

    @property
    def plural(self) -> str:
        return f"{self.color} {self.shape}s"


@dataclass(frozen=True)
class Scene:
    """A generated scene: `objects` in reading order (left to right for rows, top to bottom for columns)."""

    kind: str
    background: str
    layout: str  # "single", "row" or "column"
    objects: tuple[SceneObject, ...]

    @property
    def relations(self) -> list[list[Any]]:
        """The spatial relations between its objects, by index in `objects`, as `dataset.json` records them:
        `["left_of", i, j]` (a row) or `["above", i, j]` (a column) for every `i < j`, and `["between", k, i, j]` for
        every `i < k < j`; none for a single object. Objects scattered at random (the hard world) are left of /
        above one another where their centres are apart by more than half their mean size."""
        if self.layout == "scatter":
            return _scattered_relations(self.objects)
        if self.layout not in RELATION_OF_LAYOUT:
            return []
        count, name = len(self.objects), RELATION_OF_LAYOUT[self.layout]
        pairs = [[name, i, j] for i in range(count) for j in range(i + 1, count)]
        return pairs + [
            ["between", k, i, j] for i in range(count) for j in range(i + 2, count) for k in range(i + 1, j)
        ]


def _scattered_relations(objects: tuple[SceneObject, ...]) -> list[list[Any]]:
    """`left_of` and `above` between objects placed anywhere (`Scene.relations`)."""
    relations = []
    for i, a in enumerate(objects):
        for j, b in enumerate(objects):
            apart = (a.size + b.size) / 4
            if b.cx - a.cx > apart:
                relations.append(["left_of", i, j])
            if b.cy - a.cy > apart:
                relations.append(["above", i, j])
    return relations


def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _polygon(xs: np.ndarray, ys: np.ndarray, vertices: list[tuple[float, float]]) -> np.ndarray:
    """Even-odd point-in-polygon test at pixel centres (xs: (1, W), ys: (H, 1))."""
    inside = np.zeros((ys.shape[0], xs.shape[1]), dtype=bool)
    for (x1, y1), (x2, y2) in zip(vertices, vertices[1:] + vertices[:1]):
        if y1 == y2:
            continue
        crosses = (y1 > ys) != (y2 > ys)
        x_at = x1 + (ys - y1) * ((x2 - x1) / (y2 - y1))
        inside ^= crosses & (xs < x_at)
    return inside


def shape_mask(shape: str, cx: float, cy: float, size: float, image_size: int) -> np.ndarray:
    """Boolean (H, W) mask of a shape centred at pixel coordinates `(cx, cy)` with bounding extent `size` pixels."""
    xs = (np.arange(image_size, dtype=np.float64) + 0.5)[None, :]
    ys = (np.arange(image_size, dtype=np.float64) + 0.5)[:, None]
    half = size / 2
    if shape == "circle":
        return (xs - cx) ** 2 + (ys - cy) ** 2 <= half * half
    if shape == "square":
        side = half * 0.86  # about the circle's area
        return (np.abs(xs - cx) <= side) & (np.abs(ys - cy) <= side)
    if shape == "triangle":
        height = size * 0.9
        top, bottom = cy - height / 2, cy + height / 2
        return _polygon(xs, ys, [(cx, top), (cx + half, bottom), (cx - half, bottom)])
    if shape == "star":
        shift = half * (1 - _S54) / 2  # centre the star's bounding box vertically
        vertices = [
            (
                cx + half * x * (1 if k % 2 == 0 else _STAR_INNER),
                cy + shift + half * y * (1 if k % 2 == 0 else _STAR_INNER),
            )
            for k, (x, y) in enumerate(_STAR_UNIT)
        ]
        return _polygon(xs, ys, vertices)
    if shape == "diamond":  # alt-text and hard worlds only
        return np.abs(xs - cx) + np.abs(ys - cy) <= half
    if shape == "cross":  # alt-text and hard worlds only
        arm = half * 0.35
        box = (np.abs(xs - cx) <= half) & (np.abs(ys - cy) <= half)
        return box & ((np.abs(xs - cx) <= arm) | (np.abs(ys - cy) <= arm))
    if shape == "hexagon":  # hard world only; flat top, corners at multiples of 60 degrees
        corners = [(1.0, 0.0), (0.5, _S60), (-0.5, _S60), (-1.0, 0.0), (-0.5, -_S60), (0.5, -_S60)]
        return _polygon(xs, ys, [(cx + half * x, cy + half * y) for x, y in corners])
    if shape == "pentagon":  # hard world only; the star's outer points
        shift = half * (1 - _S54) / 2
        return _polygon(xs, ys, [(cx + half * x, cy + shift + half * y) for x, y in _STAR_UNIT[::2]])
    if shape == "ring":  # hard world only
        distance = (xs - cx) ** 2 + (ys - cy) ** 2
        return (distance <= half * half) & (distance >= (half * 0.55) ** 2)
    if shape == "oval":  # hard world only; wide
        return ((xs - cx) / half) ** 2 + ((ys - cy) / (half * 0.6)) ** 2 <= 1
    if shape == "rectangle":  # hard world only; wide
        return (np.abs(xs - cx) <= half) & (np.abs(ys - cy) <= half * 0.5)
    if shape == "semicircle":  # hard world only; flat side down, centred on its box
        top = cy + half / 2
        return ((xs - cx) ** 2 + (ys - top) ** 2 <= half * half) & (ys <= top)
    if shape == "crescent":  # hard world only; a disc less a disc shifted right
        inside = (xs - cx) ** 2 + (ys - cy) ** 2 <= half * half
        return inside & ((xs - cx - half * 0.45) ** 2 + (ys - cy) ** 2 > (half * 0.8) ** 2)
    raise ValueError(f"unknown shape {shape!r}; shapes: {', '.join(DRAWN_SHAPES)}")


def sentence(text: str) -> str:
    """Capitalise the first letter and end with a period, as COCO references are written."""
    return text[0].upper() + text[1:] + "."


def tokens(text: str) -> list[str]:
    """Karpathy-style tokens: lower-case words without punctuation."""
    return re.findall(r"[a-z]+", text.lower())
