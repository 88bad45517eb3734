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
    """uint8 [3, H, W] → the central ``CROP_FRACTION`` square resized to [3, size, size] uint8.

    The same crop as ``image.center_crop_resize``; bicubic with antialiasing, as Pillow does
    when it shrinks.
    """
    return crop_resize_batch(chw[None], size)[0]


def crop_resize_batch(frames: torch.Tensor, size: int = classification.IMAGE_SIZE) -> torch.Tensor:
    """``crop_resize`` of frames of one size, [n, 3, H, W] uint8, in one interpolation."""
    _, _, height, width = frames.shape
    left, top, side = image.crop_box(width, height)
    crop = frames[:, :, top : top + side, left : left + side].float()
    resized = torch.nn.functional.interpolate(
        crop, size=(size, size), mode="bicubic", antialias=True, align_corners=False
    )
    return resized.round_().clamp_(0, 255).to(torch.uint8)


def resize_by_source_size(frames: Sequence[torch.Tensor], out: torch.Tensor, slots) -> None:
    """Crop and resize decoded frames into ``out[slots[i]]``, one kernel chain per source size.

    Photos of a batch come in a few sizes (a camera's, a site's thumbnails): stacking the frames
    of each size runs its crop and resize once for all of them, not once per image.
    """
    by_size: dict[tuple[int, ...], list[int]] = {}
    for i, frame in enumerate(frames):
        by_size.setdefault(tuple(frame.shape), []).append(i)
    for members in by_size.values():
        stacked = torch.stack([frames[i] for i in members])
        out[[slots[i] for i in members]] = crop_resize_batch(stacked)


def preprocess_batch(
    images: Sequence[bytes], device: str
) -> tuple[torch.Tensor, list[image.ImageError | None]]:
    """Like ``image.preprocess_batch``, with the pixels on ``device``: uint8 [n, 3, 224, 224]."""
    decode = _decode_jpeg() if device != "cpu" else None
    on_gpu = [i for i, data in enumerate(images) if decode and gpu_decodable(data)]
    side = classification.IMAGE_SIZE
    pixels = torch.zeros(
        (len(images), classification.CHANNELS, side, side), dtype=torch.uint8, device=device
    )
    errors: list[image.ImageError | None] = [None] * len(images)
    if on_gpu:
        try:
            # One call for the batch: nvJPEG's batched decode (hardware decoder on A100/H100).
            frames = decode(
                [torch.frombuffer(images[i], dtype=torch.uint8) for i in on_gpu], device
            )
            resize_by_source_size(frames, pixels, on_gpu)
        except RuntimeError as exc:  # nvJPEG refused the batch: Pillow decodes it instead
            log.warning("nvJPEG failed (%s); decoding %d images on the CPU", exc, len(on_gpu))
            on_gpu = []
    rest = sorted(set(range(len(images))) - set(on_gpu))
    if rest:
        cpu_pixels, cpu_errors = image.preprocess_batch([images[i] for i in rest])
        pixels[rest] = torch.from_numpy(cpu_pixels).to(device)
        for i, error in zip(rest, cpu_errors, strict=True):
            errors[i] = error
    return pixels, errors
