"""Model-agnostic ONNX steps: export with dynamic axes, clean-up, checker, parity vs PyTorch."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

log = logging.getLogger(__name__)

DEFAULT_OPSET = 17


def export(
    model: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    path: Path,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    opset: int = DEFAULT_OPSET,
) -> onnx.ModelProto:
    """Export ``model`` to ONNX at ``path``, fold pads, and run the ONNX checker.

    Args:
        model: the network, in eval mode.
        example: example inputs (their batch size does not matter: axes are dynamic).
        path: destination ``.onnx`` (see ``staged`` to publish it only once verified).
        input_names: graph input names, in ``forward`` argument order.
        output_names: graph output names.
        dynamic_axes: per tensor name, {axis: symbolic name}; the batch axis must be among them.
        opset: ONNX opset (>= 17).

    Returns:
        The checked model proto, as written.
    """
    if opset < DEFAULT_OPSET:
        raise ValueError(f"opset {opset} < {DEFAULT_OPSET}")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.onnx"
        # The TorchScript-based exporter: the dynamo path needs onnxscript and gains nothing here.
        # Its deprecation notice and the "Slice cannot be constant folded" notes (the pads we fold
        # ourselves below) are expected noise.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
            warnings.filterwarnings("ignore", message=".*Constant folding.*")
            warnings.filterwarnings("ignore", message=".*feature will be removed.*")
            torch.onnx.export(
                model,
                example,
                str(raw),
                input_names=list(input_names),
                output_names=list(output_names),
                dynamic_axes={k: dict(v) for k, v in dynamic_axes.items()},
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
        proto = onnx.load(str(raw))
        with torch.no_grad():
            traced = model(*example)
        traced = traced if isinstance(traced, tuple | list) else (traced,)
        pin_static_output_dims(proto, dict(zip(output_names, traced, strict=True)), dynamic_axes)
        folded = fold_pads_into_convs(proto)
        log.info("folded %d Pad nodes into their Conv", folded)
        onnx.checker.check_model(proto, full_check=True)
        onnx.save(proto, str(path))
    return proto


def pin_static_output_dims(
    proto: onnx.ModelProto,
    outputs: Mapping[str, torch.Tensor],
    dynamic_axes: Mapping[str, Mapping[int, str]],
) -> None:
    """Give every output axis not named in ``dynamic_axes`` its traced size.

    The exporter's shape inference leaves some static axes symbolic (a pooled [batch, 384] came
    out as [batch, "DivEMBEDDING_dim_1"]); Triton's config and TensorRT need them as numbers.
    """
    for output in proto.graph.output:
        dynamic = dynamic_axes.get(output.name, {})
        for axis, dim in enumerate(output.type.tensor_type.shape.dim):
            if axis not in dynamic:
                dim.dim_value = outputs[output.name].shape[axis]


@contextlib.contextmanager
def staged(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it into place only if the block succeeds.

    A failed export or parity check thus never leaves a model where Triton (or make's staleness
    check) would take it for a good one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as tmp:
        staging = Path(tmp) / path.name
        yield staging
        os.replace(staging, path)


def _constant_values(graph: onnx.GraphProto, max_elements: int = 4096) -> dict[str, np.ndarray]:
    """Values of every small tensor that does not depend on a graph input.

    The exporter computes each Pad's ``pads`` through a chain of Constant/Concat/Slice/Reshape
    nodes; evaluating those (with ONNX's reference evaluator) tells what the padding really is.
    """
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            (attr,) = node.attribute
            if attr.name == "value":
                values[node.output[0]] = numpy_helper.to_array(attr.t)
            continue
        inputs = [name for name in node.input if name]
        if not inputs or not all(name in values for name in inputs):
            continue
        if sum(values[name].size for name in inputs) > max_elements:
            continue
        outputs = ReferenceEvaluator(node).run(None, {name: values[name] for name in inputs})
        values.update(zip(node.output, outputs, strict=True))
    return values


def remove_dead_nodes(graph: onnx.GraphProto) -> int:
    """Drop nodes none of whose outputs is used; returns how many were removed."""
    removed = 0
    while True:
        used = {name for node in graph.node for name in node.input}
        used |= {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(out in used for out in n.output)]
        if not dead:
            return removed
        for node in dead:
            graph.node.remove(node)
        removed += len(dead)


def fold_pads_into_convs(model: onnx.ModelProto) -> int:
    """Merge zero ``Pad`` nodes into the ``pads`` attribute of the ``Conv`` they feed.

    TF-style "SAME" padding exports as an explicit Pad (computed by a chain of constant ops)
    before each strided conv. Conv pads the same zeros itself, so the graph gets one op per conv
    for every runtime; onnxruntime 1.32 runs both at the same speed (docs/models.md#export),
    older ones were reported to copy each padded activation.

    Returns:
        How many Pad nodes were removed (the model is changed in place).
    """
    graph = model.graph
    consts = _constant_values(graph)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    removed = []
    for pad in graph.node:
        if pad.op_type != "Pad" or pad.output[0] in graph_outputs:
            continue
        users = consumers.get(pad.output[0], [])
        if len(users) != 1 or users[0].op_type != "Conv":
            continue
        conv = users[0]
        mode = next((a.s for a in pad.attribute if a.name == "mode"), b"constant")
        pads = consts.get(pad.input[1]) if len(pad.input) > 1 else None
        value = consts.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else None
        if mode != b"constant" or pads is None or pads.shape != (8,):
            continue
        if (value is not None and np.any(value != 0)) or np.any(pads[[0, 1, 4, 5]] != 0):
            continue  # only zero padding of the spatial axes matches Conv's own padding
        attrs = {a.name: a for a in conv.attribute}
        if "auto_pad" in attrs and attrs["auto_pad"].s not in (b"", b"NOTSET"):
            continue
        old = list(attrs["pads"].ints) if "pads" in attrs else [0, 0, 0, 0]
        new = [old[0] + pads[2], old[1] + pads[3], old[2] + pads[6], old[3] + pads[7]]
        if "pads" in attrs:
            conv.attribute.remove(attrs["pads"])
        conv.attribute.append(onnx.helper.make_attribute("pads", [int(p) for p in new]))
        conv.input[0] = pad.input[0]
        removed.append(pad)
    for pad in removed:
        graph.node.remove(pad)
    # The constant chains that computed the pads now feed nothing.
    remove_dead_nodes(graph)
    return len(removed)


def dynamic_axes_of(model: onnx.ModelProto) -> dict[str, list[str | int]]:
    """Each graph input's and output's dims: a symbolic name where dynamic, the size where fixed."""
    dims = {}
    for value in list(model.graph.input) + list(model.graph.output):
        shape = value.type.tensor_type.shape.dim
        dims[value.name] = [d.dim_param or d.dim_value for d in shape]
    return dims


@dataclass(frozen=True)
class Parity:
    """How an exported model's outputs compare to PyTorch's on the same inputs."""

    max_abs_diff: float
    top1_agreement: float
    cosine_min: float
    items: int
    # Rows whose five largest values are the same, in the same order (a classifier's top-5).
    top5_identical: float = 1.0

    def ok(self, atol: float, min_top1: float = 1.0) -> bool:
        """True when within ``atol`` everywhere and top-1 agrees at least ``min_top1``."""
        return self.max_abs_diff <= atol and self.top1_agreement >= min_top1


def compare(reference: np.ndarray, candidate: np.ndarray) -> Parity:
    """Compare two [batch, ...] output arrays row by row."""
    ref = reference.reshape(len(reference), -1).astype(np.float64)
    cand = candidate.reshape(len(candidate), -1).astype(np.float64)
    cosine = (ref * cand).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1))
    top5 = min(5, ref.shape[1])
    ranks = [np.argsort(-x, axis=1, kind="stable")[:, :top5] for x in (ref, cand)]
    return Parity(
        max_abs_diff=float(np.abs(ref - cand).max()),
        top1_agreement=float((ref.argmax(1) == cand.argmax(1)).mean()),
        cosine_min=float(cosine.min()),
        items=len(ref),
        top5_identical=float((ranks[0] == ranks[1]).all(axis=1).mean()),
    )


class _Batches:
    """onnxruntime's calibration reader over a list of input batches (feeds by name)."""

    def __init__(self, batches: Sequence[Mapping[str, np.ndarray]]):
        self._feeds = iter(batches)

    def get_next(self):
        return next(self._feeds, None)


def quantize_qdq(
    fp32: Path,
    output: Path,
    batches: Sequence[Mapping[str, np.ndarray]],
    *,
    nodes: Sequence[str] | None = None,
    op_types: Sequence[str] | None = None,
    per_channel_axes: Mapping[str, int] | None = None,
) -> None:
    """Static INT8 in Q/DQ form, symmetric with per-channel weights, calibrated on ``batches``.

    Symmetric INT8 is what TensorRT takes (explicit quantization); onnxruntime runs the same
    graph on the CPU. ``nodes`` or ``op_types`` limit what is quantized; ``per_channel_axes``
    gives an op type's weight axis where onnxruntime's default is not the output channel.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    extra: dict = {"ActivationSymmetric": True, "WeightSymmetric": True}
    if per_channel_axes:
        extra["QDQOpTypePerChannelSupportToAxis"] = dict(per_channel_axes)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # it suggests pre-processing on the root logger
    try:
        quantize_static(
            str(fp32),
            str(output),
            _Batches(batches),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            nodes_to_quantize=list(nodes) if nodes is not None else None,
            op_types_to_quantize=list(op_types) if op_types is not None else None,
            extra_options=extra,
        )
    finally:
        root.setLevel(level)
