"""A minimal palette-PNG writer whose bytes depend only on the pixels (no zlib compression level or library version).

The image data is stored in uncompressed ("stored") deflate blocks, so the same pixels give the same file on every
machine; Pillow's or zlib's compressed output may differ between builds (zlib vs zlib-ng).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import numpy as np


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF)


def _stored_zlib(data: bytes) -> bytes:
    """A zlib stream holding `data` in stored (uncompressed) deflate blocks."""
    out = bytearray(b"\x78\x01")  # zlib header: deflate, 32K window, no dictionary, fastest (check bits valid)
    step = 65_535
    for start in range(0, max(len(data), 1), step):
        block = data[start : start + step]
        final = 1 if start + step >= len(data) else 0
        out += bytes([final]) + struct.pack("<HH", len(block), 0xFFFF ^ len(block)) + block
    out += struct.pack(">I", zlib.adler32(data) & 0xFFFFFFFF)
    return bytes(out)


def encode_palette_png(indices: np.ndarray, palette: Sequence[tuple[int, int, int]]) -> bytes:
    """PNG bytes of an (H, W) array of palette indices (at most 16 colours: 4 bits per pixel).

    Args:
        indices: (H, W) integer array with values in `[0, len(palette))`.
        palette: RGB triples, at most 16.
    """
    if indices.ndim != 2:
        raise ValueError(f"expected an (H, W) index array, got shape {indices.shape}")
    if not 1 <= len(palette) <= 16:
        raise ValueError(f"a 4-bit palette holds 1 to 16 colours, got {len(palette)}")
    if indices.size and (indices.min() < 0 or indices.max() >= len(palette)):
        raise ValueError("palette index out of range")
    height, width = indices.shape
    values = indices.astype(np.uint8)
    if width % 2:
        values = np.concatenate([values, np.zeros((height, 1), np.uint8)], axis=1)
    packed = (values[:, 0::2] << 4) | values[:, 1::2]  # two 4-bit pixels per byte, high nibble first
    rows = np.concatenate([np.zeros((height, 1), np.uint8), packed], axis=1)  # filter type 0 per row
    header = struct.pack(">IIBBBBB", width, height, 4, 3, 0, 0, 0)  # bit depth 4, colour type 3 (palette)
    palette_bytes = b"".join(bytes(colour) for colour in palette)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"PLTE", palette_bytes)
        + _chunk(b"IDAT", _stored_zlib(rows.tobytes()))
        + _chunk(b"IEND", b"")
    )
