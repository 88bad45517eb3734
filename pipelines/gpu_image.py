"""Image preprocessing on a GPU: nvJPEG decodes, crops and resizes where Pillow would on a CPU.

Used by the preprocess step's KIND_GPU instances when torchvision is present (the GPU check,
``make gpu-check``). Only what nvJPEG decodes to the same upright pixels as Pillow goes there:
RGB or greyscale JPEGs without an EXIF rotation. Everything else, and any batch nvJPEG refuses,
takes the CPU path of ``pipelines.image``, which also produces the error messages. Pixels match
the CPU path up to resampling differences (Pillow's bicubic vs torch's antialiased bicubic,
and Pillow's DCT-domain downscaling of large JPEGs): a few levels out of 255 at most.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from functools import cache

import torch
from PIL import Image

from pipelines import classification, image

log = logging.getLogger(__name__)

EXIF_ORIENTATION = 0x0112


@cache
def _decode_jpeg():
    # torchvision is optional: present on the GPU machine, absent (or broken) elsewhere.
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception:  # noqa: BLE001 - any import failure means "no nvJPEG path"
        return None
    return lambda data, device: decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def gpu_decodable(data: bytes) -> bool:
    """True for a JPEG that nvJPEG decodes to the pixels Pillow would (header read only)."""
    try:
        # The JPEG plugin alone reads the header: nothing else is tried on the way to the GPU.
        img = Image.open(io.BytesIO(data), formats=("JPEG",))
        width, height = img.size
        upright = img.getexif().get(EXIF_ORIENTATION, 1) == 1
    except Exception:  # noqa: BLE001 - the CPU path reports what is wrong with it
        return False
    return (
        img.format == "JPEG"
        and img.mode in ("RGB", "L")
        and width * height <= image.MAX_PIXELS
        and upright
    )


def crop_resize(chw: torch.Tensor, size: int = classification.IMAGE_SIZE) -> torch.Tensor:
    """uint8 [3, H, W] → the central ``CROP_FRACTION`` square resized to [size, size, 3] uint8.

    The same crop as ``image.center_crop_resize``; bicubic with antialiasing, as Pillow does
    when it shrinks.
    """
    _, height, width = chw.shape
    left, top, side = image.crop_box(width, height)
    crop = chw[None, :, top : top + side, left : left + side].float()
    resized = torch.nn.functional.interpolate(
        crop, size=(size, size), mode="bicubic", antialias=True, align_corners=False
    )
    return resized[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0)


def preprocess_batch(
    images: Sequence[bytes], device: str
) -> tuple[torch.Tensor, list[image.ImageError | None]]:
    """Like ``image.preprocess_batch``, with the pixels on ``device``: uint8 [n, 3, 224, 224]."""
    decode = _decode_jpeg() if device != "cpu" else None
    on_gpu = [i for i, data in enumerate(images) if decode and gpu_decodable(data)]
    rgb = torch.zeros(
        (
            len(images),
            classification.IMAGE_SIZE,
            classification.IMAGE_SIZE,
            classification.CHANNELS,
        ),
        dtype=torch.uint8,
        device=device,
    )
    errors: list[image.ImageError | None] = [None] * len(images)
    if on_gpu:
        try:
            frames = decode(
                [torch.frombuffer(images[i], dtype=torch.uint8) for i in on_gpu], device
            )
            for i, frame in zip(on_gpu, frames, strict=True):
                rgb[i] = crop_resize(frame)
        except RuntimeError as exc:  # nvJPEG refused the batch: Pillow decodes it instead
            log.warning("nvJPEG failed (%s); decoding %d images on the CPU", exc, len(on_gpu))
            on_gpu = []
    rest = sorted(set(range(len(images))) - set(on_gpu))
    if rest:
        cpu_rgb, cpu_errors = image.rgb_batch([images[i] for i in rest])
        rgb[rest] = torch.from_numpy(cpu_rgb).to(device)
        for i, error in zip(rest, cpu_errors, strict=True):
            errors[i] = error
    return rgb.permute(0, 3, 1, 2).contiguous(), errors
