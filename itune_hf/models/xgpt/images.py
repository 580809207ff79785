"""Opening images from any source users hand us, with errors that name the file and the reason.

Used by the processor, `itune caption` and the dataset loaders, so every entry point accepts the same inputs:
paths, PIL images of any mode (RGB, RGBA, L, LA, P, CMYK, I;16, I, F, 1), and numpy arrays (H, W), (H, W, 1|3|4)
or (C, H, W), uint8 or float in [0, 1]. EXIF orientation is applied, transparency is composited on white.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

#: Images with more pixels than this are refused as decompression bombs (PIL's own default limit is 89M and only
#: warns below twice that; we make the limit an error so one hostile file cannot exhaust memory).
MAX_IMAGE_PIXELS = 89_478_485

ImageInput = str | os.PathLike | Image.Image | np.ndarray


class ImageError(ValueError):
    """An input that is not a usable image. `str(error)` is one line: `<source>: <reason>`."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        # 16-bit / 32-bit greyscale: rescale the actual range to 8 bits instead of clipping at 255.
        array = np.asarray(image, dtype=np.float64)
        low, high = float(array.min()), float(array.max())
        scaled = np.zeros_like(array) if high <= low else (array - low) / (high - low) * 255.0
        return Image.fromarray(scaled.round().astype(np.uint8), mode="L").convert("RGB")
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


def _from_array(array: np.ndarray, source: str) -> Image.Image:
    if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        array = np.moveaxis(array, 0, -1)  # (C, H, W) -> (H, W, C)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)):
        raise ImageError(source, f"array of shape {array.shape} is not an image (expected (H, W), (H, W, 3|4))")
    if array.size == 0:
        raise ImageError(source, "empty array")
    if np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all():
            raise ImageError(source, "array contains NaN or infinite values")
        array = (np.clip(array, 0.0, 1.0) * 255.0).round().astype(np.uint8) if array.max() <= 1.0 else array
    if array.dtype != np.uint8:
        if array.min() < 0 or array.max() > 255:
            raise ImageError(source, f"{array.dtype} array with values outside [0, 255]")
        array = array.astype(np.uint8)
    return Image.fromarray(array)


def open_image(image: ImageInput, source: str | None = None) -> Image.Image:
    """Return an RGB PIL image from a path, PIL image or numpy array.

    Args:
        image: The input. Paths are opened fully (decoded), so a truncated file fails here, not later.
        source: How to name the input in errors (defaults to the path, or the input's type).

    Raises:
        ImageError: naming the source and the reason (missing, empty, not an image, truncated, too large, ...).
    """
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        source = source or str(path)
        if not path.exists():
            raise ImageError(source, "no such file")
        if path.is_dir():
            raise ImageError(source, "is a directory, not an image")
        if path.stat().st_size == 0:
            raise ImageError(source, "empty file")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(path) as opened:
                    _check_size(opened, source)
                    opened.load()  # decode now: truncated data raises here
                    image = ImageOps.exif_transpose(opened)
                    return _to_rgb(image)
        except ImageError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            raise ImageError(source, f"refused as a decompression bomb ({error})") from None
        except UnidentifiedImageError:
            raise ImageError(source, "not an image file (unrecognised format)") from None
        except OSError as error:
            raise ImageError(source, f"unreadable image data ({error})") from None
    if isinstance(image, Image.Image):
        source = source or "PIL image"
        _check_size(image, source)
        try:
            image.load()
        except OSError as error:
            raise ImageError(source, f"unreadable image data ({error})") from None
        return _to_rgb(ImageOps.exif_transpose(image))
    if isinstance(image, np.ndarray):
        return _to_rgb(_from_array(image, source or f"array{image.shape}"))
    raise ImageError(
        source or type(image).__name__,
        f"unsupported image type {type(image).__name__}; pass a path, a PIL image or a numpy array",
    )


def _check_size(image: Image.Image, source: str) -> None:
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageError(source, f"image has no pixels ({width}x{height})")
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageError(
            source,
            f"{width}x{height} = {width * height:,} pixels exceeds the limit of {MAX_IMAGE_PIXELS:,} "
            "(refused as a possible decompression bomb)",
        )


def is_image_input(value: Any) -> bool:
    """Whether `value` looks like one image input (rather than a list of them)."""
    return isinstance(value, (str, os.PathLike, Image.Image, np.ndarray))


__all__ = ["ImageError", "ImageInput", "MAX_IMAGE_PIXELS", "is_image_input", "open_image"]
