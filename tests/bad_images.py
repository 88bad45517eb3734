"""Hostile and broken image files, made in a few bytes, with the error each one must get.

Each is a real file of its kind (the bomb a valid PNG, the EXIF one a valid JPEG): what they break
is Pillow's path after ``Image.open``, which is where a failure escaped per-image handling before.
"""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image


def encode(img: Image.Image, fmt: str, **kwargs) -> bytes:
    """The bytes of ``img`` saved as ``fmt``."""
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A valid PNG of under 100 bytes that claims width × height pixels and holds none."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b""))


def exif_jpeg() -> bytes:
    """A JPEG that decodes, rotated 90° by its EXIF, whose EXIF Pillow cannot write back.

    DateTime is stored as a FLOAT: ``ImageOps.exif_transpose`` re-encodes the EXIF after rotating
    and raises AttributeError (Pillow 13), an exception no image decoder raises.
    """
    entries = [
        struct.pack(">HHIHH", 0x0112, 3, 1, 6, 0),  # Orientation (SHORT) = 6: rotate
        struct.pack(">HHIf", 0x0132, 11, 1, 1.5),  # DateTime as FLOAT instead of ASCII
    ]
    ifd = struct.pack(">H", len(entries)) + b"".join(entries) + b"\x00\x00\x00\x00"
    exif = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08" + ifd
    return encode(Image.new("RGB", (64, 48), (200, 0, 0)), "JPEG", exif=exif)


def tiff() -> bytes:
    """A good LZW-compressed TIFF: a format the service does not take."""
    return encode(Image.new("RGB", (64, 64), (0, 90, 0)), "TIFF", compression="tiff_lzw")


def bad_images(photo: bytes) -> dict[str, tuple[bytes, str]]:
    """name → (bytes, what the error message says), one of each kind a client may send."""
    return {
        "pixel-bomb": (png_header(20000, 20000), "image too large"),
        "truncated": (photo[: len(photo) // 2], "corrupt or truncated image"),
        "corrupt-exif": (exif_jpeg(), "corrupt EXIF orientation"),
        "tiff": (tiff(), "unsupported format TIFF"),
        "not-an-image": (b"%PDF-1.7 plain bytes", "not an image"),
    }
