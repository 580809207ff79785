"""Opening images from any source users hand us, with errors that name the file and the reason.

Used by the processor, `itune caption` and the dataset loaders, so every entry point accepts the same inputs:
paths, PIL images of any mode (RGB, RGBA, L, LA, P, CMYK, I;16, I, F, 1), and numpy arrays or torch tensors
(H, W), (H, W, 1|3|4) or (C, H, W) (channels first where both ends could be channels, as transformers' image
processors assume): uint8, wider integers, or float in [0, 1] (or [0, 255]), as CLIP's image processor takes them.
Integer pixels wider than 8 bits (uint16 arrays, 16- and 32-bit PIL modes) are read in the smallest of 8, 12 and 16
bits that holds their largest value (`to_8_bits`), PIL images and arrays alike. EXIF orientation is applied,
transparency is composited on white.

Sizes are checked from the header, before anything is decoded or resized: more than `MAX_IMAGE_PIXELS` pixels, a
side ratio above `MAX_ASPECT_RATIO`, or (given the processor's `shortest_edge`) more than `MAX_RESIZED_PIXELS` after
the shortest-edge resize are refused with an `ImageError` naming the input, its size and the limit, so no input can
make the processor allocate gigabytes (a 116-byte 300,000 x 1 PNG would otherwise be upscaled to ~1e10 values).
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
#: Images whose long side is more than this many times their short side are refused: the shortest-edge resize would
#: upscale the long side by the same factor (a 1 x 100,000 image becomes 224 x 22,400,000 at CLIP's 224 px).
MAX_ASPECT_RATIO = 100
#: The most pixels an image may have after the processor's shortest-edge resize (4096 x 4096: ~200 MB as float32 RGB).
MAX_RESIZED_PIXELS = 4096 * 4096

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
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16- or 32-bit integer greyscale: as an array of them is read
        return Image.fromarray(to_8_bits(np.asarray(image)), mode="L").convert("RGB")
    if image.mode == "F":  # float greyscale: [0, 1] (or [0, 255]), as a float array is read
        array = np.asarray(image, dtype=np.float64)
        array = array * 255.0 if array.max() <= 1.0 else array
        return Image.fromarray(np.clip(array, 0.0, 255.0).round().astype(np.uint8), mode="L").convert("RGB")
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


#: Bit depths integer pixels may be stored in: 8-bit data in a wider type, a 12-bit camera's or scanner's, 16 bits
BIT_DEPTHS = (8, 12, 16)


def to_8_bits(array: np.ndarray) -> np.ndarray:
    """Integer pixels as uint8, read in the smallest bit depth of `BIT_DEPTHS` that holds the largest value: never
    stretched image by image (a flat image keeps its brightness), and 12-bit data in a 16-bit file keeps its range.

    Args:
        array: Non-negative integer pixels below 2**16.

    Raises:
        ValueError: for negative values or values of more than 16 bits.
    """
    high = int(array.max())
    if int(array.min()) < 0 or high >= 2 ** BIT_DEPTHS[-1]:
        raise ValueError(f"{array.dtype} pixels outside [0, {2 ** BIT_DEPTHS[-1] - 1}]")
    depth = next(bits for bits in BIT_DEPTHS if high < 2**bits)
    if depth == 8:
        return array.astype(np.uint8)
    return (array.astype(np.float64) * (255.0 / (2**depth - 1))).round().astype(np.uint8)


def _from_array(array: np.ndarray, source: str) -> Image.Image:
    if array.ndim == 3 and array.shape[0] in (1, 3, 4):
        if array.shape[-1] in (1, 3, 4):
            warnings.warn(
                f"{source}: the channel axis of an array of shape {array.shape} is ambiguous; taken as the first "
                "(channels first), as transformers' image processors take it",
                stacklevel=4,
            )
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
    if array.dtype == np.bool_:
        array = array.astype(np.uint8) * 255
    if array.dtype != np.uint8:
        if np.issubdtype(array.dtype, np.floating):
            if array.min() < 0 or array.max() > 255:
                raise ImageError(source, f"{array.dtype} array with values outside [0, 1] and [0, 255]")
            array = array.round().astype(np.uint8)
        else:
            try:
                array = to_8_bits(array)
            except ValueError as error:
                raise ImageError(source, str(error)) from None
    return Image.fromarray(array)


def _tensor_to_array(image: Any) -> np.ndarray | None:
    """A torch tensor as a numpy array (duck-typed: this file imports no torch); None for anything else."""
    if not (callable(getattr(image, "detach", None)) and callable(getattr(image, "numpy", None))):
        return None
    tensor = image.detach().cpu()
    if str(tensor.dtype) in ("torch.bfloat16", "torch.float16"):
        tensor = tensor.float()
    return tensor.numpy()


def open_image(image: ImageInput, source: str | None = None, *, shortest_edge: int | None = None) -> Image.Image:
    """Return an RGB PIL image from a path, PIL image, numpy array or torch tensor.

    Args:
        image: The input. Paths are opened fully (decoded), so a truncated file fails here, not later; their size is
            checked from the header first.
        source: How to name the input in errors (defaults to the path, or the input's type).
        shortest_edge: The processor's shortest-edge resize target (`shortest_edge_of`), if any: the size after that
            resize is bounded by `MAX_RESIZED_PIXELS` too.

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
                    _check_size(opened, source, shortest_edge)
                    opened.load()  # decode now: truncated data raises here
                    image = ImageOps.exif_transpose(opened)
                    return _to_rgb(image)
        except ImageError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            raise ImageError(source, f"refused as a decompression bomb ({error})") from None
        except UnidentifiedImageError:
            raise ImageError(source, "not an image file (unrecognised format)") from None
        except (OSError, ValueError, SyntaxError, OverflowError, MemoryError) as error:  # PIL's decoders raise these
            raise ImageError(source, f"unreadable image data ({type(error).__name__}: {error})") from None
    if isinstance(image, Image.Image):
        source = source or "PIL image"
        _check_size(image, source, shortest_edge)
        try:
            image.load()
            return _to_rgb(ImageOps.exif_transpose(image))
        except (OSError, ValueError, OverflowError, MemoryError) as error:
            raise ImageError(source, f"unreadable image data ({type(error).__name__}: {error})") from None
    array = image if isinstance(image, np.ndarray) else _tensor_to_array(image)
    if array is not None:
        opened = _from_array(array, source or f"{type(image).__name__}{tuple(array.shape)}")
        _check_size(opened, source or f"{type(image).__name__}{tuple(array.shape)}", shortest_edge)
        return _to_rgb(opened)
    raise ImageError(
        source or type(image).__name__,
        f"unsupported image type {type(image).__name__}; pass a path, a PIL image, a numpy array or a torch tensor",
    )


def resized_size(width: int, height: int, shortest_edge: int) -> tuple[int, int]:
    """`(width, height)` of a `width` x `height` image after a resize of its short side to `shortest_edge` (the long
    side keeps the aspect ratio, as CLIP's image processor resizes).

    Args:
        width: Width in pixels.
        height: Height in pixels.
        shortest_edge: The short side's target length.
    """
    short, long = min(width, height), max(width, height)
    resized_long = int(shortest_edge * long / short)
    return (shortest_edge, resized_long) if width <= height else (resized_long, shortest_edge)


def shortest_edge_of(image_processor: Any) -> int | None:
    """The shortest-edge resize target of an image processor (e.g. 224 for CLIP); None when it resizes to a fixed
    size or not at all (then the resized size is bounded by that size).

    Args:
        image_processor: A transformers image processor.
    """
    if image_processor is None or not getattr(image_processor, "do_resize", True):
        return None
    size = getattr(image_processor, "size", None)
    value = size.get("shortest_edge") if isinstance(size, dict) else getattr(size, "shortest_edge", None)
    return int(value) if value else None


def _check_size(image: Image.Image, source: str, shortest_edge: int | None = None) -> None:
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageError(source, f"image has no pixels ({width}x{height})")
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageError(
            source,
            f"{width}x{height} = {width * height:,} pixels exceeds the limit of {MAX_IMAGE_PIXELS:,} "
            "(refused as a possible decompression bomb)",
        )
    ratio = max(width, height) / min(width, height)
    if ratio > MAX_ASPECT_RATIO:
        raise ImageError(
            source,
            f"{width}x{height} has an aspect ratio of {f'{ratio:,.1f}'.removesuffix('.0')}:1, above the limit of "
            f"{MAX_ASPECT_RATIO}:1 "
            "(resizing its short side would make a huge image); crop it to a usable shape",
        )
    if shortest_edge is not None:
        new_width, new_height = resized_size(width, height, shortest_edge)
        if new_width * new_height > MAX_RESIZED_PIXELS:
            raise ImageError(
                source,
                f"{width}x{height} would be resized to {new_width}x{new_height} = {new_width * new_height:,} pixels "
                f"(shortest edge {shortest_edge}), above the limit of {MAX_RESIZED_PIXELS:,}; crop it",
            )


def is_image_input(value: Any) -> bool:
    """Whether `value` looks like one image input (rather than a list of them): a path, a PIL image, or an array or
    tensor of at most 3 dimensions (a 4-d one is a batch)."""
    if isinstance(value, (str, os.PathLike, Image.Image)):
        return True
    is_array = isinstance(value, np.ndarray) or (callable(getattr(value, "detach", None)) and hasattr(value, "shape"))
    return is_array and len(value.shape) <= 3


__all__ = [
    "BIT_DEPTHS",
    "ImageError",
    "ImageInput",
    "MAX_ASPECT_RATIO",
    "MAX_IMAGE_PIXELS",
    "MAX_RESIZED_PIXELS",
    "is_image_input",
    "open_image",
    "resized_size",
    "shortest_edge_of",
    "to_8_bits",
]
