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


# Derived images for accuracy checks: each photo cropped, rescaled, rotated and flipped, so
# that the checks see more than six pictures (a different framing moves every logit).
VARIANT_SEED = 0
VARIANTS_PER_PHOTO = 36


@cache
def variants(
    per_photo: int = VARIANTS_PER_PHOTO, seed: int = VARIANT_SEED
) -> list[tuple[str, bytes]]:
    """(name, JPEG bytes) of images made from the sample photos, the same on every call.

    Per photo, in turn: a random crop (a quarter to all of each side), a rescale (0.3-1.5x),
    a rotation (a quarter turn, or -30..30 degrees with the corners filled), and a mirror
    image; every eighth one as PNG instead of JPEG.
    """
    rng = np.random.default_rng(seed)
    out = []
    for name in PHOTOS:
        img = Image.fromarray(photo(name))
        width, height = img.size
        for i in range(per_photo):
            kind = ("crop", "rescale", "rotate", "mirror")[i % 4]
            if kind == "crop":
                w, h = (int(rng.uniform(0.25, 1.0) * side) for side in (width, height))
                left, top = (
                    int(rng.integers(0, width - w + 1)),
                    int(rng.integers(0, height - h + 1)),
                )
                made = img.crop((left, top, left + w, top + h))
            elif kind == "rescale":
                scale = rng.uniform(0.3, 1.5)
                size = (max(8, round(width * scale)), max(8, round(height * scale)))
                made = img.resize(size, Image.Resampling.BILINEAR)
            elif kind == "rotate":
                turn = rng.choice([90, 180, 270]) if rng.random() < 0.5 else rng.uniform(-30, 30)
                made = img.rotate(float(turn), expand=True, fillcolor=(128, 128, 128))
            else:
                made = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            fmt = "PNG" if i % 8 == 7 else "JPEG"
            out.append((f"{name}/{kind}-{i}", encode(np.asarray(made), fmt)))
    return out
