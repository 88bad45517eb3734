"""Real photos shipped with scikit-image and scikit-learn, for parity checks, tests, benchmarks."""

from __future__ import annotations

import io
from functools import cache

import numpy as np
from PIL import Image

# name -> loader; scikit-image and scikit-learn are imported only when a photo is asked for.
SKIMAGE_PHOTOS = ("chelsea", "coffee", "astronaut", "rocket")
SKLEARN_PHOTOS = ("china", "flower")
PHOTOS = SKIMAGE_PHOTOS + SKLEARN_PHOTOS


@cache
def photo(name: str) -> np.ndarray:
    """A sample photo as uint8 RGB [H, W, 3]."""
    if name in SKIMAGE_PHOTOS:
        from skimage import data

        return getattr(data, name)()
    if name in SKLEARN_PHOTOS:
        from sklearn.datasets import load_sample_image

        return load_sample_image(f"{name}.jpg")
    raise KeyError(f"unknown sample photo {name!r}; choose from {', '.join(PHOTOS)}")


def encode(rgb: np.ndarray, fmt: str = "JPEG", **options) -> bytes:
    """Encode an RGB array as an image file (JPEG quality 90 unless options say otherwise)."""
    if fmt == "JPEG":
        options.setdefault("quality", 90)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format=fmt, **options)
    return buf.getvalue()


def photo_bytes(name: str, fmt: str = "JPEG") -> bytes:
    """A sample photo encoded as a file, as a client would send it."""
    return encode(photo(name), fmt)
