"""Export EfficientNet-Lite0 (ImageNet weights) to the classifier's ONNX model and check parity.

Also its weights' compact copy (``write_compact``): what travels to a GPU host, checked against
the pinned fp32 weights before it is written.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from export import onnx_export, samples
from pipelines import classification, compact, efficientnet_lite, image, onnx_runner

log = logging.getLogger(__name__)

DEFAULT_OUTPUT = Path("model_repository") / classification.CLASSIFIER / "1" / "model.onnx"
# fp32 vs fp32 on logits of magnitude ~10-20: the gap the export measures (docs/models.md#export)
# is well inside 1e-4, which still catches any real graph or weight mismatch (a wrong padding or
# BN epsilon moves logits by > 0.1).
FP32_ATOL = 1e-4
# The compact copy keeps the convolution and linear weights in fp16 and the rest (BatchNorm's
# statistics, biases) in fp32: half the bytes, and the GPU rounds the weights to fp16 anyway.
# On the fp32 network here its logits move by less than 0.1 over the photos and their variants
# (docs/gpu.md has the figure); this bound fails a copy that loses more.
COMPACT_ATOL = 0.1


def compact_rule(name: str, tensor: torch.Tensor) -> str:
    """fp16 for weight tensors (2-D and up), fp32 for BatchNorm's vectors and the biases."""
    return compact.FP16 if tensor.ndim >= 2 else compact.FP32


def write_compact(output: Path, atol: float = COMPACT_ATOL) -> dict:
    """Write the compact copy of the pinned weights, if its logits stay within ``atol``.

    Checked on the sample photos and their variants: every logit within ``atol`` of the fp32
    network's, and the same top-1.

    Returns:
        ``max_abs_diff`` (logits) and ``bytes`` (the file's size).

    Raises:
        SystemExit: outside the bound or another top-1; nothing is written then.
    """
    pixels = torch.from_numpy(np.concatenate([photos_batch(), variants_batch()]))
    with torch.inference_mode():
        expected = efficientnet_lite.load_pretrained()(pixels)
    with onnx_export.staged(output) as path:
        compact.pack(
            efficientnet_lite.state_dict_as_shipped(),
            path,
            compact_rule,
            efficientnet_lite.WEIGHTS_SHA256,
        )
        with torch.inference_mode():
            got = efficientnet_lite.load_pretrained(path)(pixels)
        report = {
            "max_abs_diff": float((got - expected).abs().max()),
            "top1_agreement": float((got.argmax(1) == expected.argmax(1)).float().mean()),
            "bytes": path.stat().st_size,
        }
        log.info("compact weights: %s (bound %s)", report, atol)
        if report["max_abs_diff"] > atol or report["top1_agreement"] < 1.0:
            raise SystemExit(f"compact weights outside the bound {atol}: {report}")
    return report


def photos_batch() -> np.ndarray:
    """Every sample photo, JPEG-encoded and preprocessed exactly as the server does."""
    return _pixels([samples.photo_bytes(n) for n in samples.PHOTOS])


def variants_batch() -> np.ndarray:
    """The photos and the images made from them (crops, rescales, rotations), preprocessed."""
    return _pixels([data for _, data in samples.variants()])


def _pixels(images: list[bytes]) -> np.ndarray:
    pixels, errors = image.preprocess_batch(images)
    assert not any(errors), errors
    return pixels


def check_parity(
    model: torch.nn.Module, onnx_path: Path, pixels: np.ndarray, atol: float = FP32_ATOL
) -> onnx_export.Parity:
    """Run PyTorch and onnxruntime on the same pixels (in batches of 32 and at batch 1).

    Raises:
        SystemExit: the exported model is outside the tolerance, or any image's top-5 differs.
    """
    session = onnx_runner.create_session(onnx_path, intra_op_threads=2)
    expected, got = [], []
    with torch.no_grad():
        for start in range(0, len(pixels), 32):
            batch = pixels[start : start + 32]
            expected.append(model(torch.from_numpy(batch)).numpy())
            got.append(
                onnx_runner.run(session, {classification.PIXELS: batch}, [classification.LOGITS])[0]
            )
    single = onnx_runner.run(session, {classification.PIXELS: pixels[:1]}, [classification.LOGITS])[
        0
    ]
    report = onnx_export.compare(
        np.concatenate([*expected, expected[0][:1]]), np.concatenate([*got, single])
    )
    log.info(
        "parity on %d images: max |Δlogit| %.3g (tolerance %.0e), top-1 agreement %.0f%%, "
        "top-5 identical %.0f%%",
        report.items,
        report.max_abs_diff,
        atol,
        100 * report.top1_agreement,
        100 * report.top5_identical,
    )
    if not report.ok(atol) or report.top5_identical < 1.0:
        raise SystemExit(f"parity check failed: {report} (tolerance {atol}, top-5 identical)")
    return report


def main(output: Path, opset: int, weights: Path | None = None) -> None:
    """Load the pretrained weights, export with a dynamic batch axis, verify against PyTorch.

    ``weights``: a compact copy of them (a GPU host without the package) instead.
    """
    model = efficientnet_lite.load_pretrained(weights)
    log.info("loaded %s (sha256 verified)", weights or efficientnet_lite.weights_path())
    pixels = np.concatenate([photos_batch(), variants_batch()])
    with onnx_export.staged(output) as path:
        onnx_export.export(
            model,
            (torch.from_numpy(pixels[:2]),),
            path,
            input_names=[classification.PIXELS],
            output_names=[classification.LOGITS],
            dynamic_axes={classification.PIXELS: {0: "batch"}, classification.LOGITS: {0: "batch"}},
            opset=opset,
        )
        check_parity(model, path, pixels)
    log.info("wrote %s", output)
