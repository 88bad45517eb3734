"""Decoding and preprocessing: every colour mode, EXIF orientation, geometry and clear errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pipelines import classification, image
from tests.bad_images import bad_images, encode, exif_jpeg, png_header

SHAPE = (classification.CHANNELS, classification.IMAGE_SIZE, classification.IMAGE_SIZE)
WHITE = 255


def gradient(width: int = 320, height: int = 240) -> np.ndarray:
    x = np.linspace(0, 255, width, dtype=np.float32)
    y = np.linspace(0, 255, height, dtype=np.float32)
    return np.stack(np.broadcast_arrays(x[None, :], y[:, None], 128 + 0 * x[None, :]), -1).astype(
        np.uint8
    )


RGB = Image.fromarray(gradient())


@pytest.mark.parametrize(
    ("mode", "fmt"),
    [
        ("RGB", "JPEG"),
        ("RGB", "PNG"),
        ("RGB", "WEBP"),
        ("RGB", "BMP"),
        ("L", "JPEG"),
        ("L", "PNG"),
        ("1", "PNG"),
        ("P", "GIF"),
        ("P", "PNG"),
        ("LA", "PNG"),
        ("RGBA", "PNG"),
        ("RGBA", "WEBP"),
        ("CMYK", "JPEG"),
        ("I;16", "PNG"),
    ],
)
def test_every_mode_becomes_rgb_pixels(mode: str, fmt: str):
    grey = np.asarray(RGB.convert("L"))
    high_depth = {
        "I;16": lambda: Image.fromarray(grey.astype(np.uint16) * 257),  # full 16-bit range
    }
    src = high_depth[mode]() if mode in high_depth else RGB.convert(mode)
    out = image.preprocess(encode(src, fmt))
    assert out.shape == SHAPE
    assert out.dtype == np.uint8
    assert out.std() > 10, "the gradient survived (not a blank image)"


def test_transparent_pixels_become_white():
    clear = Image.new("RGBA", (300, 300), (0, 0, 0, 0))
    np.testing.assert_array_equal(image.preprocess(encode(clear, "PNG")), WHITE)
    palette = Image.new("P", (300, 300), 0)
    palette.info["transparency"] = 0
    np.testing.assert_array_equal(image.preprocess(encode(palette, "PNG", transparency=0)), WHITE)


def test_sixteen_bit_is_rescaled_not_clipped():
    values = np.full((256, 256), 32768, dtype=np.uint16)
    grey = image.decode(encode(Image.fromarray(values), "PNG"))
    assert abs(np.asarray(grey)[0, 0, 0] - 128) <= 1  # clipping would give 255


def test_exif_orientation_is_honoured():
    pixels = gradient(320, 240)
    upright = Image.fromarray(pixels)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: the viewer must turn it 90° clockwise
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # a camera held sideways
    assert stored.size == (240, 320)
    decoded = image.decode(encode(stored, "PNG", exif=exif.tobytes()))
    assert decoded.size == (320, 240)
    np.testing.assert_array_equal(np.asarray(decoded), pixels)


def test_center_crop_keeps_the_middle():
    # A red square in the middle of a blue frame: after the crop the centre is red, corners blue.
    canvas = np.zeros((400, 600, 3), np.uint8)
    canvas[..., 2] = 255
    canvas[100:300, 200:400] = (255, 0, 0)
    out = image.center_crop_resize(Image.fromarray(canvas))
    assert out.shape == (classification.IMAGE_SIZE, classification.IMAGE_SIZE, 3)
    assert tuple(out[112, 112]) == (255, 0, 0)
    assert tuple(out[0, 0]) == (0, 0, 255)


def test_large_jpeg_decodes_reduced_but_never_below_the_crop():
    big = Image.fromarray(gradient(2400, 1600))
    decoded = image.decode(encode(big, "JPEG"), min_side=256)
    assert 256 <= min(decoded.size) < 1600
    full = image.preprocess(encode(big, "PNG"))
    fast = image.preprocess(encode(big, "JPEG"))
    diff = np.abs(full.astype(np.int16) - fast)
    assert diff.mean() < 6.4  # same picture, within JPEG error (0.05 of the normalized range)


def test_pixels_are_the_decoders_rgb_laid_out_channels_first():
    rgb = gradient(224, 224)
    pixels = image.to_pixels(rgb[None])
    assert pixels.shape == (1, *SHAPE) and pixels.dtype == np.uint8
    assert pixels.flags.c_contiguous
    np.testing.assert_array_equal(pixels[0, 1], rgb[..., 1])  # channel 1 is green


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty input"),
        (b"definitely not an image", "not an image"),
        (encode(RGB, "JPEG")[:2000], "truncated"),
        (encode(RGB, "PNG")[:300], "truncated"),
    ],
    ids=["empty", "garbage", "truncated-jpeg", "truncated-png"],
)
def test_bad_bytes_raise_a_clear_error(data: bytes, message: str):
    with pytest.raises(image.ImageError, match=message):
        image.preprocess(data)


def test_decompression_bombs_are_refused_before_decoding(monkeypatch):
    monkeypatch.setattr(image, "MAX_PIXELS", 1000)
    with pytest.raises(image.ImageError, match="too large"):
        image.preprocess(encode(RGB, "PNG"))


def test_a_tiny_file_claiming_400_megapixels_is_refused_as_too_large_not_raised():
    bomb = png_header(20000, 20000)
    assert len(bomb) < 100
    # Past twice Pillow's own limit, where it raises DecompressionBombError (not an OSError).
    with pytest.raises(image.ImageError, match="image too large"):
        image.decode(bomb)
    assert image.pixels_of(bomb) == 0, "refused one by one, it costs a request nothing"
    assert image.pixels_of(png_header(8000, 9000)) == 72_000_000
    assert image.pixels_of(encode(RGB, "JPEG")) == RGB.width * RGB.height
    assert image.pixels_of(b"junk") == 0


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"


@pytest.mark.parametrize(
    ("data", "name"),
    [
        (lambda: encode(RGB, "TIFF"), "TIFF"),
        (lambda: encode(RGB, "TIFF", compression="tiff_lzw"), "TIFF"),
        (lambda: EPS, "EPS"),
        (lambda: b"8BPS\x00\x01" + b"\x00" * 40, "PSD"),
    ],
    ids=["tiff", "tiff-lzw", "eps", "psd"],
)
def test_formats_not_taken_are_refused_by_name_without_opening_them(data, name, monkeypatch):
    from PIL import EpsImagePlugin

    def never(*args, **kwargs):
        raise AssertionError("a refused format's plugin ran")

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", never)
    with pytest.raises(image.ImageError, match=f"unsupported format {name}: this service takes"):
        image.decode(data())


def test_a_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (64, 64), colour) for colour in ((200, 0, 0), (0, 0, 200))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    red, _, blue = np.asarray(image.decode(buf.getvalue()))[32, 32]
    assert red > 150 and blue < 50


def test_exif_that_pillow_cannot_apply_is_this_images_error():
    # exif_transpose raises AttributeError on it: no decoder's exception, it escaped before.
    with pytest.raises(image.ImageError, match="corrupt EXIF orientation: 'float' object"):
        image.decode(exif_jpeg())


def test_a_mode_that_does_not_convert_is_this_images_error(monkeypatch):
    monkeypatch.setattr(image, "to_rgb", lambda img: img.convert("nonsense"))
    with pytest.raises(image.ImageError, match="cannot convert RGB to RGB"):
        image.decode(encode(RGB, "JPEG"))


def test_each_kind_of_bad_image_fails_alone_in_a_batch():
    good = encode(RGB, "JPEG")
    cases = bad_images(good)
    batch = [good] + [data for data, _ in cases.values()] + [good]
    pixels, errors = image.preprocess_batch(batch)
    assert errors[0] is None and errors[-1] is None
    for (_, message), error in zip(cases.values(), errors[1:-1], strict=True):
        assert isinstance(error, image.ImageError) and message in str(error)
    np.testing.assert_array_equal(pixels[-1], image.preprocess(good))


def test_one_bad_image_does_not_spoil_the_batch():
    good = encode(RGB, "JPEG")
    pixels, errors = image.preprocess_batch([good, b"junk", good])
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], image.ImageError)
    np.testing.assert_array_equal(pixels[0], pixels[2])
    np.testing.assert_array_equal(pixels[0], image.preprocess(good))
    # The failed slot holds black, whatever its neighbours are.
    np.testing.assert_array_equal(pixels[1], np.zeros(SHAPE, np.uint8))


def test_gpu_crop_resize_matches_pillow_on_real_photos(photos):
    import torch

    from pipelines import gpu_image

    for name, data in photos.items():
        full = image.decode(data)  # no DCT downscaling: nvJPEG decodes at full size too
        want = image.center_crop_resize(full).astype(np.int16)
        chw = torch.from_numpy(np.asarray(full).copy()).permute(2, 0, 1)
        got = gpu_image.crop_resize(chw).permute(1, 2, 0).numpy().astype(np.int16)
        diff = np.abs(got - want)
        # Same crop box; Pillow and torch antialiased bicubic differ by rounding only.
        assert diff.mean() < 0.5 and np.percentile(diff, 99) <= 1, (name, diff.mean())


def test_gpu_decodable_routes_only_upright_rgb_jpegs():
    from pipelines import gpu_image

    assert gpu_image.gpu_decodable(encode(RGB, "JPEG"))
    assert not gpu_image.gpu_decodable(encode(RGB, "PNG"))
    assert not gpu_image.gpu_decodable(b"junk")
    assert not gpu_image.gpu_decodable(exif_jpeg()), "rotated by its EXIF"
    rotated = io.BytesIO()
    exif = Image.Exif()
    exif[gpu_image.EXIF_ORIENTATION] = 6
    RGB.save(rotated, "JPEG", exif=exif)
    assert not gpu_image.gpu_decodable(rotated.getvalue())
    cmyk = io.BytesIO()
    RGB.convert("CMYK").save(cmyk, "JPEG")
    assert not gpu_image.gpu_decodable(cmyk.getvalue())


def test_device_batch_without_nvjpeg_equals_the_cpu_batch():

    from pipelines import gpu_image

    batch = [encode(RGB, "JPEG"), b"junk", encode(RGB, "PNG")]
    pixels, errors = gpu_image.preprocess_batch(batch, "cpu")
    want, want_errors = image.preprocess_batch(batch)
    np.testing.assert_array_equal(pixels.numpy(), want)
    assert [type(e) for e in errors] == [type(e) for e in want_errors]
