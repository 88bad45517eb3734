"""Export all-MiniLM-L6-v2 to the encoder's ONNX model (fp32, and INT8) and check parity."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from export import onnx_export
from pipelines import embedding as spec
from pipelines import minilm, onnx_runner, text_samples

log = logging.getLogger(__name__)

DEFAULT_OUTPUT = Path("model_repository") / spec.ENCODER / "1" / "model.onnx"
DEFAULT_INT8_OUTPUT = Path("model_repository") / spec.ENCODER / "2" / "model.onnx"
# fp32 vs fp32: sentence embeddings agree to ~1e-7; 0.99999 still fails any real mismatch.
MIN_COSINE = 0.99999
# INT8 (dynamic, per-channel weights) against fp32, measured ~0.99 here.
MIN_COSINE_INT8 = 0.98


def parity_texts() -> list[str]:
    """Short and long texts, so that padding and truncation are both exercised."""
    return [*text_samples.SENTENCES, text_samples.LONG_TEXT]


def reference_embeddings(model: torch.nn.Module, texts: list[str]) -> np.ndarray:
    """PyTorch model + the shared tokenizer and pooling: the reference the served path must hit."""
    ids, mask = spec.tokenize(texts)
    with torch.no_grad():
        hidden = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    return spec.mean_pool(hidden, mask)


def onnx_embeddings(path: Path, texts: list[str]) -> np.ndarray:
    """The same through onnxruntime."""
    ids, mask = spec.tokenize(texts)
    session = onnx_runner.create_session(path, intra_op_threads=2)
    feeds = {spec.INPUT_IDS: ids, spec.ATTENTION_MASK: mask}
    hidden = onnx_runner.run(session, feeds, [spec.TOKEN_EMBEDDINGS])[0]
    return spec.mean_pool(hidden, mask)


def check_parity(expected: np.ndarray, got: np.ndarray, min_cosine: float) -> float:
    """Minimum cosine between rows; SystemExit below ``min_cosine``."""
    report = onnx_export.compare(expected, got)
    log.info(
        "parity on %d texts: min cosine %.7f (floor %.5f), max |Δ| %.2e",
        report.items,
        report.cosine_min,
        min_cosine,
        report.max_abs_diff,
    )
    if report.cosine_min < min_cosine:
        raise SystemExit(f"parity check failed: {report} (floor {min_cosine})")
    return report.cosine_min


def quantize(fp32: Path, output: Path) -> None:
    """Dynamic INT8 quantization with per-channel weights (per-tensor loses too much here)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)  # it logs every tensor it skips on the root logger
    try:
        quantize_dynamic(fp32, output, per_channel=True, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)


def main(output: Path, int8_output: Path | None, opset: int) -> None:
    """Export fp32 with dynamic batch and sequence axes, verify; then INT8, verify."""
    model = minilm.load_pretrained()
    log.info("loaded all-MiniLM-L6-v2 (sha256 verified)")
    texts = parity_texts()
    expected = reference_embeddings(model, texts)
    ids, mask = spec.tokenize(texts[:2])
    with onnx_export.staged(output) as path:
        onnx_export.export(
            model,
            (torch.from_numpy(ids), torch.from_numpy(mask)),
            path,
            input_names=[spec.INPUT_IDS, spec.ATTENTION_MASK],
            output_names=[spec.TOKEN_EMBEDDINGS],
            dynamic_axes={
                spec.INPUT_IDS: {0: "batch", 1: "sequence"},
                spec.ATTENTION_MASK: {0: "batch", 1: "sequence"},
                spec.TOKEN_EMBEDDINGS: {0: "batch", 1: "sequence"},
            },
            opset=opset,
        )
        check_parity(expected, onnx_embeddings(path, texts), MIN_COSINE)
    log.info("wrote %s", output)
    if int8_output:
        with onnx_export.staged(int8_output) as path:
            quantize(output, path)
            check_parity(expected, onnx_embeddings(path, texts), MIN_COSINE_INT8)
        log.info("wrote %s (%.1f MB)", int8_output, int8_output.stat().st_size / 1e6)
