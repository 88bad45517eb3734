"""What one request at the decode caps costs the preprocessing step, in one process.

``pipelines.image`` refuses, from the headers alone, an image over ``MAX_PIXELS`` and a request
whose images add up to more than ``MAX_REQUEST_PIXELS``. This times the two heaviest requests
the caps let through, each decoded as the step decodes it (``image.preprocess_batch``):

* photos: 32 JPEG photos of 4 megapixels (the request cap in photos);
* largest: PNGs of ``MAX_PIXELS`` each, as many as the request cap allows (PNG has no
  shortcut: every pixel is inflated and resized).

Run: ``python -m bench.decode_cap``; the figures are in docs/models.md#bad-input.
"""

from __future__ import annotations

import io
import time

import numpy as np
from PIL import Image

from pipelines import image

PHOTO_SIZE = (2448, 1632)  # 4 megapixels, a phone photo


def _encode(img: Image.Image, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **options)
    return buf.getvalue()


def _photo(width: int, height: int) -> Image.Image:
    # A gradient with noise: JPEG and PNG compress it about as they compress a photo.
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1)
    noise = np.random.default_rng(0).integers(-20, 20, rgb.shape)
    return Image.fromarray(np.clip(rgb + noise, 0, 255).astype(np.uint8))


def _time(images: list[bytes]) -> float:
    start = time.perf_counter()
    _, errors = image.preprocess_batch(images)
    elapsed = time.perf_counter() - start
    assert not any(errors), errors
    return elapsed


def main() -> None:
    """Print the seconds each request takes to decode."""
    photo = _encode(_photo(*PHOTO_SIZE), "JPEG", quality=90)
    photos = [photo] * (image.MAX_REQUEST_PIXELS // image.pixels_of(photo))
    side = int(image.MAX_PIXELS**0.5)
    largest = _encode(_photo(side, side), "PNG", compress_level=1)
    pngs = [largest] * (image.MAX_REQUEST_PIXELS // image.pixels_of(largest))
    for name, request in (("photos", photos), ("largest", pngs)):
        megapixels = sum(map(image.pixels_of, request)) / 1e6
        print(
            f"{name}: {len(request)} images, {megapixels:.0f} MP, "
            f"{sum(map(len, request)) / 1e6:.0f} MB encoded: {_time(request):.2f} s"
        )


if __name__ == "__main__":
    main()
