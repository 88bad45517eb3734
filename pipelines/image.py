"""Image decoding and preprocessing for the classifier: encoded bytes in, uint8 NCHW pixels out.

Used by the ``preprocess`` Python-backend step, the in-process reference pipeline and the
benchmarks, so that all of them compute exactly the same pixels.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from pipelines import classification as spec

# Refuse decompression bombs before decoding: 64 megapixels is a 8k x 8k photo.
MAX_PIXELS = 64_000_000
# Decode JPEGs no smaller than the side the crop needs, so the DCT shortcut never upsamples.
DECODE_MIN_SIDE = math.ceil(spec.IMAGE_SIZE / spec.CROP_FRACTION)


class ImageError(ValueError):
    """An input that cannot be turned into pixels; the message names the problem."""


def _flatten_alpha(img: Image.Image) -> Image.Image:
    # Transparent areas become white (what a viewer shows), not the undefined colour under alpha.
    rgba = img.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert any PIL mode (L, 1, P, LA, RGBA, CMYK, I;16, F, ...) to 8-bit RGB.

    Alpha is composited onto white; 16-bit and float greyscale are rescaled, not clipped.
    """
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        img.mode == "P" and "transparency" in img.info
    ):
        return _flatten_alpha(img)
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        values = np.asarray(img, dtype=np.float32)
        top = 65535.0 if img.mode.startswith("I;16") or values.max(initial=0) > 255 else 255.0
        grey = np.clip(values * (255.0 / top), 0, 255).round().astype(np.uint8)
        return Image.fromarray(grey, mode="L").convert("RGB")
    # L, 1, P, CMYK, YCbCr, LAB, HSV: Pillow's own conversions are right for these.
    return img.convert("RGB")


def decode(data: bytes, min_side: int = 0) -> Image.Image:
    """Decode encoded image bytes into an upright RGB image.

    Args:
        data: the encoded file (JPEG, PNG, GIF, WebP, BMP, TIFF, ...).
        min_side: if > 0, JPEG decoding may downscale in the DCT domain (a large speed-up for big
            photos) as long as the shorter side stays at least this long.

    Returns:
        An RGB image with its EXIF orientation applied.

    Raises:
        ImageError: empty, not an image, truncated or corrupt, or too large.
    """
    if not data:
        raise ImageError("empty input: expected encoded image bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            if width * height > MAX_PIXELS:
                raise ImageError(f"image too large: {width}x{height} exceeds {MAX_PIXELS} pixels")
            if min_side and img.format == "JPEG":
                scale = min_side / min(width, height)
                img.draft(None, (math.ceil(width * scale), math.ceil(height * scale)))
            img.load()
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError(f"not an image: cannot identify format of {len(data)} bytes") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"corrupt or truncated image: {exc}") from None
    return to_rgb(ImageOps.exif_transpose(img))


def crop_box(width: int, height: int) -> tuple[int, int, int]:
    """(left, top, side) of the central square crop: side int(CROP_FRACTION * shorter side).

    Whole pixels, as the reference EfficientNet evaluation crops, so that the GPU path
    (pipelines.gpu_image) crops exactly the same pixels.
    """
    side = int(spec.CROP_FRACTION * min(width, height))
    return (width - side) // 2, (height - side) // 2, side


def center_crop_resize(img: Image.Image, size: int = spec.IMAGE_SIZE) -> np.ndarray:
    """Crop the central square (``crop_box``) and resize it (bicubic).

    Returns:
        uint8 array [size, size, 3].
    """
    left, top, side = crop_box(*img.size)
    # One resampling pass from the crop box: no intermediate cropped copy.
    out = img.resize(
        (size, size), Image.Resampling.BICUBIC, box=(left, top, left + side, top + side)
    )
    return np.asarray(out)


def to_pixels(rgb: np.ndarray) -> np.ndarray:
    """uint8 RGB [..., H, W, 3], as decoders give it → uint8 [..., 3, H, W], as PIXELS holds it."""
    return np.ascontiguousarray(np.moveaxis(rgb, -1, -3))


def preprocess(data: bytes) -> np.ndarray:
    """Encoded image bytes → uint8 [3, 224, 224] pixels ready for the classifier."""
    return to_pixels(center_crop_resize(decode(data, min_side=DECODE_MIN_SIDE)))


def rgb_batch(images: Sequence[bytes]) -> tuple[np.ndarray, list[ImageError | None]]:
    """Decode, crop and resize many images into one uint8 batch, as decoders lay pixels out.

    Returns:
        (rgb uint8 [n, 224, 224, 3], errors): ``errors[i]`` is None when image i succeeded;
        a failed image leaves zeros in its slot so that the others are unaffected.
    """
    rgb = np.zeros((len(images), spec.IMAGE_SIZE, spec.IMAGE_SIZE, spec.CHANNELS), np.uint8)
    errors: list[ImageError | None] = []
    for i, data in enumerate(images):
        try:
            rgb[i] = center_crop_resize(decode(data, min_side=DECODE_MIN_SIDE))
            errors.append(None)
        except ImageError as exc:
            errors.append(exc)
    return rgb, errors


def preprocess_batch(images: Sequence[bytes]) -> tuple[np.ndarray, list[ImageError | None]]:
    """Preprocess many images into one batch.

    Args:
        images: encoded images.

    Returns:
        (pixels uint8 [n, 3, 224, 224], errors): ``errors[i]`` is None when image i succeeded;
        a failed image's slot holds black, and the others are unaffected.
    """
    rgb, errors = rgb_batch(images)
    return to_pixels(rgb), errors
