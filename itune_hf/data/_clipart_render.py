"""The pixel side of `itune make-clipart`: rendering each SVG (through a cache), the pixel hash that merges identical
drawings, and the thumbnails that tie near-identical ones into one split (the rules are in `itune_hf.data.clipart`).

A render depends on the SVG's bytes and the size only: cairo's process-wide state (its font caches) is reset before
each one, which render of the process came first changes nothing, and each distinct file content is rendered once.
"""

from __future__ import annotations

import gc
import hashlib
import io
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..utils.files import atomic_write_bytes, atomic_write_text

#: The renderer's version, in the render cache's folder name: raised only when the pixels change (2: cairo's state
#: reset before each render; a drawing that fills less than `SMALL_DRAWING` of its page is cropped to it).
RENDER_VERSION = 2
#: Files larger than this are skipped unread (the package's largest is 1.7 MB).
MAX_SVG_BYTES = 8 * 2**20
#: A drawing whose inked box spans less than this share of the page's longest side is a speck on a blank page
#: (an A4 page holding a 10-pixel icon): it is rendered again, zoomed, and cropped to its box.
SMALL_DRAWING = 0.2
#: The most a small drawing is zoomed, and the white margin kept around it (a share of the image's longest side).
MAX_ZOOM, CROP_MARGIN = 8.0, 0.05
#: A channel value below this is ink (not the white page).
INK_BELOW = 250
#: Near-identical drawings: 16 x 16 thumbnails whose difference is under this share of their ink.
NEAR_IDENTICAL = 0.1


def read_svg(path: Path) -> bytes:
    """The bytes of an SVG file, refused when larger than `MAX_SVG_BYTES` or compressed.

    Args:
        path: The SVG file.

    Raises:
        ValueError: too large or gzip-compressed.
    """
    with open(path, "rb") as handle:
        data = handle.read(MAX_SVG_BYTES + 1)
    if len(data) > MAX_SVG_BYTES:
        raise ValueError(f"larger than {MAX_SVG_BYTES} bytes")
    if data.startswith(b"\x1f\x8b"):
        raise ValueError("gzip-compressed, not an SVG text file")
    return data


def render_svg(data: bytes, size: int) -> bytes:
    """An SVG as a PNG whose longest side is `size` pixels, on white, RGB; a small drawing on a large page
    (`SMALL_DRAWING`) cropped to its inked box with a margin.

    Args:
        data: The SVG's bytes (cairosvg parses them with defusedxml and fetches nothing outside them).
        size: The longest side in pixels.

    Raises:
        ValueError: it renders blank (every pixel white), or to no pixels.
    """
    image = _render_page(data, size, 1.0)
    if min(image.size) < 1 or max(image.size) > size + 1:
        raise ValueError(f"rendered to {image.width}x{image.height} pixels")
    box = _inked_box(image)
    if box is None:
        raise ValueError("renders blank (every pixel white)")
    span = max(box[2] - box[0], box[3] - box[1])
    if span < SMALL_DRAWING * max(image.size):
        image = _cropped(data, size, image, box, span)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def _render_page(data: bytes, size: int, zoom: float):
    """The whole page at `size` x `zoom` pixels on its longest side, RGB on white."""
    import cairocffi
    import cairosvg
    from PIL import Image

    gc.collect()  # no cairo object of an earlier render is left alive when its caches are reset
    cairocffi.cairo.cairo_debug_reset_static_data()  # else earlier renders change how text is drawn
    length = round(size * zoom)
    options = {"bytestring": data, "background_color": "white", "unsafe": False}
    try:
        png = cairosvg.svg2png(output_width=length, **options)
    except ValueError as error:  # no width, height or viewBox: draw it on a size x size canvas
        if "size is undefined" not in str(error):
            raise
        options.update(parent_width=size, parent_height=size)
        png = cairosvg.svg2png(output_width=length, **options)
    image = Image.open(io.BytesIO(png))
    if image.height > image.width:
        image = Image.open(io.BytesIO(cairosvg.svg2png(output_height=length, **options)))
    return image.convert("RGB")


def _inked_box(image) -> tuple[int, int, int, int] | None:
    """The box around every pixel darker than white (`INK_BELOW` in any channel), or None for a blank image."""
    from PIL import ImageChops

    darkest = ImageChops.darker(ImageChops.darker(*image.split()[:2]), image.split()[2])
    return darkest.point(lambda value: 255 if value < INK_BELOW else 0).getbbox()


def _cropped(data: bytes, size: int, page, box: tuple[int, int, int, int], span: int):
    """The drawing inside `box` of `page` (rendered at `size`), rendered again zoomed and cropped to the box with a
    margin, its longest side `size` pixels."""
    from PIL import Image

    zoom = min(MAX_ZOOM, size / max(span, 1))
    zoomed = _render_page(data, size, zoom)
    scale = zoomed.width / page.width
    margin = CROP_MARGIN * size
    left, top = max(0, box[0] * scale - margin), max(0, box[1] * scale - margin)
    right, bottom = min(zoomed.width, box[2] * scale + margin), min(zoomed.height, box[3] * scale + margin)
    crop = zoomed.crop((round(left), round(top), round(right), round(bottom)))
    factor = size / max(crop.size)
    target = (max(1, round(crop.width * factor)), max(1, round(crop.height * factor)))
    return crop.resize(target, Image.Resampling.LANCZOS)


def pixel_hash(png: Path) -> str:
    """The SHA-256 of an image's size and RGB pixels (identical drawings, whatever the PNG encoder)."""
    from PIL import Image

    with Image.open(png) as image:
        rgb = image.convert("RGB")
        return hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode() + rgb.tobytes()).hexdigest()


def near_identical_pairs(pngs: Sequence[Path]) -> list[tuple[int, int]]:
    """The pairs `(i, j)`, `i < j`, of images whose 16 x 16 thumbnails (on a white square) differ by less than
    `NEAR_IDENTICAL` of the larger one's ink (root of the sum of squares, RGB in [0, 1]): the same drawing in
    another file, another stroke or a small emblem apart.

    Args:
        pngs: The images.
    """
    import numpy as np

    if len(pngs) < 2:
        return []
    pixels = np.stack([_thumbnail(png) for png in pngs])
    ink = np.sqrt(((1 - pixels) ** 2).sum(1))
    squares = (pixels**2).sum(1)
    pairs = []
    for start in range(0, len(pngs), 512):  # a block of rows at a time: memory stays small
        rows = pixels[start : start + 512]
        distance = np.sqrt(np.maximum(squares[start : start + 512, None] + squares[None] - 2 * rows @ pixels.T, 0))
        close = distance < NEAR_IDENTICAL * np.maximum(ink[start : start + 512, None], ink[None])
        pairs += [(start + i, j) for i, j in zip(*np.nonzero(close)) if start + i < j]
    return pairs


def _thumbnail(png: Path):
    import numpy as np
    from PIL import Image

    with Image.open(png) as image:
        rgb = image.convert("RGB")
    side = max(rgb.size)
    square = Image.new("RGB", (side, side), "white")
    square.paste(rgb, ((side - rgb.width) // 2, (side - rgb.height) // 2))
    return np.asarray(square.resize((16, 16), Image.Resampling.BOX), dtype=np.float64).ravel() / 255


def render_cached(svg_path: Path, cache: Path, size: int) -> tuple[Path | None, str]:
    """Render one SVG through the cache: `(png, "")`, or `(None, reason)` for a file that does not render.

    The cache holds `<sha256 of the SVG>.png`, or `.error` with the reason, written atomically: a rerun, or a run
    after an interrupted one, renders only the files not yet there.

    Args:
        svg_path: The SVG file.
        cache: The render cache folder of this size and renderer (`render_cache_dir`).
        size: The longest side in pixels.
    """
    try:
        data = read_svg(svg_path)
    except (OSError, ValueError) as error:
        return None, reason_of(error)
    key = hashlib.sha256(data).hexdigest()
    png, failed = cache / f"{key}.png", cache / f"{key}.error"
    if failed.is_file():
        return None, failed.read_text(encoding="utf-8")
    if not png.is_file():
        try:
            atomic_write_bytes(png, _render(data, size))
        except Exception as error:  # noqa: BLE001 - cairosvg raises many kinds; the file is skipped, named
            atomic_write_text(failed, reason_of(error))
            return None, reason_of(error)
    return png, ""


def reason_of(error: BaseException) -> str:
    """How a skipped file's error is reported: its type and message, at most 300 characters."""
    return f"{type(error).__name__}: {error}".strip().rstrip(":")[:300]


def _render(data: bytes, size: int) -> bytes:
    return render_svg(data, size)  # one place for the tests to count or interrupt renders


def _render_job(job: tuple[str, str, int]) -> tuple[str | None, str]:
    path, cache, size = job
    png, detail = render_cached(Path(path), Path(cache), size)
    return (str(png) if png else None), detail


def render_cache_dir(cache_dir: str | os.PathLike | None, size: int) -> Path:
    """The render cache folder for `size` pixels and the installed cairosvg (created).

    Args:
        cache_dir: The cache's root; None: `<data cache>/clipart-renders` (`$ITUNE_DATA_CACHE`, else
            `~/.cache/itune_hf/data`).
        size: The longest side in pixels.
    """
    import cairosvg

    from .loading import data_cache_dir

    root = Path(cache_dir).expanduser() if cache_dir is not None else data_cache_dir() / "clipart-renders"
    folder = root / f"cairosvg-{cairosvg.__version__}-px{size}-v{RENDER_VERSION}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def render_all(
    svg_root: Path, sources: Sequence[str], cache: Path, size: int, workers: int
) -> list[tuple[Path | None, str]]:
    """Every source rendered through the cache, in order: `(png, pixel hash)`, or `(None, reason)`. Files of the same
    content are rendered once (by one process: two rendering one cache file at once could each hash another render),
    with `workers` processes (1: in this process); the pixel hashes are taken here, from the cached files.

    Args:
        svg_root: The SVG root.
        sources: The files to render (relative paths).
        cache: The render cache folder.
        size: The longest side in pixels.
        workers: Processes.
    """
    content: list[str] = []
    first_of: dict[str, str] = {}  # a content's first source
    for source in sources:
        try:
            key = hashlib.sha256(read_svg(svg_root / source)).hexdigest()
        except (OSError, ValueError) as error:
            key = f"unreadable:{reason_of(error)}"
        content.append(key)
        first_of.setdefault(key, source)
    jobs = [(str(svg_root / source), str(cache), size) for source in first_of.values()]
    if workers <= 1:
        results = [_render_job(job) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_render_job, jobs, chunksize=16))
    rendered = {
        key: (Path(png), pixel_hash(Path(png))) if png else (None, detail)
        for key, (png, detail) in zip(first_of, results)
    }
    return [rendered[key] for key in content]


__all__ = [
    "MAX_SVG_BYTES",
    "RENDER_VERSION",
    "near_identical_pairs",
    "pixel_hash",
    "read_svg",
    "reason_of",
    "render_all",
    "render_cache_dir",
    "render_cached",
    "render_svg",
]
