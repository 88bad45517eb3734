"""Parity of a built engine with the fp32 model on onnxruntime, on real inputs (needs a GPU)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from export.tensorrt.builder import deserialize, read_engine
from export.tensorrt.profiles import Recipe
from pipelines import classification, embedding, padding

log = logging.getLogger(__name__)

# FP16 engines against the fp32 onnxruntime model: logits of magnitude ~10-20 move by ~1e-2.
FP16_LOGIT_ATOL = 0.1
FP16_MIN_COSINE = 0.999
INT8_MIN_COSINE = 0.98


def run_engine(plan: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an engine once on the GPU (first profile that fits), with torch CUDA buffers."""
    import torch

    _, engine = deserialize(plan)
    spec = read_engine(plan)
    batch = len(next(iter(feeds.values())))
    index = next(
        i
        for i, p in enumerate(spec.profiles)
        if all(s.min[0] <= batch <= s.max[0] for s in p.values())
    )
    context = engine.create_execution_context()
    stream = torch.cuda.Stream()
    context.set_optimization_profile_async(index, stream.cuda_stream)
    buffers = {}
    for name, array in feeds.items():
        buffers[name] = torch.from_numpy(np.ascontiguousarray(array)).cuda()
        context.set_input_shape(name, tuple(array.shape))
        context.set_tensor_address(name, buffers[name].data_ptr())
    for name in spec.outputs:
        shape = tuple(context.get_tensor_shape(name))
        dtype = getattr(torch, np.dtype(spec.dtypes[name]).name)
        buffers[name] = torch.empty(shape, dtype=dtype, device="cuda")
        context.set_tensor_address(name, buffers[name].data_ptr())
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError(f"{plan}: execution failed")
    stream.synchronize()
    return {name: buffers[name].cpu().numpy() for name in spec.outputs}


def parity(recipe: Recipe, repository: Path, plan: Path):
    """Compare the engine with the fp32 model on onnxruntime (CPU) on real inputs.

    Classifier: the sample photos, FP16 logit tolerance and top-1 agreement. Encoder: sample
    texts (short and long), cosine of the sentence embeddings (pooled inside both graphs).

    Raises:
        RuntimeError: outside the tolerance.
    """
    from export import onnx_export
    from pipelines import onnx_runner

    reference = recipe.reference_path(repository)
    if recipe.model == embedding.ENCODER:
        from export.minilm import parity_texts

        ids, mask = padding.tokenize(parity_texts())
        feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
        names = [embedding.EMBEDDING]
    else:
        from export.efficientnet_lite0 import photos_batch

        feeds = {classification.PIXELS: photos_batch()}
        names = [classification.LOGITS]
    session = onnx_runner.create_session(reference, intra_op_threads=2)
    expected = onnx_runner.run(session, feeds, names)[0]
    got = run_engine(plan, feeds)[names[0]]
    report = onnx_export.compare(expected, got)
    floor = INT8_MIN_COSINE if recipe.precision == "int8" else FP16_MIN_COSINE
    ok = report.cosine_min >= floor
    if recipe.model == classification.CLASSIFIER:
        ok = ok and report.ok(FP16_LOGIT_ATOL)
    log.info("%s/%s %s vs onnxruntime: %s", recipe.model, recipe.version, recipe.precision, report)
    if not ok:
        raise RuntimeError(f"{plan} parity failed: {report}")
    return report
