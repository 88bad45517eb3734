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

from pipelines import classification

# The formats the service takes (docs/models.md#bad-input), and the only ones Pillow may try:
# its other plugins include EPS (which runs Ghostscript), PSD, and TIFF with its many codecs.
FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF")
# Refused before decoding, from the header: one image over 64 megapixels (an 8k x 8k photo), or
# one request whose images add up to more than 128 megapixels (32 photos of 4 megapixels); what
# a request at the cap costs to decode is in docs/models.md#bad-input.
MAX_PIXELS = 64_000_000
MAX_REQUEST_PIXELS = 128_000_000
# Decode JPEGs no smaller than the side the crop needs, so the DCT shortcut never upsamples.
DECODE_MIN_SIDE = math.ceil(classification.IMAGE_SIZE / classification.CROP_FRACTION)


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


def _open(data: bytes) -> Image.Image:
    """Pillow's lazy open (the header only), of the formats taken here; ImageError otherwise."""
    if not data:
        raise ImageError("empty input: expected encoded image bytes")
    try:
        return Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise ImageError(_unidentified(data)) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"image too large: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any failure of a plugin is this image's
        raise ImageError(f"corrupt or truncated image: {exc}") from None


def _unidentified(data: bytes) -> str:
    # Which format it is, if Pillow knows one by its first bytes (nothing of it is run).
    Image.init()
    known = [f for f, (_, accept) in Image.OPEN.items() if accept and _accepts(accept, data)]
    taken = ", ".join(FORMATS)
    if known:
        return f"unsupported format {known[0]}: this service takes {taken}"
    return f"not an image: cannot identify format of {len(data)} bytes (it takes {taken})"


def _accepts(accept, data: bytes) -> bool:
    try:
        return bool(accept(data[:64]))
    except Exception:  # noqa: BLE001 - a plugin's check that cannot read the bytes: not it
        return False


def pixels_of(data: bytes) -> int:
    """Width × height as the image's header gives them.

    0 for bytes that do not open, a header over Pillow's own limit included: ``decode`` refuses
    those one by one, so they cost nothing to decode.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            width, height = _open(data).size
    except ImageError:
        return 0
    return width * height


def decode(data: bytes, min_side: int = 0) -> Image.Image:
    """Decode encoded image bytes into an upright RGB image.

    Args:
        data: the encoded file, of one of FORMATS (a GIF gives its first frame).
        min_side: if > 0, JPEG decoding may downscale in the DCT domain (a large speed-up for big
            photos) as long as the shorter side stays at least this long.

    Returns:
        An RGB image with its EXIF orientation applied.

    Raises:
        ImageError: whatever goes wrong while opening, decoding, transposing or converting:
            empty, not an image, a format not taken here, truncated or corrupt, too large.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        img = _open(data)
        width, height = img.size
        if width * height > MAX_PIXELS:
            raise ImageError(f"image too large: {width}x{height} exceeds {MAX_PIXELS} pixels")
        try:
            if min_side and img.format == "JPEG":
                scale = min_side / min(width, height)
                img.draft(None, (math.ceil(width * scale), math.ceil(height * scale)))
            img.load()
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ImageError(f"image too large: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - any failure of a decoder is this image's
            raise ImageError(f"corrupt or truncated image: {exc}") from None
    try:
        upright = ImageOps.exif_transpose(img)
    except Exception as exc:  # noqa: BLE001 - EXIF that cannot be applied is this image's
        raise ImageError(f"corrupt EXIF orientation: {exc}") from None
    try:
        return to_rgb(upright)
    except Exception as exc:  # noqa: BLE001 - a mode that does not convert is this image's
        raise ImageError(f"cannot convert {upright.mode} to RGB: {exc}") from None


def crop_box(width: int, height: int) -> tuple[int, int, int]:
    """(left, top, side) of the central square crop: side int(CROP_FRACTION * shorter side).

    Whole pixels, as the reference EfficientNet evaluation crops, so that the GPU path
    (pipelines.gpu_image) crops exactly the same pixels.
    """
    side = int(classification.CROP_FRACTION * min(width, height))
    return (width - side) // 2, (height - side) // 2, side


def center_crop_resize(img: Image.Image, size: int = classification.IMAGE_SIZE) -> np.ndarray:
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
    rgb = np.zeros(
        (
            len(images),
            classification.IMAGE_SIZE,
            classification.IMAGE_SIZE,
            classification.CHANNELS,
        ),
        np.uint8,
    )
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
