"""Grey images as PNG bytes (the page's images), with the standard library's zlib."""

from __future__ import annotations

import struct
import zlib

import numpy as np


def to_gray8(image) -> np.ndarray:
    """A 2-D array as uint8 grey levels: uint8 as it is, anything else scaled from its min..max
    (a constant image is black; NaNs are black)."""
    image = np.asarray(image)
    if image.ndim != 2:
        raise ValueError(f"an image must be 2-D, got shape {image.shape}")
    if image.dtype == np.uint8 or not image.size:
        return image.astype(np.uint8)
    image = np.nan_to_num(image.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = float(image.min()), float(image.max())
    scaled = (image - lo) / (hi - lo) if hi > lo else np.zeros_like(image)
    return np.round(255 * scaled).astype(np.uint8)


def encode_gray(image) -> bytes:
    """PNG (8-bit greyscale, no interlace) of a 2-D array (see :func:`to_gray8`)."""
    pixels = to_gray8(image)
    height, width = pixels.shape
    if not (height and width):
        raise ValueError("an image needs at least one pixel")
    rows = np.hstack([np.zeros((height, 1), np.uint8), pixels])  # filter type 0 before each row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
            + chunk(b"IEND", b""))
